"""Summarise experiments/graft: the results tables (markdown, printed) and a PNG of per-skill accuracy.

  python experiments/graft/summarize.py --root=/tmp/graft [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads DIR/sft_{add,sub}_s<seed> (each SFT run's own-task evaluation) and every DIR/<arm>_s<seed> that exists
(config.json, metrics.jsonl). For A (the policy, trained on additions) and B
(the peer, `peer/` metrics, trained on subtractions), per arm over the seeds found: held-out greedy accuracy
per operator at every evaluation and at the end, and the training time (the sum of the iterations'
`step_s`: both models' sampling and updates; evaluations excluded); per direction the groups rescued, grafted rows, rows kept
and tokens kept / rejected (sums over iterations); the largest gradient norm and the number of iterations
above 5x the run's median gradient norm. Writes the plot to DIR/accuracy.png, or into --out.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.graft import ARMS, SFT_OPS  # noqa: E402
from experiments.driver import add_summary_args, last_eval, load_runs, read_json, spread, summary_path  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

MODELS = {"A": "", "B": "peer/"}           # metric prefix of each model
SKILLS = {"A": ("+", "-"), "B": ("-", "+")}  # (own skill, weak skill)
COUNTS = ("groups_rescued", "rows", "rows_kept", "tokens_kept", "tokens_rejected")


def load_arm(path: str) -> dict:
  rows = [r for r in read_metrics(os.path.join(path, "metrics.jsonl")) if r.get("stage") == "graft"]
  train = [r for r in rows if "step_s" in r]
  steps = read_json(os.path.join(path, "config.json"))["graft"]["steps"]
  out = {"done": any("eval/accuracy" in r and r["step"] == steps for r in rows),
         "train_s": float(sum(r["step_s"] for r in train))}
  for m, pre in MODELS.items():
    evals = [r for r in rows if f"{pre}eval/accuracy" in r]
    grad = np.array([r[f"{pre}grad_norm"] for r in train if f"{pre}grad_norm" in r], float)
    out[m] = {"steps": [e["step"] for e in evals],
              "acc": {op: [e.get(f"{pre}eval/accuracy/{op}", np.nan) for e in evals] for op in "+-"},
              "all": [e[f"{pre}eval/accuracy"] for e in evals],
              "counts": {c: float(sum(r.get(f"{pre}graft/{c}", 0.0) for r in train)) for c in COUNTS},
              "grad_max": float(grad.max()) if grad.size else np.nan,
              "spikes": int((grad > 5 * np.median(grad)).sum()) if grad.size else 0,
              "reward": [r.get(f"{pre}reward", np.nan) for r in train]}
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/graft")
  p.add_argument("--seeds", default="0,1,2")
  add_summary_args(p)
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  print("| seed | model | SFT task | SFT steps | SFT greedy acc (own task) |\n|---|---|---|---|---|")
  for seed in seeds:
    for (name, ops), model in zip(SFT_OPS.items(), MODELS):
      e = last_eval(os.path.join(args.root, f"{name}_s{seed}"))
      if e:
        print(f"| {seed} | {model} | `{ops}` | {e['step']} | {e['eval/accuracy']:.3f} |")
  runs = load_runs(args.root, ARMS, seeds, load_arm)
  print("\nFinal held-out greedy accuracy by operator (mean and min-max over seeds; own skill first):\n")
  print("| arm | seeds | A on + (own) | A on - (weak) | B on - (own) | B on + (weak) | A all | B all | train time (s) |")
  print("|---|---|---|---|---|---|---|---|---|")
  for arm, by_seed in runs.items():
    rs = [r for r in by_seed.values() if r["A"]["steps"]]
    cells = [spread([r[m]["acc"][op][-1] for r in rs]) for m in MODELS for op in SKILLS[m]]
    cells += [spread([r[m]["all"][-1] for r in rs]) for m in MODELS]
    done = "" if all(r["done"] for r in rs) else " (unfinished)"
    print(f"| {arm}{done} | {','.join(map(str, by_seed))} | " + " | ".join(cells) +
          f" | {spread([r['train_s'] for r in rs], '{:.0f}')} |")
  print("\nExchange and stability (sums over the iterations, mean over seeds; A receives from B, B from A):\n")
  print("| arm | into | groups rescued | rows grafted | rows kept | tokens kept | tokens rejected | max grad norm "
        "| iterations > 5x median grad norm |\n|---|---|---|---|---|---|---|---|---|")
  for arm, by_seed in runs.items():
    for m in MODELS:
      rs = list(by_seed.values())
      cells = [f"{np.mean([r[m]['counts'][c] for r in rs]):.0f}" for c in COUNTS]
      print(f"| {arm} | {m} | " + " | ".join(cells) + f" | {max(r[m]['grad_max'] for r in rs):.3g} | "
            f"{spread([r[m]['spikes'] for r in rs], '{:.1f}')} |")
  print("\nHeld-out greedy accuracy at each evaluation (mean over seeds):\n")
  steps = max((r["A"]["steps"] for by in runs.values() for r in by.values()), key=len, default=[])
  print("| arm | model, operator | " + " | ".join(map(str, steps)) + " |\n|---|---|" + "---|" * len(steps))
  for arm, by_seed in runs.items():
    for m in MODELS:
      for op in SKILLS[m]:
        cells = [np.nanmean([r[m]["acc"][op][i] for r in by_seed.values() if i < len(r[m]["acc"][op])])
                 for i in range(len(steps))]
        print(f"| {arm} | {m} on {op} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
  plot(runs, summary_path(args.out, args.root, "accuracy.png"))


def plot(runs: dict, out: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 4, figsize=(18, 4.2), sharey=True)
  colors = dict(zip(ARMS, ("tab:gray", "tab:orange", "tab:blue")))
  panels = [(m, op) for m in MODELS for op in SKILLS[m]]
  for ax, (m, op) in zip(axes, panels):
    for arm, by_seed in runs.items():
      rs = [r for r in by_seed.values() if r[m]["steps"]]
      n = min(len(r[m]["steps"]) for r in rs)
      acc = np.array([r[m]["acc"][op][:n] for r in rs])
      ax.plot(rs[0][m]["steps"][:n], acc.mean(0), marker="o", ms=3, color=colors[arm], label=arm)
      if len(rs) > 1:
        ax.fill_between(rs[0][m]["steps"][:n], acc.min(0), acc.max(0), color=colors[arm], alpha=0.15)
    kind = "own" if op == SKILLS[m][0] else "weak"
    ax.set(title=f"{m} ({'additions' if m == 'A' else 'subtractions'}) on {op}: {kind} skill",
           xlabel="RL iteration")
    ax.grid(alpha=0.3)
  seeds = sorted({s for by in runs.values() for s in by})
  axes[0].set_ylabel(f"held-out greedy accuracy (seeds {','.join(map(str, seeds))})")
  axes[0].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out, dpi=100)
  print(f"\nwrote {out}")


if __name__ == "__main__":
  main()
