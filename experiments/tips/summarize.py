"""Summarise experiments/tips: the results tables (markdown, printed) and a PNG of the curves.

  python experiments/tips/summarize.py --root=/tmp/tips [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads every DIR/<arm>_s<seed> that exists and DIR/final_answer_s<seed>.json (the final-answer baseline on the
same held-out chains); the metrics are those the README pre-registered (experiments/arm_tables.py).
The plot goes to DIR/curves.png, or where --out says.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from experiments.arm_tables import summarize  # noqa: E402
from experiments.driver import add_summary_args, read_json, spread, summary_path  # noqa: E402
from experiments.tips.run import ARMS  # noqa: E402

METRICS = {"ProcessBench F1": "eval/processbench/f1", "non-trap F1": "eval/processbench_nontrap/f1",
           "traps found": "eval/processbench_traps/accuracy", "exact match": "eval/accuracy"}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/tips")
  p.add_argument("--seeds", default="0,1,2")
  add_summary_args(p)
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  baseline = [read_json(path) for path in (os.path.join(args.root, f"final_answer_s{s}.json") for s in seeds)
              if os.path.exists(path)]
  if baseline:
    print("| final-answer baseline | " + " | ".join(METRICS) + " |\n|---|" + "---|" * len(METRICS))
    print(f"| seeds {','.join(str(b['seed']) for b in baseline)} | " +
          " | ".join(spread([b.get(k, float('nan')) for b in baseline]) for k in METRICS.values()) + " |\n")
  summarize(args.root, ARMS, seeds, METRICS, summary_path(args.out, args.root, "curves.png"), "tips", base="")


if __name__ == "__main__":
  main()
