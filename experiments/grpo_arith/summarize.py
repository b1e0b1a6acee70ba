"""Summarise grpo_arith runs: a markdown table of held-out accuracy per seed and a PNG of the curves.

  python experiments/grpo_arith/summarize.py /tmp/grpo_arith_s0 /tmp/grpo_arith_s1 /tmp/grpo_arith_s2

Reads each workdir's config.json and metrics.jsonl; prints the table (paste it into results.md) and writes
experiments/grpo_arith/accuracy.png.
"""
import json
import os
import sys

import numpy as np


def load(workdir):
  rows = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
  config = json.load(open(os.path.join(workdir, "config.json")))
  evals = [r for r in rows if "eval/accuracy" in r]
  sft = [r for r in evals if r["stage"] == "sft"][-1]
  rl = [r for r in evals if r["stage"] == "rl"][-1]
  wall = sum(r.get("step_s", 0.0) for r in rows)
  return {"seed": config["seed"], "sft": sft, "rl": rl, "evals": evals, "train_s": wall, "rows": rows}


def main(workdirs):
  runs = [load(w) for w in workdirs]
  pk = next(k for k in runs[0]["rl"] if k.startswith("eval/pass@"))
  print(f"| seed | SFT greedy acc | RL greedy acc | gain (points) | SFT {pk[5:]} | RL {pk[5:]} | train+eval steps (s) |")
  print("|---|---|---|---|---|---|---|")
  gains = []
  for r in runs:
    gain = 100 * (r["rl"]["eval/accuracy"] - r["sft"]["eval/accuracy"])
    gains.append(gain)
    print(f"| {r['seed']} | {r['sft']['eval/accuracy']:.3f} | {r['rl']['eval/accuracy']:.3f} | {gain:+.1f} | "
          f"{r['sft'][pk]:.3f} | {r['rl'][pk]:.3f} | {r['train_s']:.0f} |")
  print(f"\nmean gain {np.mean(gains):+.1f} points (min {np.min(gains):+.1f}, max {np.max(gains):+.1f})")
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(10, 3.5))
  for r in runs:
    x = [e["step"] for e in r["evals"]]
    axes[0].plot(x, [e["eval/accuracy"] for e in r["evals"]], marker="o", label=f"seed {r['seed']}")
    rl = [row for row in r["rows"] if row["stage"] == "rl" and "reward" in row]
    steps = np.array([row["step"] for row in rl])
    reward = np.convolve([row["reward"] for row in rl], np.ones(20) / 20, mode="valid")
    axes[1].plot(steps[19:], reward, label=f"seed {r['seed']}")
  sft_end = runs[0]["sft"]["step"]
  for ax in axes:
    ax.axvline(sft_end, color="gray", ls="--", lw=1)
    ax.grid(alpha=0.3)
    ax.set_xlabel("global step (SFT | RL)")
  axes[0].set_title("held-out greedy accuracy")
  axes[1].set_title("RL training reward (20-step mean)")
  axes[0].legend()
  fig.tight_layout()
  out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "accuracy.png")
  fig.savefig(out, dpi=100)
  print(f"wrote {out}")


if __name__ == "__main__":
  main(sys.argv[1:])
