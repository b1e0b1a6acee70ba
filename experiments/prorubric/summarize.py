"""Summarise experiments/prorubric: the results tables (markdown, printed) and a PNG of the curves.

  python experiments/prorubric/summarize.py --root=/tmp/prorubric [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads DIR/sft_s<seed> (the base policy) and every DIR/<arm>_s<seed> that exists; the metrics are those the
README pre-registered (experiments/arm_tables.py prints and plots them).
The plot goes to DIR/curves.png, or where --out says.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.prorubric import ARMS  # noqa: E402
from experiments.arm_tables import summarize  # noqa: E402
from experiments.driver import add_summary_args, summary_path  # noqa: E402

METRICS = {"decision hit rate": "eval/accuracy", "proxy (additive)": "eval/rubric/additive",
           "gated score": "eval/rubric/gated", "advice items met": "eval/rubric/advice_met",
           "response length": "eval/response_len"}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/prorubric")
  p.add_argument("--seeds", default="0,1,2")
  add_summary_args(p)
  args = p.parse_args(argv)
  summarize(args.root, ARMS, [int(s) for s in args.seeds.split(",")], METRICS,
            summary_path(args.out, args.root, "curves.png"), "prorubric")


if __name__ == "__main__":
  main()
