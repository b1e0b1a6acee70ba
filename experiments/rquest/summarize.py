"""Summarise experiments/rquest: the results tables (markdown, printed) and a PNG of the curves.

  python experiments/rquest/summarize.py --root=/tmp/rquest [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads DIR/solver_sft_s<seed> (the solver before R-Quest) and every DIR/<arm>_s<seed> that exists. The solver's
held-out accuracy is its evaluation; the question metrics (rlkit/train/rquest_stage.py `question_metrics`) are
training metrics, shown at each evaluation step as their mean over the iterations since the previous one
(`rquest/unique`: its value at that step).
The plot goes to DIR/curves.png, or where --out says.
"""
import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.rquest import ARMS  # noqa: E402
from experiments.arm_tables import load_with_training, summarize  # noqa: E402
from experiments.driver import add_summary_args, summary_path  # noqa: E402

METRICS = {"held-out accuracy": "eval/accuracy", "invalid": "rquest/invalid", "duplicate": "rquest/duplicate",
           "hidden duplicate": "rquest/hidden_duplicate", "unique fingerprints": "rquest/unique",
           "label correct": "rquest/label_correct", "solver rows": "rquest/solver_rows"}
LAST = ("rquest/unique",)           # a running count: its value at the step, not a window mean


def load(path: str, keys) -> dict:
  return load_with_training(path, keys, last=LAST)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/rquest")
  p.add_argument("--seeds", default="0,1,2")
  add_summary_args(p)
  args = p.parse_args(argv)
  summarize(args.root, ARMS, [int(s) for s in args.seeds.split(",")], METRICS,
            summary_path(args.out, args.root, "curves.png"), "rquest",
            base="solver_sft", load=load)


if __name__ == "__main__":
  main()
