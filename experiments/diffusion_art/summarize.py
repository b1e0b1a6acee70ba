"""results.md of experiments/diffusion_art (README.md is the pre-registration: arms, gate, hypotheses and rules).

  python experiments/diffusion_art/summarize.py --root=experiments/diffusion_art/runs [--out=DIR]

Reads ROOT/<arm>_s<seed>/metrics.jsonl (per iteration: reward, true_reward, nfe, opt_mmd, art/*),
ROOT/samples_<name>_s<seed>.json (the final samples and their measures), ROOT/samples_optimum.json and
ROOT/gate.json; every number and verdict is computed here by README's rules. Writes reward.png (reward against
network evaluations, seed 0) and grid.png (seed 0's final samples beside the reference and the exact optimum).
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs.diffusion_art import ARMS, SAMPLES, STEPS  # noqa: E402
from experiments.driver import changes_lines, load_runs, read_json, spread, summary_path, write_results  # noqa: E402
from experiments.gate import parse_summary_args, results_head  # noqa: E402

BASELINES = ("flow_grpo", "dance_grpo", "nft", "draft")
LATE = 0.1                      # a baseline's late-stage reward: its mean over the last 10% of its iterations
WINDOW = 10                     # iterations of the moving mean the targets are compared with
FEWER = 0.5                     # H1: ART's NFEs to a GRPO baseline's late reward at most half the baseline's
QUALITY = 0.1                   # H3: ART's opt_mmd below the no-restoration arm's by at least 10% of it


def load(path: str) -> dict:
  from rlkit.train.metrics import read_metrics
  rows = [r for r in read_metrics(os.path.join(path, "metrics.jsonl")) if r.get("stage") == "rl" and "nfe" in r
          and "reward" in r]
  rows.sort(key=lambda r: r["step"])
  reward = np.asarray([r["reward"] for r in rows], float)
  run = {"reward": reward, "nfe": np.asarray([r["nfe"] for r in rows], float),
         "opt_mmd": np.asarray([r.get("opt_mmd", math.nan) for r in rows], float),
         "restorations": max([r.get("art/restorations", 0) for r in rows] or [0])}
  run["smooth"] = np.asarray([reward[max(0, i - WINDOW + 1):i + 1].mean() for i in range(len(reward))])
  run["late"] = float(reward[-max(1, int(round(LATE * len(reward)))):].mean()) if len(reward) else math.nan
  return run


def nfe_to(run: dict, target: float) -> float:
  """NFEs when the run's moving-mean reward first reaches `target` (inf: never)."""
  hit = np.nonzero(run["smooth"] >= target)[0]
  return float(run["nfe"][hit[0]]) if hit.size else math.inf


def final_samples(root: str, name: str, seed: int):
  path = os.path.join(root, f"samples_{name}_s{seed}.json")
  return read_json(path) if os.path.exists(path) else None


def load_all(root: str, seeds) -> dict:
  runs = load_runs(root, ARMS, seeds, load)
  for arm, rs in runs.items():
    for seed, run in rs.items():
      run["final"] = final_samples(root, arm, seed)
  return runs


def ratios(runs: dict, arm: str, baseline: str) -> dict:
  """{seed: NFEs for `arm` to reach `baseline`'s late reward / NFEs for the baseline itself}."""
  out = {}
  for seed in sorted(set(runs.get(arm, {})) & set(runs.get(baseline, {}))):
    b = runs[baseline][seed]
    own = nfe_to(b, b["late"])
    out[seed] = nfe_to(runs[arm][seed], b["late"]) / own if own > 0 else math.nan
  return out


def _fmt(r: float) -> str:
  return "never" if math.isinf(r) else f"{r:.2f}"


def _verdict(ok, detail: str) -> str:
  return f"{'not measured' if ok is None else 'supported' if ok else 'not supported'}: {detail}"


def verdicts(runs: dict) -> dict:
  out = {}
  parts, oks = [], []
  for baseline in ("flow_grpo", "dance_grpo"):
    rs = ratios(runs, "art", baseline)
    fewer = sum(r <= FEWER for r in rs.values())
    oks.append(None if not rs else fewer >= 2)
    parts.append(f"{baseline}: " + ", ".join(f"s{s} {_fmt(r)}" for s, r in rs.items()) + f" (<= {FEWER} in {fewer})")
  ok = None if None in oks else all(oks)
  out["H1"] = _verdict(ok, "ART's NFEs to each GRPO baseline's late-stage reward over the baseline's own; " +
                       "; ".join(parts) + " (needs <= " + f"{FEWER} in >= 2 seeds for both)")
  desc = []
  for baseline in ("nft", "draft"):
    rs = ratios(runs, "art", baseline)
    if rs:
      desc.append(f"{baseline}: " + ", ".join(f"s{s} {_fmt(r)}" for s, r in rs.items()))
  out["H2"] = "descriptive: ART's NFE ratio to " + ("; ".join(desc) if desc else "no runs") + \
      " (the spec expects about 1 against NFT)"
  art, bare = runs.get("art", {}), runs.get("art_norestore", {})
  seeds = [s for s in sorted(set(art) & set(bare)) if art[s]["final"] and bare[s]["final"]]
  better = sum(art[s]["final"]["opt_mmd"] < bare[s]["final"]["opt_mmd"] for s in seeds)
  gap = (np.mean([bare[s]["final"]["opt_mmd"] - art[s]["final"]["opt_mmd"] for s in seeds])
         / np.mean([bare[s]["final"]["opt_mmd"] for s in seeds])) if seeds else math.nan
  out["H3"] = _verdict(None if not seeds else better >= 2 and gap >= QUALITY,
                       f"ART's final squared MMD to the exact optimum below ART-without-restoration's in {better} of "
                       f"{len(seeds)} seeds, by {gap:+.0%} of it on average (needs >= 2 seeds and >= {QUALITY:.0%})")
  out["H4"] = "descriptive: restorations per ART run: " + ", ".join(
      f"s{s} {int(r['restorations'])}" for s, r in sorted(art.items())) if art else "descriptive: no ART runs"
  return out


def table(runs: dict, root: str, seeds) -> list:
  opt = read_json(os.path.join(root, "samples_optimum.json")) if os.path.exists(
      os.path.join(root, "samples_optimum.json")) else None
  refs = [final_samples(root, "pretrain", s) for s in seeds]
  refs = [r for r in refs if r]
  lines = ["## Arms (seed mean, min-max)", ""]
  if opt and refs:
    lines += [f"The exact optimum's true reward {opt['true_reward']:.3f}; the reference's "
              f"{spread([r['true_reward'] for r in refs])} (squared MMD to the optimum "
              f"{spread([r['opt_mmd'] for r in refs])}, to its data "
              f"{spread([r['data_mmd'] for r in refs], '{:.4f}')}).",
              ""]
  lines += [f"Late reward: the mean over an arm's last {LATE:.0%} of {STEPS} iterations; final measures on "
            f"{SAMPLES} samples per prompt from fixed noise.", "",
            "| arm | seeds | late reward | NFEs (total) | final reward | final true reward | final MMD^2 to optimum |",
            "|---|---|---|---|---|---|---|"]
  for arm in ARMS:
    rs = runs.get(arm, {})
    if rs:
      finals = [r["final"] for r in rs.values() if r["final"]]
      cells = [spread([r["late"] for r in rs.values()]), spread([r["nfe"][-1] for r in rs.values()], "{:.0f}"),
               spread([f["reward"] for f in finals]), spread([f["true_reward"] for f in finals]),
               spread([f["opt_mmd"] for f in finals], "{:.4f}")]
      lines.append(f"| {arm} | {len(rs)} | " + " | ".join(cells) + " |")
  return lines


def plots(runs: dict, root: str, out: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from experiments.arm_tables import save_figure
  fig, ax = plt.subplots(figsize=(6, 3.5))
  for arm, rs in runs.items():
    if 0 in rs:
      ax.plot(rs[0]["nfe"], rs[0]["smooth"], label=arm)
  ax.set_xlabel("network evaluations (forward-equivalents)")
  ax.set_ylabel(f"reward ({WINDOW}-iteration mean), seed 0")
  ax.set_xscale("log")
  ax.legend(fontsize=7)
  save_figure(fig, summary_path(out, root, "reward.png"))
  panels = [("reference", final_samples(root, "pretrain", 0)), ("exact optimum", read_json(
      os.path.join(root, "samples_optimum.json")) if os.path.exists(os.path.join(root, "samples_optimum.json"))
      else None)] + [(arm, rs[0]["final"]) for arm, rs in runs.items() if 0 in rs]
  panels = [(name, p) for name, p in panels if p]
  if not panels:
    return
  fig, axes = plt.subplots(1, len(panels), figsize=(2.2 * len(panels), 2.4), sharex=True, sharey=True)
  for ax, (name, p) in zip(np.atleast_1d(axes), panels):
    for c, xs in enumerate(np.asarray(p["samples"])):
      ax.scatter(xs[:, 0], xs[:, 1], s=1, color=plt.cm.tab10(c % 10))
    ax.set_title(name, fontsize=8)
  save_figure(fig, summary_path(out, root, "grid.png"))


def render(root: str, seeds) -> str:
  runs = load_all(root, seeds)
  text = results_head("diffusion_art", root)
  text += [f"- **{h}**: {v}" for h, v in verdicts(runs).items()]
  text += ["", *table(runs, root, seeds), "", "![reward against NFEs](reward.png)", "",
           "![final samples, seed 0](grid.png)"]
  text += changes_lines(root)
  return "\n".join(text) + "\n"


def main(argv=None):
  args, seeds = parse_summary_args(__doc__, "experiments/diffusion_art/runs", argv, one_plot=False)
  write_results(args.out, args.root, render(args.root, seeds))
  runs = load_all(args.root, seeds)
  if runs:
    plots(runs, args.root, args.out)


if __name__ == "__main__":
  main()
