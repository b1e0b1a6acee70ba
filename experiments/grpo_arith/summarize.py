"""Summarise grpo_arith runs: a markdown table of held-out accuracy per seed and a PNG of the curves.

  python experiments/grpo_arith/summarize.py --root=experiments/grpo_arith/runs [--seeds=0,1,2,3,4] [--out=DIR]
  python experiments/grpo_arith/summarize.py /tmp/grpo_arith_s0 /tmp/grpo_arith_s1 [--out=DIR]   # any workdirs

Reads each workdir's config.json and metrics.jsonl (ROOT/cpu_s<seed>, as experiments/grpo_arith/run.py writes and
archives them, or the workdirs named); prints the table and writes accuracy.png into the folder the workdirs
share (a lone workdir: itself), or where --out says.
"""
import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments.driver import add_summary_args, read_json, summary_path  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402


def load(workdir):
  rows = read_metrics(os.path.join(workdir, "metrics.jsonl"))
  config = read_json(os.path.join(workdir, "config.json"))
  evals = [r for r in rows if "eval/accuracy" in r]
  sft = [r for r in evals if r["stage"] == "sft"][-1]
  rl = [r for r in evals if r["stage"] == "rl"][-1]
  wall = sum(r.get("step_s", 0.0) for r in rows)
  return {"seed": config["seed"], "sft": sft, "rl": rl, "evals": evals, "train_s": wall, "rows": rows,
          "sft_steps_reserved": config["sft"]["steps"], "stop_at_loss": config["sft"].get("stop_at_loss", 0.0)}


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("workdirs", nargs="*")
  p.add_argument("--root", default="", help="a driver's root or archive: its cpu_s<seed> workdirs")
  p.add_argument("--seeds", default="0,1,2,3,4")
  add_summary_args(p)
  args = p.parse_args(argv)
  if args.root:
    args.workdirs = [os.path.join(args.root, f"cpu_s{s}") for s in args.seeds.split(",")
                     if os.path.exists(os.path.join(args.root, f"cpu_s{s}", "metrics.jsonl"))]
  if not args.workdirs:
    p.error("give workdirs, or --root with finished cpu_s<seed> workdirs")
  runs = [load(w) for w in args.workdirs]
  pk = next(k for k in runs[0]["rl"] if k.startswith("eval/pass@"))
  print(f"| seed | SFT steps | SFT greedy acc | RL greedy acc | gain (points) | SFT {pk[5:]} | RL {pk[5:]} | "
        "train+eval steps (s) |")
  print("|---|---|---|---|---|---|---|---|")
  gains = []
  for r in runs:
    gain = 100 * (r["rl"]["eval/accuracy"] - r["sft"]["eval/accuracy"])
    gains.append(gain)
    print(f"| {r['seed']} | {r['sft']['step']} | {r['sft']['eval/accuracy']:.3f} | {r['rl']['eval/accuracy']:.3f} | "
          f"{gain:+.1f} | {r['sft'][pk]:.3f} | {r['rl'][pk]:.3f} | {r['train_s']:.0f} |")
  print(f"\nmean gain {np.mean(gains):+.1f} points (min {np.min(gains):+.1f}, max {np.max(gains):+.1f})")
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  # SFT ends at a different step on each seed (sft.stop_at_loss), so curves are drawn against each stage's
  # own step: SFT loss by SFT step, and RL by iteration with iteration 0 = the SFT checkpoint.
  fig, axes = plt.subplots(1, 3, figsize=(14, 3.5))
  for r in runs:
    label = f"seed {r['seed']}"
    sft = [row for row in r["rows"] if row["stage"] == "sft" and "loss" in row]
    axes[0].plot([row["step"] for row in sft], [row.get("loss_ema", row["loss"]) for row in sft], label=label)
    rl_start = r["sft_steps_reserved"]
    evals = [r["sft"]] + [e for e in r["evals"] if e["stage"] == "rl"]
    axes[1].plot([0] + [e["step"] - rl_start for e in evals[1:]], [e["eval/accuracy"] for e in evals],
                 marker="o", label=label)
    rl = [row for row in r["rows"] if row["stage"] == "rl" and "reward" in row]
    steps = np.array([row["step"] - rl_start for row in rl])
    reward = np.convolve([row["reward"] for row in rl], np.ones(20) / 20, mode="valid")
    axes[2].plot(steps[19:], reward, label=label)
  stop = runs[0]["stop_at_loss"]
  if stop:
    axes[0].axhline(stop, color="gray", ls="--", lw=1)
  axes[0].set(title="SFT training loss (moving average)", xlabel="SFT step", yscale="log")
  axes[1].set(title="held-out greedy accuracy", xlabel="RL iteration (0 = SFT checkpoint)")
  axes[2].set(title="RL training reward (20-step mean)", xlabel="RL iteration")
  for ax in axes:
    ax.grid(alpha=0.3)
  axes[1].legend()
  fig.tight_layout()
  out = summary_path(args.out, os.path.commonpath([os.path.abspath(w) for w in args.workdirs]), "accuracy.png")
  fig.savefig(out, dpi=100)
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
