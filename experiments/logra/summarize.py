"""Summarise experiments/logra: the results tables (markdown, printed), the pre-registered verdicts and a PNG.

  python experiments/logra/summarize.py --root=/tmp/logra [--seeds=0,1,2] [--memory=FILE.jsonl] [--out=DIR|FILE.png]

Reads DIR/sft_s<seed> (the base policy) and every DIR/<arm>_s<seed> that exists; the metrics are those the
README pre-registered (experiments/arm_tables.py prints and plots them). Then each arm's final held-out greedy
accuracy against `adamw`'s, seed by seed, with the verdict rule fixed in the README (`verdict`), and, given
`--memory` (the JSON lines of `benchmarks/memory.py`), each arm's compiled-step memory beside it. The plot goes
to DIR/curves.png, or where --out says. Where any arm ran the `<arm>:quick` preset (QUICK_STEPS iterations), every
verdict reads "smoke run".
"""
import argparse
import json
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.logra import ARMS, QUICK_STEPS  # noqa: E402
from experiments.arm_tables import load_with_training, summarize  # noqa: E402
from experiments.driver import SMOKE_RUN, add_summary_args, read_json, summary_path, verdict_or_smoke  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

METRICS = {"accuracy": "eval/accuracy", "pass@4": "eval/pass@4", "train reward": "reward",
           "grad norm": "grad_norm"}
MARGIN = 0.03          # accuracy points (as a fraction) within which an arm matches AdamW (README)
MEMORY_NAMES = {"full_rank": "logra_full"}    # arm -> its configuration in benchmarks/memory.py
COST_ARMS, COST_BOUND = ("logra_r16", "logra_r64", "full_rank"), 1.3    # prediction 5: median iteration vs adamw
KL_ARM = "logra_r16_kl"
KL_BAND, KL_STEP_BAND = (0.9, 1.1), (0.8, 1.25)   # prediction 6: the median ratio, and its 5th-95th percentiles


def verdict(diffs, margin: float = MARGIN) -> str:
  """The README's rule on one arm's final accuracy minus adamw's, one value per seed: "parity" when the mean is
  within `margin`, else "below" / "above"; "(seeds split)" when the seeds' signs beyond the margin disagree."""
  if not diffs:
    return "-"
  mean = float(np.mean(diffs))
  word = "parity" if abs(mean) <= margin else ("below" if mean < 0 else "above")
  split = any(d > margin for d in diffs) and any(d < -margin for d in diffs)
  return word + (" (seeds split)" if split else "")


def median_iteration(path: str) -> float:
  """The median `step_s` of a run's iterations (NaN without any)."""
  steps = [r["step_s"] for r in read_metrics(os.path.join(path, "metrics.jsonl")) if "step_s" in r]
  return float(np.median(steps)) if steps else float("nan")


def kl_prediction(path: str) -> dict:
  """Per-step realised / predicted KL of a run under KL control (`kl/realised` / `kl/applied`, steps that
  were applied): median, 5th and 95th percentiles, the share of steps scaled down and the steps skipped."""
  rows = [r for r in read_metrics(os.path.join(path, "metrics.jsonl")) if "kl/applied" in r]
  applied = [r for r in rows if r["kl/scale"] > 0 and r["kl/applied"] > 0]
  ratio = np.array([r["kl/realised"] / r["kl/applied"] for r in applied])
  if not len(ratio):
    return {}
  return {"steps": len(rows), "median": float(np.median(ratio)), "p5": float(np.percentile(ratio, 5)),
          "p95": float(np.percentile(ratio, 95)), "scaled": float(np.mean([r["kl/scale"] < 1 for r in rows])),
          "skipped": len(rows) - len(applied)}


def kl_verdict(stats: list) -> str:
  """Prediction 6: "supported" when in every seed the median ratio is in KL_BAND and the 5th-95th percentiles
  in KL_STEP_BAND."""
  if not stats:
    return "-"
  ok = all(KL_BAND[0] <= k["median"] <= KL_BAND[1] and KL_STEP_BAND[0] <= k["p5"] and k["p95"] <= KL_STEP_BAND[1]
           for k in stats)
  return "supported" if ok else "not supported"


def smoke_runs(root: str, seeds) -> list[str]:
  """The workdirs ROOT/<arm>_s<seed> whose RL stage was configured for QUICK_STEPS iterations (`<arm>:quick`)."""
  quick = []
  for arm in ARMS:
    for seed in seeds:
      path = os.path.join(root, f"{arm}_s{seed}", "config.json")
      if os.path.exists(path) and read_json(path)["rl"]["steps"] == QUICK_STEPS:
        quick.append(os.path.dirname(path))
  return quick


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/logra")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--memory", default="", help="JSON lines of benchmarks/memory.py (one per configuration)")
  add_summary_args(p)
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  smoke = smoke_runs(args.root, seeds)
  if smoke:
    print(f"{SMOKE_RUN}: {', '.join(smoke)} ran the :quick preset ({QUICK_STEPS} iterations)\n")
  judge = lambda v: verdict_or_smoke(v, bool(smoke))  # noqa: E731
  runs = summarize(args.root, ARMS, seeds, METRICS, summary_path(args.out, args.root, "curves.png"), "logra",
                   load=lambda path, keys: load_with_training(path, keys))
  final = {arm: {s: r["values"]["eval/accuracy"][-1] for s, r in by.items() if r["steps"] and r["done"]}
           for arm, by in runs.items()}
  memory = {}
  if args.memory:
    with open(args.memory) as f:
      for line in f:
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
    call = judge(verdict(diffs)) if arm != "adamw" else "(peer)"
    print(f"| {arm} | " + " | ".join(cells) + f" | {mean} | {call} | {mem} |")
  print(f"\nMedian iteration time (s), per seed, and its ratio to adamw's (prediction 5: LoGRA within "
        f"{COST_BOUND}x at every rank):\n")
  print("| arm | " + " | ".join(f"seed {s}" for s in seeds) + " | ratio to adamw (per seed) |")
  print("|---|" + "---|" * (len(seeds) + 1))
  med = {arm: {s: median_iteration(os.path.join(args.root, f"{arm}_s{s}")) for s in seeds} for arm in ARMS}
  ratios = {arm: [med[arm][s] / med["adamw"][s] for s in seeds if np.isfinite(med[arm][s] / med["adamw"][s])]
            for arm in ARMS}
  for arm in ARMS:
    print(f"| {arm} | " + " | ".join(f"{med[arm][s]:.3f}" for s in seeds) + " | " +
          ", ".join(f"{r:.2f}" for r in ratios[arm]) + " |")
  cost = [r for arm in COST_ARMS for r in ratios[arm]]
  print("\nverdict (prediction 5): " + judge("-" if not cost else "supported" if max(cost) <= COST_BOUND else
                                               f"not supported (largest ratio {max(cost):.2f})"))
  diffs = [final[KL_ARM][s] - final["logra_r16"][s] for s in seeds
           if s in final.get(KL_ARM, {}) and s in final.get("logra_r16", {})]
  print(f"\n{KL_ARM} minus logra_r16 (prediction 7): " +
        (f"{', '.join(f'{d:+.3f}' for d in diffs)}; mean {np.mean(diffs):+.3f}: {judge(verdict(diffs))}"
         if diffs else "-"))
  print("\nKL-control prediction error, realised / predicted KL per applied step (prediction 6):\n")
  print("| seed | steps | median | 5th pct | 95th pct | share scaled down | skipped |")
  print("|---|---|---|---|---|---|---|")
  stats = []
  for s in seeds:
    k = kl_prediction(os.path.join(args.root, f"{KL_ARM}_s{s}"))
    if k:
      stats.append(k)
      print(f"| {s} | {k['steps']} | {k['median']:.3f} | {k['p5']:.3f} | {k['p95']:.3f} | {k['scaled']:.2f} | "
            f"{k['skipped']} |")
  print(f"\nverdict: {judge(kl_verdict(stats))} (median in {KL_BAND}, 5th-95th percentiles in {KL_STEP_BAND}, "
        "every seed)")


if __name__ == "__main__":
  main()
