"""Summarise experiments/graft: the gate, the tables and verdicts (markdown, printed) and a PNG of per-skill accuracy.

  python experiments/graft/summarize.py --root=experiments/graft/runs [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads the archive (or a driver's root): gate.json, DIR/sft_<model>_<overlap> (the base's and the SFT model's
accuracy per operator on the balanced set: the SFT run's evaluation at its start and at its end) and every
DIR/<arm>_<overlap>_s<seed>. For A (the policy, `add`) and B (the peer, `peer/` metrics, `sub`), per overlap and
arm over the seeds found: held-out greedy accuracy per operator at every evaluation and at the end, and the
training time (the iterations' `step_s`); per direction the groups rescued, grafted rows, rows kept and tokens
kept / rejected (sums over iterations); the largest gradient norm. Then the pre-registered verdicts (README),
each per seed where it is paired. Writes the plot to DIR/accuracy.png, or into --out. Last, when
experiments/graft/probe_runs exists, the SFT probe's table (probe.py).
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.graft import ARMS, MODELS, OVERLAPS  # noqa: E402
from experiments.driver import read_json, spread, summary_path  # noqa: E402
from experiments.gate import parse_summary_args, read_gate  # noqa: E402
from experiments.graft import probe  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

PREFIX = {"A": "", "B": "peer/"}                 # metric prefix of each model in an arm's workdir
SKILLS = {"A": MODELS["add"], "B": MODELS["sub"]}  # (own operator, weak operator)
COUNTS = ("groups_rescued", "rows", "rows_kept", "tokens_kept", "tokens_rejected")
KEPT_MIN, WEAK_GAIN_MIN, OWN_LOSS_MAX = 0.05, 0.02, 0.03   # the verdict rules' thresholds (README)


def load_arm(path: str) -> dict:
  rows = [r for r in read_metrics(os.path.join(path, "metrics.jsonl")) if r.get("stage") == "graft"]
  train = [r for r in rows if "step_s" in r]
  steps = read_json(os.path.join(path, "config.json"))["graft"]["steps"]
  out = {"done": any("eval/accuracy" in r and r["step"] == steps for r in rows),
         "train_s": float(sum(r["step_s"] for r in train))}
  for m, pre in PREFIX.items():
    evals = [r for r in rows if f"{pre}eval/accuracy" in r and not r.get("at_stage_start")]
    grad = np.array([r[f"{pre}grad_norm"] for r in train if f"{pre}grad_norm" in r], float)
    out[m] = {"steps": [e["step"] for e in evals],
              "acc": {op: [e.get(f"{pre}eval/accuracy/{op}", np.nan) for e in evals] for op in "+-"},
              "counts": {c: float(sum(r.get(f"{pre}graft/{c}", 0.0) for r in train)) for c in COUNTS},
              "grad_max": float(grad.max()) if grad.size else np.nan}
  return out


def load(root: str, seeds) -> dict:
  """{overlap: {arm: {seed: load_arm(...)}}} for the workdirs that exist."""
  runs = {}
  for tag in OVERLAPS:
    for arm in ARMS:
      for seed in seeds:
        path = os.path.join(root, f"{arm}_{tag}_s{seed}")
        if os.path.exists(os.path.join(path, "metrics.jsonl")):
          runs.setdefault(tag, {}).setdefault(arm, {})[seed] = load_arm(path)
  return runs


def final(run: dict, m: str, which: int) -> float:
  """Model m's last evaluation of its own (which=0) or weak (which=1) operator."""
  acc = run[m]["acc"][SKILLS[m][which]]
  return acc[-1] if acc else np.nan


def paired(by_arm: dict, which: int) -> dict:
  """{seed: graft - independent}, the mean over A and B of the last evaluation of the own/weak skill."""
  both = set(by_arm.get("graft", {})) & set(by_arm.get("independent", {}))
  return {s: float(np.mean([final(by_arm["graft"][s], m, which) - final(by_arm["independent"][s], m, which)
                            for m in PREFIX])) for s in sorted(both)}


def weak_verdict(d: dict) -> str:
  """H2 at one overlap: supported if graft is ahead in every seed and by >= WEAK_GAIN_MIN on the mean; not
  supported if the mean is <= 0; inconclusive otherwise."""
  if not d:
    return "not measured"
  mean = np.mean(list(d.values()))
  if all(v > 0 for v in d.values()) and mean >= WEAK_GAIN_MIN:
    return "supported"
  return "not supported" if mean <= 0 else "inconclusive"


def kept_share(by_arm: dict) -> float:
  """Of the rows grafted in the `graft` arm (both directions, every seed), the share the rejection kept."""
  rs = list(by_arm.get("graft", {}).values())
  rows = sum(r[m]["counts"]["rows"] for r in rs for m in PREFIX)
  return sum(r[m]["counts"]["rows_kept"] for r in rs for m in PREFIX) / rows if rows else np.nan


def sft_table(root: str) -> None:
  print("| overlap | model | trained on | base on + | base on - | SFT on + | SFT on - |\n|---|---|---|---|---|---|---|")
  for tag, share in OVERLAPS.items():
    for m, (own, weak) in MODELS.items():
      rows = read_metrics(os.path.join(root, f"sft_{m}_{tag}", "metrics.jsonl"))
      evals = [r for r in rows if "eval/accuracy" in r]
      if not evals:
        continue
      start = next((r for r in evals if r.get("at_stage_start")), {})
      cells = [f"{e.get(f'eval/mixed/accuracy/{op}', np.nan):.3f}" for e in (start, evals[-1]) for op in "+-"]
      print(f"| {tag} | {m} | {1 - share:g} '{own}', {share:g} '{weak}' | " + " | ".join(cells) + " |")


def main(argv=None) -> None:
  args, seeds = parse_summary_args(__doc__, "experiments/graft/runs", argv)
  print("SFT pairs (seed 0, shared by the seeds): greedy accuracy on the balanced held-out set (250 per operator)\n")
  sft_table(args.root)
  runs = load(args.root, seeds)
  print("\nFinal held-out greedy accuracy by operator (mean and min-max over seeds; own skill first):\n")
  print("| overlap | arm | seeds | A on + (own) | A on - (weak) | B on - (own) | B on + (weak) | train time (s) |")
  print("|---|---|---|---|---|---|---|---|")
  for tag, by_arm in runs.items():
    for arm, by_seed in by_arm.items():
      rs = list(by_seed.values())
      cells = [spread([final(r, m, i) for r in rs]) for m in PREFIX for i in (0, 1)]
      done = "" if all(r["done"] for r in rs) else " (unfinished)"
      print(f"| {tag} | {arm}{done} | {','.join(map(str, by_seed))} | " + " | ".join(cells) +
            f" | {spread([r['train_s'] for r in rs], '{:.0f}')} |")
  print("\nExchange (sums over the iterations, mean over seeds; A receives from B, B from A):\n")
  print("| overlap | arm | into | groups rescued | rows grafted | rows kept | tokens kept | tokens rejected | max grad "
        "norm |\n|---|---|---|---|---|---|---|---|---|")
  for tag, by_arm in runs.items():
    for arm, by_seed in by_arm.items():
      for m in PREFIX:
        rs = list(by_seed.values())
        cells = [f"{np.mean([r[m]['counts'][c] for r in rs]):.0f}" for c in COUNTS]
        print(f"| {tag} | {arm} | {m} | " + " | ".join(cells) + f" | {max(r[m]['grad_max'] for r in rs):.3g} |")
  print("\nHeld-out greedy accuracy at each evaluation (mean over seeds):\n")
  for tag, by_arm in runs.items():
    steps = max((r["A"]["steps"] for by in by_arm.values() for r in by.values()), key=len, default=[])
    print(f"| {tag}: arm | model, operator | " + " | ".join(map(str, steps)) + " |\n|---|---|" + "---|" * len(steps))
    for arm, by_seed in by_arm.items():
      for m in PREFIX:
        for op in SKILLS[m]:
          cells = [np.nanmean([r[m]["acc"][op][i] for r in by_seed.values() if i < len(r[m]["acc"][op])])
                   for i in range(len(steps))]
          print(f"| {arm} | {m} on {op} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
    print()
  verdicts(runs, read_gate(args.root))
  if runs:
    plot(runs, summary_path(args.out, args.root, "accuracy.png"))
  probe_root = os.path.join(HERE, "probe_runs")      # probe.ARCHIVE, wherever the summary runs from
  if os.path.isdir(probe_root):
    print(f"\nThe SFT probe for a third design (experiments/graft/probe.py, archived in {probe.ARCHIVE}): greedy "
          "accuracy on a balanced set, 200 problems a skill\n")
    print("\n".join(probe.table(probe_root)))


def verdicts(runs: dict, gate) -> None:
  """The pre-registered verdicts (README "Predictions"), for the overlaps whose arms ran."""
  passed = (gate or {}).get("overlaps_passed", list(runs))
  print("Verdicts (README): paired differences graft - independent per seed, mean over A and B\n")
  print("| overlap | H1 kept share | H2 weak skill d per seed | H2 | H3 own skill d per seed | H3 |\n"
        "|---|---|---|---|---|---|")
  shares = {}
  for tag in OVERLAPS:
    if tag not in runs or tag not in passed:
      print(f"| {tag} | arms not run (gate) | - | - | - | - |")
      continue
    shares[tag] = kept_share(runs[tag])
    weak, own = paired(runs[tag], 1), paired(runs[tag], 0)
    own_ok = "not measured" if not own else "supported" if np.mean(list(own.values())) >= -OWN_LOSS_MAX else \
        "not supported"
    fmt = lambda d: ", ".join(f"s{s} {v:+.3f}" for s, v in d.items()) or "-"   # noqa: E731
    print(f"| {tag} | {shares[tag]:.3f} | {fmt(weak)} | {weak_verdict(weak)} | {fmt(own)} | {own_ok} |")
  if shares:
    rising = len(shares) < 2 or shares.get("o30", np.nan) > shares.get("o10", np.nan)
    ok = all(v >= KEPT_MIN for v in shares.values()) and rising
    print(f"\nH1 (GRAFT keeps >= {KEPT_MIN:.0%} of grafted rows at every overlap run, more at o30 than o10): "
          f"{'supported' if ok else 'not supported'}")


def plot(runs: dict, out: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  panels = [(m, op) for m in PREFIX for op in SKILLS[m]]
  fig, axes = plt.subplots(len(runs), 4, figsize=(18, 4.0 * len(runs)), sharey=True, squeeze=False)
  colors = dict(zip(ARMS, ("tab:gray", "tab:blue")))
  for row, (tag, by_arm) in zip(axes, runs.items()):
    for ax, (m, op) in zip(row, panels):
      for arm, by_seed in by_arm.items():
        rs = [r for r in by_seed.values() if r[m]["steps"]]
        if not rs:
          continue
        n = min(len(r[m]["steps"]) for r in rs)
        acc = np.array([r[m]["acc"][op][:n] for r in rs])
        ax.plot(rs[0][m]["steps"][:n], acc.mean(0), marker="o", ms=3, color=colors[arm], label=arm)
        if len(rs) > 1:
          ax.fill_between(rs[0][m]["steps"][:n], acc.min(0), acc.max(0), color=colors[arm], alpha=0.15)
      kind = "own" if op == SKILLS[m][0] else "weak"
      ax.set(title=f"{tag}: {m} on {op} ({kind} skill)", xlabel="RL iteration")
      ax.grid(alpha=0.3)
    row[0].set_ylabel("held-out greedy accuracy")
    row[0].legend(fontsize=8)
  seeds = sorted({s for by_arm in runs.values() for by in by_arm.values() for s in by})
  fig.suptitle(f"graft from the base (seeds {','.join(map(str, seeds))}; bands: min-max)")
  fig.tight_layout()
  fig.savefig(out, dpi=100)
  plt.close(fig)
  print(f"\nwrote {out}")


if __name__ == "__main__":
  main()
