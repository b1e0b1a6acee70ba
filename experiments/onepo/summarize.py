"""Summarise experiments/onepo: the results tables (markdown, printed) and a PNG of the accuracy curves.

  python experiments/onepo/summarize.py --root=/tmp/onepo [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads DIR/sft_s<seed> (the base policy's evaluation on its own task, which is the `base` set) and every
DIR/<arm>_s<seed> that exists (config.json, metrics.jsonl). Per arm,
over the seeds found: held-out greedy accuracy on the hard task, the base skill and the shifted split at every
RL evaluation; the annealed arm's change after its guidance ends; the training token entropy over the first and
last tenth of the RL iterations; teacher tokens trained on and the policy's mean probability of them; the RL
training time (the sum of the iterations' `step_s`, evaluations excluded).
Writes the plot to DIR/accuracy.png, or into --out.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.onepo import ANNEAL, ARMS  # noqa: E402
from experiments.driver import add_summary_args, last_eval, load_runs, read_json, spread, summary_path  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

SETS = {"hard": "eval/accuracy", "base": "eval/base/accuracy", "long": "eval/long/accuracy"}


def load_arm(path: str) -> dict:
  config = read_json(os.path.join(path, "config.json"))
  offset = sum(config[s]["steps"] for s in config["stages"][:-1])      # the RL stage's global step 0
  rows = [r for r in read_metrics(os.path.join(path, "metrics.jsonl")) if r.get("stage") == "rl"]
  evals = [r for r in rows if "eval/accuracy" in r]
  train = [r for r in rows if "step_s" in r]
  tenth = max(1, len(train) // 10)
  entropy = [r.get("entropy", np.nan) for r in train]
  tokens = np.array([r.get("shaped/teacher_tokens", 0.0) for r in train])
  p_sum = np.array([r.get("shaped/teacher_p_sum", 0.0) for r in train])
  pre = [r for r in read_metrics(os.path.join(path, "metrics.jsonl"))
         if r.get("stage") == "sft" and "eval/accuracy" in r]
  return {"steps": [e["step"] - offset for e in evals],
          "acc": {name: [e.get(key, np.nan) for e in evals] for name, key in SETS.items()},
          "done": bool(evals) and evals[-1]["step"] - offset == config["rl"]["steps"],
          "pre_rl": {name: pre[-1].get(key, np.nan) for name, key in SETS.items()} if pre else None,
          "entropy_first": float(np.nanmean(entropy[:tenth])), "entropy_last": float(np.nanmean(entropy[-tenth:])),
          "teacher_tokens": float(tokens.sum()),
          "teacher_p": float(p_sum.sum() / tokens.sum()) if tokens.sum() else np.nan,
          "teacher_iters": int((tokens > 0).sum()), "reward": [r.get("reward", np.nan) for r in train],
          "train_s": float(sum(r["step_s"] for r in train))}


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/onepo")
  p.add_argument("--seeds", default="0,1,2")
  add_summary_args(p)
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  print("| seed | SFT steps | base policy's greedy acc (1-2 digits) |\n|---|---|---|")
  for seed in seeds:
    e = last_eval(os.path.join(args.root, f"sft_s{seed}"))
    if e:
      print(f"| {seed} | {e['step']} | {e['eval/accuracy']:.3f} |")
  runs = load_runs(args.root, ARMS, seeds, load_arm)
  print("\nAfter the last RL iteration (mean and min-max over seeds):\n")
  print("| arm | seeds | hard (3 digits) | base (1-2 digits) | long (4 digits) | entropy, first -> last tenth | "
        "teacher tokens | mean p of teacher tokens | RL train time (s) |\n|---|---|---|---|---|---|---|---|---|")
  for arm, by_seed in runs.items():
    rs = [r for r in by_seed.values() if r["steps"]]
    done = "" if all(r["done"] for r in rs) else " (unfinished)"
    cells = [spread([r["acc"][s][-1] for r in rs]) for s in SETS]
    print(f"| {arm}{done} | {','.join(map(str, by_seed))} | " + " | ".join(cells) +
          f" | {spread([r['entropy_first'] for r in rs], '{:.3f}')} -> "
          f"{spread([r['entropy_last'] for r in rs], '{:.3f}')}"
          f" | {spread([r['teacher_tokens'] for r in rs], '{:.0f}')} | {spread([r['teacher_p'] for r in rs])} | "
          f"{spread([r['train_s'] for r in rs], '{:.0f}')} |")
  if "annealed" in runs:
    rs = [r for r in runs["annealed"].values() if ANNEAL in r["steps"] and r["done"]]
    if rs:
      delta = [100 * (r["acc"]["hard"][-1] - r["acc"]["hard"][r["steps"].index(ANNEAL)]) for r in rs]
      print(f"\nannealed, hard-task accuracy at the end minus at iteration {ANNEAL} (guidance over): "
            f"{spread(delta, '{:+.1f}')} points")
  pre = [r["pre_rl"] for r in runs.get("sft_grpo", {}).values() if r["pre_rl"]]
  if pre:
    print("\nsft_grpo after its SFT, before RL: " + ", ".join(f"{s} {spread([x[s] for x in pre])}" for s in SETS))
  print("\nHeld-out greedy accuracy at each RL evaluation (mean over seeds):\n")
  steps = max((r["steps"] for by in runs.values() for r in by.values()), key=len, default=[])
  print("| arm | set | " + " | ".join(map(str, steps)) + " |\n|---|---|" + "---|" * len(steps))
  for arm, by_seed in runs.items():
    for s in SETS:
      cells = [np.nanmean([r["acc"][s][i] for r in by_seed.values() if i < len(r["acc"][s])])
               for i in range(len(steps))]
      print(f"| {arm} | {s} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
  plot(runs, summary_path(args.out, args.root, "accuracy.png"))


def plot(runs: dict, out: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
  colors = dict(zip(ARMS, ("tab:gray", "tab:red", "tab:blue", "tab:green")))
  titles = {"hard": "hard task: 3-digit additions", "base": "base skill: 1-2 digits", "long": "shifted: 4 digits"}
  for ax, s in zip(axes, SETS):
    for arm, by_seed in runs.items():
      rs = [r for r in by_seed.values() if r["steps"]]
      n = min(len(r["steps"]) for r in rs)
      acc = np.array([r["acc"][s][:n] for r in rs])
      ax.plot(rs[0]["steps"][:n], acc.mean(0), marker="o", ms=3, color=colors[arm], label=arm)
      if len(rs) > 1:
        ax.fill_between(rs[0]["steps"][:n], acc.min(0), acc.max(0), color=colors[arm], alpha=0.15)
    ax.axvline(ANNEAL, color="tab:blue", ls=":", lw=1)
    ax.set(title=titles[s], xlabel="RL iteration (dotted: annealed guidance ends)")
    ax.grid(alpha=0.3)
  for arm, by_seed in runs.items():
    rs = list(by_seed.values())
    m = min(len(r["reward"]) for r in rs)
    axes[3].plot(np.arange(1, m + 1), np.nanmean([r["reward"][:m] for r in rs], 0), color=colors[arm], label=arm)
  axes[3].set(title="training reward (mean over seeds)", xlabel="RL iteration")
  axes[3].grid(alpha=0.3)
  seeds = sorted({s for by in runs.values() for s in by})
  axes[0].set_ylabel(f"held-out greedy accuracy (seeds {','.join(map(str, seeds))})")
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out, dpi=100)
  print(f"\nwrote {out}")


if __name__ == "__main__":
  main()
