"""Summarise experiments/logra: the results tables (markdown, printed), the pre-registered verdicts and a PNG.

  python experiments/logra/summarize.py --root=/tmp/logra [--seeds=0,1,2] [--memory=FILE.jsonl] [--out=FILE.png]

Reads DIR/sft_s<seed> (the base policy) and every DIR/<arm>_s<seed> that exists; the metrics are those the
README pre-registered (experiments/arm_tables.py prints and plots them). Then each arm's final held-out greedy
accuracy against `adamw`'s, seed by seed, with the verdict rule fixed in the README (`verdict`), and, given
`--memory` (the JSON lines of `benchmarks/memory.py`), each arm's compiled-step memory beside it.
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.logra import ARMS  # noqa: E402
from experiments.arm_tables import load_with_training, summarize  # noqa: E402

METRICS = {"accuracy": "eval/accuracy", "pass@4": "eval/pass@4", "train reward": "reward",
           "grad norm": "grad_norm"}
MARGIN = 0.03          # accuracy points (as a fraction) within which an arm matches AdamW (README)
MEMORY_NAMES = {"full_rank": "logra_full"}    # arm -> its configuration in benchmarks/memory.py


def verdict(diffs, margin: float = MARGIN) -> str:
  """The README's rule on one arm's final accuracy minus adamw's, one value per seed: "parity" when the mean is
  within `margin`, else "below" / "above"; "(seeds split)" when the seeds' signs beyond the margin disagree."""
  if not diffs:
    return "-"
  mean = float(np.mean(diffs))
  word = "parity" if abs(mean) <= margin else ("below" if mean < 0 else "above")
  split = any(d > margin for d in diffs) and any(d < -margin for d in diffs)
  return word + (" (seeds split)" if split else "")


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/logra")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--memory", default="", help="JSON lines of benchmarks/memory.py (one per configuration)")
  p.add_argument("--out", default=os.path.join(HERE, "curves.png"))
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  runs = summarize(args.root, ARMS, seeds, METRICS, args.out, "logra",
                   load=lambda path, keys: load_with_training(path, keys))
  final = {arm: {s: r["values"]["eval/accuracy"][-1] for s, r in by.items() if r["steps"] and r["done"]}
           for arm, by in runs.items()}
  memory = {}
  if args.memory:
    for line in open(args.memory):
      if line.strip().startswith("{"):
        r = json.loads(line)
        memory[r["config"]] = r
  print(f"\nFinal accuracy minus adamw's, per seed (finished runs; verdict margin {MARGIN:.2f}):\n")
  print("| arm | " + " | ".join(f"seed {s}" for s in seeds) +
        " | mean | verdict | step memory vs adamw (total, live) |")
  print("|---|" + "---|" * (len(seeds) + 3))
  for arm in ARMS:
    diffs = [final[arm][s] - final["adamw"][s] for s in seeds
             if s in final.get(arm, {}) and s in final.get("adamw", {})]
    cells = [f"{final[arm][s] - final['adamw'][s]:+.3f}" if s in final.get(arm, {}) and s in final.get("adamw", {})
             else "-" for s in seeds]
    m = memory.get(MEMORY_NAMES.get(arm, arm))
    mem = f"{m['total_vs_adamw']:.3f}, {m['live_vs_adamw']:.3f}" if m else "-"
    mean = f"{np.mean(diffs):+.3f}" if diffs else "-"
    print(f"| {arm} | " + " | ".join(cells) + f" | {mean} | {verdict(diffs) if arm != 'adamw' else '(peer)'} | {mem} |")


if __name__ == "__main__":
  main()
