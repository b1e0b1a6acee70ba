"""Summarise experiments/rquest: the results tables (markdown, printed) and a PNG of the curves.

  python experiments/rquest/summarize.py --root=/tmp/rquest [--seeds=0,1,2] [--out=FILE.png]

Reads DIR/solver_sft_s<seed> (the solver before R-Quest) and every DIR/<arm>_s<seed> that exists. The solver's
held-out accuracy is its evaluation; the question metrics (rlkit/train/rquest_stage.py `question_metrics`) are
training metrics, shown at each evaluation step as their mean over the iterations since the previous one
(`rquest/unique`: its value at that step).
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.rquest import ARMS  # noqa: E402
from experiments.arm_tables import load_arm, summarize  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

METRICS = {"held-out accuracy": "eval/accuracy", "invalid": "rquest/invalid", "duplicate": "rquest/duplicate",
           "hidden duplicate": "rquest/hidden_duplicate", "unique fingerprints": "rquest/unique",
           "label correct": "rquest/label_correct", "solver rows": "rquest/solver_rows"}
LAST = ("rquest/unique",)           # a running count: its value at the step, not a window mean


def load(path: str, keys) -> dict:
  """`load_arm`'s evaluations, with each training metric as its window mean (or last value) at every one."""
  run = load_arm(path, [k for k in keys if k.startswith("eval/")])
  rows = [r for r in read_metrics(os.path.join(path, "metrics.jsonl")) if "step_s" in r]
  offset = rows[0]["step"] - 1 if rows else 0
  for key in keys:
    if key.startswith("eval/"):
      continue
    values, start = [], 0
    for step in run["steps"]:
      window = [r[key] for r in rows if start < r["step"] - offset <= step and key in r]
      values.append((window[-1] if key in LAST else float(np.mean(window))) if window else np.nan)
      start = step
    run["values"][key] = values
  return run


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/rquest")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--out", default=os.path.join(HERE, "curves.png"))
  args = p.parse_args(argv)
  summarize(args.root, ARMS, [int(s) for s in args.seeds.split(",")], METRICS, args.out, "rquest",
            base="solver_sft", load=load)


if __name__ == "__main__":
  main()
