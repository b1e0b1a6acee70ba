"""Summarise experiments/baselines: the results table (markdown, printed) and a PNG of the curves.

  python experiments/baselines/summarize.py --root=/tmp/baselines [--quick] [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads DIR/sft_s<seed> (iteration 0: the SFT checkpoint's held-out greedy accuracy) and every
DIR/<variant>[_quick]_s<seed> workdir that exists (config.json, metrics.jsonl; DIR/runs.jsonl for the command
wall time). Per variant, over the seeds found: final held-out greedy accuracy (mean, min-max), its gain over
SFT, pass@4, training time (the sum of the RL iterations' `step_s`: sampling, scoring and updates, first-step
compilation included, evaluations excluded), the median iteration time, the sampled wrong answers' mean length
(`response_len_wrong`) over the first and the last tenth of the iterations, and the largest `clip_frac` of any
iteration (0 means no clip or gate was ever active). Writes the plot to DIR/accuracy[_quick].png, or into --out.
With --quick (the `<variant>:quick` runs) the tables are headed "smoke run": no claim rests on them.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.baselines import VARIANTS  # noqa: E402
from experiments.driver import SMOKE_RUN, add_summary_args, command_walls, read_json, spread, summary_path  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402


def load_run(path: str, sft_eval: dict) -> dict:
  rows = read_metrics(os.path.join(path, "metrics.jsonl"))
  config = read_json(os.path.join(path, "config.json"))
  train = [r for r in rows if r.get("stage") == "rl" and "step_s" in r]
  evals = [r for r in rows if r.get("stage") == "rl" and "eval/accuracy" in r]
  clock = dict(zip([r["step"] for r in train], np.cumsum([r["step_s"] for r in train])))
  tenth = max(1, len(train) // 10)
  wrong = [r.get("response_len_wrong", np.nan) for r in train]
  step_s = [r["step_s"] for r in train]
  return {"steps": [0] + [e["step"] for e in evals],
          "time": [0.0] + [float(clock.get(e["step"], np.nan)) for e in evals],
          "acc": [sft_eval["eval/accuracy"]] + [e["eval/accuracy"] for e in evals], "sft": sft_eval,
          "final": evals[-1] if evals else None, "done": bool(evals) and evals[-1]["step"] == config["rl"]["steps"],
          "train_s": float(np.sum(step_s)), "median_s": float(np.median(step_s)), "wrong": np.array(wrong, float),
          "wrong_first": float(np.nanmean(wrong[:tenth])), "wrong_last": float(np.nanmean(wrong[-tenth:])),
          "clip_max": max(r.get("clip_frac", 0.0) for r in train),
          "rounds": float(np.mean([r.get("sampling_rounds", 1) for r in train]))}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/baselines")
  p.add_argument("--seeds", default="0,1,2")
  add_summary_args(p, quick="read the <variant>_quick_s<seed> workdirs (run.py --quick)")
  args = p.parse_args(argv)
  walls = command_walls(args.root)
  tag = "_quick" if args.quick else ""
  runs, sfts = {}, {}
  for seed in [int(s) for s in args.seeds.split(",")]:
    sft_dir = os.path.join(args.root, f"sft_s{seed}")
    if not os.path.exists(os.path.join(sft_dir, "metrics.jsonl")):
      continue
    sft_rows = read_metrics(os.path.join(sft_dir, "metrics.jsonl"))
    sfts[seed] = [r for r in sft_rows if "eval/accuracy" in r][-1]
    for v in VARIANTS:
      path = os.path.join(args.root, f"{v}{tag}_s{seed}")
      if os.path.exists(os.path.join(path, "metrics.jsonl")):
        runs.setdefault(v, {})[seed] = dict(load_run(path, sfts[seed]), wall=walls.get(path, np.nan))
  if args.quick:
    print(f"{SMOKE_RUN}: the <variant>:quick presets, too short for the README's comparisons\n")
  print("| seed | SFT steps | SFT greedy acc | SFT pass@4 | SFT command wall (s) |\n|---|---|---|---|---|")
  for seed, e in sfts.items():
    print(f"| {seed} | {e['step']} | {e['eval/accuracy']:.3f} | {e.get('eval/pass@4', np.nan):.3f} | "
          f"{walls.get(os.path.join(args.root, f'sft_s{seed}'), np.nan):.0f} |")
  print("\n| variant | seeds | greedy acc | gain (points) | pass@4 | train time (s) | median iter (s) | "
        "wrong-answer len, first -> last tenth | max clip_frac | sampling rounds | command wall (s) |")
  print("|---|---|---|---|---|---|---|---|---|---|---|")
  for v, by_seed in runs.items():
    rs = [r for r in by_seed.values() if r["final"]]
    if not rs:
      continue
    done = "" if all(r["done"] for r in rs) else " (unfinished)"
    acc = [r["final"]["eval/accuracy"] for r in rs]
    gain = [100 * (r["final"]["eval/accuracy"] - r["sft"]["eval/accuracy"]) for r in rs]
    print(f"| {v}{done} | {','.join(map(str, by_seed))} | {spread(acc)} | {spread(gain, '{:+.1f}')} | "
          f"{spread([r['final'].get('eval/pass@4', np.nan) for r in rs])} | "
          f"{spread([r['train_s'] for r in rs], '{:.0f}')} | {spread([r['median_s'] for r in rs], '{:.3f}')} | "
          f"{spread([r['wrong_first'] for r in rs], '{:.2f}')} -> {spread([r['wrong_last'] for r in rs], '{:.2f}')} | "
          f"{max(r['clip_max'] for r in rs):.3g} | {spread([r['rounds'] for r in rs], '{:.2f}')} | "
          f"{spread([r['wall'] for r in rs], '{:.0f}')} |")
  print("\nHeld-out greedy accuracy at each evaluation (iteration 0: the SFT checkpoint; mean over seeds):\n")
  steps = max((r["steps"] for by in runs.values() for r in by.values()), key=len, default=[0])
  print("| variant | " + " | ".join(map(str, steps)) + " |\n|---|" + "---|" * len(steps))
  for v, by_seed in runs.items():
    cells = []
    for i in range(len(steps)):
      xs = [r["acc"][i] for r in by_seed.values() if i < len(r["acc"])]
      cells.append(f"{np.mean(xs):.3f}" if xs else "")
    print(f"| {v} | " + " | ".join(cells) + " |")
  plot(runs, summary_path(args.out, args.root, f"accuracy{tag}.png"), args.quick)


def plot(runs: dict, out: str, quick: bool) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
  colors = plt.get_cmap("tab20")(np.linspace(0, 1, 20))[::2].tolist() + [[0.0, 0.0, 0.0, 1.0]]
  for (v, by_seed), color in zip(runs.items(), colors):
    rs = list(by_seed.values())
    n = min(len(r["acc"]) for r in rs)
    acc = np.array([r["acc"][:n] for r in rs])
    style = dict(color=color, marker="o", ms=3, label=v)
    axes[0].plot(rs[0]["steps"][:n], acc.mean(0), **style)
    axes[1].plot(np.mean([r["time"][:n] for r in rs], 0), acc.mean(0), **style)
    if len(rs) > 1:
      axes[0].fill_between(rs[0]["steps"][:n], acc.min(0), acc.max(0), color=color, alpha=0.15)
    m = min(len(r["wrong"]) for r in rs)
    wrong = np.nanmean([r["wrong"][:m] for r in rs], 0)
    k = max(1, m // 20)
    axes[2].plot(np.arange(k, m + 1), np.convolve(wrong, np.ones(k) / k, mode="valid"), color=color, label=v)
  seeds = sorted({s for by in runs.values() for s in by})
  what = f"{'QUICK preset, ' if quick else ''}seed{'s' if len(seeds) > 1 else ''} {','.join(map(str, seeds))}"
  axes[0].set(title=f"held-out greedy accuracy ({what})", xlabel="RL iteration (0 = SFT checkpoint)")
  axes[1].set(title="held-out greedy accuracy vs training time", xlabel="sum of iteration step_s (s)")
  axes[2].set(title="sampled wrong answers: mean length (tokens)", xlabel="RL iteration")
  for ax in axes:
    ax.grid(alpha=0.3)
  axes[0].legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(out, dpi=100)
  print(f"\nwrote {out}")


if __name__ == "__main__":
  main()
