"""Summarise experiments/xtok_opd: the results tables (markdown, printed) and a PNG of the curves.

  python experiments/xtok_opd/summarize.py --root=experiments/xtok_opd/runs [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads what the driver archives (run.py; experiments/archive.py), or the driver's own root: ROOT/gate.json,
ROOT/runs.jsonl (command walls), ROOT/teacher_s<seed>, ROOT/student_b_s<seed>, ROOT/student_d_s<seed> and every
ROOT/<arm>_s<seed> that exists (config.json, metrics.jsonl). Printed: the calibration gate, the base models per
seed (the teacher, student B, student D), then experiments/arm_tables.py's final table and curves, each arm's
curve starting at step 0 from its own evaluation before the first update (its student's accuracy); the alignment
metrics are training metrics, shown at each evaluation as their mean over the iterations since the previous one.
Last, the pre-registered comparisons, paired within each seed (README.md): final accuracy differences aligned -
spans, both - aligned and both - spans with their verdicts, each arm's gain over its own student, and gap recovery
(acc - student) / (teacher - student). The plot goes to ROOT/curves.png, or where --out says.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.xtok_opd import ARMS  # noqa: E402
from experiments.arm_tables import first_eval, load_from_start, summarize  # noqa: E402
from experiments.driver import command_walls, last_eval, spread, summary_path  # noqa: E402
from experiments.gate import parse_summary_args  # noqa: E402

METRICS = {"held-out accuracy": "eval/accuracy", "aligned frac": "distill/aligned_frac",
           "spans per row": "distill/spans", "sample reward (T=1)": "reward", "response length": "eval/response_len"}
PAIRS = (("aligned", "spans"), ("both", "aligned"), ("both", "spans"))
TIE = 0.02                      # |mean paired difference| below 2 points: a tie (README)
MIN_ROOM = 0.20                 # a seed whose teacher is less than 20 points above student B is left out (README)
BASES = ("teacher", "student_b", "student_d")


def base_accuracy(root: str, seed: int) -> dict:
  """{"teacher", "student_b", "student_d"}: the last held-out accuracy of each of the seed's base runs, and "base":
  the pretrained base's, which the teacher's run evaluated before its first update; nan where a run is missing."""
  out = {}
  for name in BASES:
    e = last_eval(os.path.join(root, f"{name}_s{seed}"))
    out[name] = e["eval/accuracy"] if e else np.nan
  out["base"] = first_eval(os.path.join(root, f"teacher_s{seed}"))
  return out


def verdict(x: str, y: str, d: list) -> str:
  """The README's rule on paired differences d = acc(x) - acc(y): "x > y" when the mean is at least TIE and the
  difference has that sign on a majority of seeds, "tie" when |mean| < TIE, else "mixed"."""
  mean = float(np.mean(d))
  if abs(mean) < TIE:
    return "tie"
  winner, loser, agree = (x, y, sum(v > 0 for v in d)) if mean > 0 else (y, x, sum(v < 0 for v in d))
  return f"{winner} > {loser}" if 2 * agree > len(d) else "mixed"


def comparisons(runs: dict, bases: dict) -> None:
  """The README's paired comparisons: per-seed differences of final accuracy, gains and gap recovery, on the
  seeds whose teacher is at least MIN_ROOM above the student."""
  kept = [s for s, b in bases.items() if b["teacher"] - b["student_b"] >= MIN_ROOM]
  left = sorted(set(bases) - set(kept))
  if left:
    print(f"\nLeft out of the comparisons (teacher less than {100 * MIN_ROOM:.0f} points above its student): seeds "
          f"{', '.join(map(str, left))}")
  done = {arm: {s: r["values"]["eval/accuracy"] for s, r in by.items() if r["done"] and s in kept}
          for arm, by in runs.items()}
  final = {arm: {s: v[-1] for s, v in by.items()} for arm, by in done.items()}
  area = {arm: {s: float(np.mean(v[1:])) for s, v in by.items()} for arm, by in done.items()}   # after step 0
  for label, values in (("final held-out accuracy (the verdicts)", final),
                        ("mean held-out accuracy over the evaluations after step 0 (secondary)", area)):
    print(f"\nPaired differences of {label}; points, a tie when |mean| < {100 * TIE:.0f}:\n")
    print("| comparison | per seed | mean | verdict |\n|---|---|---|---|")
    for x, y in PAIRS:
      seeds = sorted(set(values.get(x, {})) & set(values.get(y, {})))
      if not seeds:
        continue
      d = [values[x][s] - values[y][s] for s in seeds]
      cells = ", ".join(f"s{s}: {100 * v:+.1f}" for s, v in zip(seeds, d))
      print(f"| {x} - {y} | {cells} | {100 * np.mean(d):+.1f} | {verdict(x, y, d)} |")
  print("\nGain over the arm's own student and gap recovery (acc - student) / (teacher - student):\n")
  print("| arm | seeds | gain (points) | gap recovery |\n|---|---|---|---|")
  for arm, by_seed in final.items():
    key = f"student_{ARMS[arm]['student']}"
    seeds = [s for s in by_seed if np.isfinite(bases[s][key])]
    if not seeds:
      continue
    gains = [by_seed[s] - bases[s][key] for s in seeds]
    room = [bases[s]["teacher"] - bases[s][key] for s in seeds]
    recovery = [g / r if r > 0 else np.nan for g, r in zip(gains, room)]
    print(f"| {arm} | {','.join(map(str, seeds))} | {spread([100 * g for g in gains], '{:+.1f}')} | "
          f"{spread(recovery, '{:.2f}')} |")


def main(argv=None) -> None:
  args, seeds = parse_summary_args(__doc__, "experiments/xtok_opd/runs", argv)
  bases = {s: base_accuracy(args.root, s) for s in seeds}
  print("Base models (greedy held-out accuracy):\n\n| seed | the base (before fine-tuning) | teacher (the base "
        "fine-tuned; D) | student B | student D (same_tok's) |\n|---|---|---|---|---|")
  for s, b in bases.items():
    print(f"| {s} | {b['base']:.3f} | {b['teacher']:.3f} | {b['student_b']:.3f} | {b['student_d']:.3f} |")
  walls = command_walls(args.root)
  print(f"\nCommand walls: {sum(walls.values()) / 60:.1f} minutes over {len(walls)} workdirs (ROOT/runs.jsonl)\n")
  runs = summarize(args.root, ARMS, seeds, METRICS, summary_path(args.out, args.root, "curves.png"), "xtok_opd",
                   base="", load=load_from_start)      # step 0: the arm's own student
  comparisons(runs, bases)


if __name__ == "__main__":
  main()
