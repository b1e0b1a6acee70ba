"""Summarise experiments/tips: the gate, the tables and verdicts (markdown, printed) and a PNG of the curves.

  python experiments/tips/summarize.py --root=experiments/tips/runs [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads the archive (or a driver's root): gate.json, DIR/final_answer_s<seed>.json (the final-answer baseline on
the same held-out chains), every DIR/<arm>_s<seed> (experiments/arm_tables.py; a run's first evaluation, at its
start, is the start policy's) and prints the pre-registered verdicts (README), per seed where they are paired. The plot
goes to DIR/curves.png, or where --out says.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from experiments.arm_tables import summarize  # noqa: E402
from experiments.driver import read_json, spread, summary_path  # noqa: E402
from experiments.gate import parse_summary_args  # noqa: E402
from experiments.tips.run import ARMS, GATE_MARGIN  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

METRICS = {"ProcessBench F1": "eval/processbench/f1", "non-trap F1": "eval/processbench_nontrap/f1",
           "traps found": "eval/processbench_traps/accuracy", "exact match": "eval/accuracy"}
TARGET_RATIO = 0.8         # the target: outcome's non-trap F1 >= 0.8 x supervised's


def start_row(root: str, seed: int):
  """The start policy's evaluation on the running-difference chains: the supervised run's first, at its start."""
  rows = [r for r in read_metrics(os.path.join(root, f"supervised_s{seed}", "metrics.jsonl"))
          if r.get("at_stage_start")]
  return rows[0] if rows else None


def training_signal(root: str, seeds) -> None:
  """What the outcome arm learned from, per seed: its reward and the share of groups whose rewards differ (GRPO
  learns from those only), over all iterations; and start_signal.json's sample of the start policy, where archived."""
  lines = []
  for seed in seeds:
    path = os.path.join(root, f"outcome_s{seed}", "metrics.jsonl")
    rows = [r for r in read_metrics(path) if "informative_groups" in r] if os.path.exists(path) else []
    if rows:
      informative = np.array([r["informative_groups"] for r in rows])
      lines.append(f"| {seed} | {len(rows)} | {np.mean([r['reward'] for r in rows]):.4f} | {informative.mean():.4f} | "
                   f"{int((informative > 0).sum())} |")
  if lines:
    print("\nThe outcome arm's training signal (all iterations, per seed):\n\n| seed | iterations | mean reward | "
          "informative groups (share) | iterations with any |\n|---|---|---|---|---|\n" + "\n".join(lines))
  if os.path.exists(sampled := os.path.join(root, "start_signal.json")):
    s = read_json(sampled)
    print(f"\nThe start policy sampled as the outcome arm samples (start_signal.py, {s['verdicts']} verdicts): well formed "
          f"{s['well_formed']:.3f}, paid {s['paid']:.3f}, informative groups {s['informative_groups']:.3f}")


def verdicts(runs: dict, baseline: dict, base: dict, seeds) -> None:
  """The README's predictions 2-4, from each arm's last evaluation (prediction 1 is the gate)."""
  last = {arm: {s: {k: r["values"][k][-1] for k in METRICS.values()} for s, r in by.items() if r["steps"]}
          for arm, by in runs.items()}
  sup, out = last.get("supervised", {}), last.get("outcome", {})
  paired = [s for s in seeds if s in sup and s in out]
  print("\nVerdicts (README; per seed: outcome vs supervised, the final-answer baseline and the start policy)\n")
  if not paired:
    print("outcome not run: no verdicts (see the gate).")
    return
  nontrap = METRICS["non-trap F1"]
  f1, traps = METRICS["ProcessBench F1"], METRICS["traps found"]
  print("| seed | outcome non-trap F1 / supervised | outcome F1 - final-answer F1 | outcome F1 - start F1 | "
        "traps: outcome - supervised |\n|---|---|---|---|---|")
  for s in paired:
    ratio = out[s][nontrap] / sup[s][nontrap] if sup[s][nontrap] else np.nan
    print(f"| {s} | {ratio:.3f} | {out[s][f1] - baseline.get(s, {}).get(f1, np.nan):+.1f} | "
          f"{out[s][f1] - base.get(s, {}).get(f1, np.nan):+.1f} | {out[s][traps] - sup[s][traps]:+.3f} |")
  mean = lambda arm, k: float(np.mean([arm[s][k] for s in paired]))   # noqa: E731
  ratio = mean(out, nontrap) / mean(sup, nontrap) if mean(sup, nontrap) else np.nan
  above_floor = mean(out, f1) - np.mean([baseline.get(s, {}).get(f1, np.nan) for s in paired])
  above_base = all(out[s][f1] > base.get(s, {}).get(f1, np.nan) for s in paired)
  print(f"\n2. outcome's non-trap F1 >= {TARGET_RATIO} x supervised's (means over seeds): ratio {ratio:.3f}, "
        f"{'met' if ratio >= TARGET_RATIO else 'not met'}")
  print(f"3. outcome above the final-answer baseline by > {GATE_MARGIN:g} points (mean) and above the start in every "
        f"seed: {above_floor:+.1f} points, {'above' if above_base else 'not above'} the start in every seed: "
        f"{'supported' if above_floor > GATE_MARGIN and above_base else 'not supported'}")
  print(f"4. on traps outcome below supervised (means): {mean(out, traps):.3f} vs {mean(sup, traps):.3f}: "
        f"{'supported' if mean(out, traps) < mean(sup, traps) else 'not supported'}")


def main(argv=None) -> None:
  args, seeds = parse_summary_args(__doc__, "experiments/tips/runs", argv)
  baseline = {s: read_json(path) for s in seeds
              if os.path.exists(path := os.path.join(args.root, f"final_answer_s{s}.json"))}
  base = {s: row for s in seeds if (row := start_row(args.root, s))}
  for name, rows in (("final-answer baseline", baseline), ("the arms' start (no training on these chains)", base)):
    if rows:
      print(f"| {name} | seeds | " + " | ".join(METRICS) + " |\n|---|---|" + "---|" * len(METRICS))
      print(f"| | {','.join(map(str, rows))} | " +
            " | ".join(spread([r.get(k, np.nan) for r in rows.values()]) for k in METRICS.values()) + " |\n")
  runs = summarize(args.root, ARMS, seeds, METRICS, summary_path(args.out, args.root, "curves.png"), "tips", base="")
  training_signal(args.root, seeds)
  verdicts(runs, baseline, base, seeds)


if __name__ == "__main__":
  main()
