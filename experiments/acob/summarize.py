"""results.md of experiments/acob (README.md is the pre-registration: arms, gate, hypotheses and rules).

  python experiments/acob/summarize.py --root=experiments/acob/runs [--out=DIR]

Reads ROOT/ref_s<seed>.json (pi_ref's success, experiments/acob/reference.py), ROOT/<arm>_s<seed>/metrics.jsonl,
ROOT/sync_s0 and ROOT/stream_s0, and ROOT/gate.json; every number and verdict is computed here by README's rules.
Writes success.png (each arm's success against environment steps, seed means).
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs.acob import ARMS, STEPS  # noqa: E402
from experiments.driver import changes_lines, read_json, spread, summary_path, write_results  # noqa: E402
from experiments.gate import parse_summary_args, results_head  # noqa: E402

EARLY = 0.2                  # the dip's window: the first 20% of the iterations
LAST = 3                     # final success: the mean of the last evaluations
PREMISE_DIP = 0.05           # H1
DIP_GAIN = 0.05              # H2
TIE = 0.03                   # H3
ABLATION_GAP = 0.03          # H4
SPEEDUP = 1.5                # H5
ENV_STEPS_PER_ITERATION = 16 * 8 * 4      # environments x chunks x actions a chunk


def load(path: str) -> dict:
  from rlkit.train.metrics import read_metrics
  rows = read_metrics(os.path.join(path, "metrics.jsonl"))
  evals = [(r["step"], r["eval/success"]) for r in rows if "eval/success" in r and r.get("stage") == "acob"]
  d_ref = [r["acob/d_ref"] for r in rows if "acob/d_ref" in r][-20:]
  gate = next((r["step"] for r in rows if r.get("acob/gate_passed") == 1), None)
  rates = [r["stream/decisions_per_s"] for r in rows if "stream/decisions_per_s" in r][1:]   # the first compiles
  return {"evals": evals, "d_ref": float(np.mean(d_ref)) if d_ref else math.nan, "gate_step": gate,
          "tripped": sum(1 for r in rows if r.get("acob/tripped") == 1),
          "rate": float(np.median(rates)) if rates else math.nan}


def measures(run: dict, ref: float) -> dict:
  early = [s for step, s in run["evals"] if step <= EARLY * STEPS]
  last = [s for _, s in run["evals"][-LAST:]]
  return {"dip": ref - min(early) if early else math.nan, "final": float(np.mean(last)) if last else math.nan,
          "min_early": min(early) if early else math.nan}


def load_all(root: str, seeds) -> tuple[dict, dict, dict]:
  refs = {s: read_json(os.path.join(root, f"ref_s{s}.json")) for s in seeds
          if os.path.exists(os.path.join(root, f"ref_s{s}.json"))}
  runs = {}
  for arm in ARMS:
    for s in refs:
      path = os.path.join(root, f"{arm}_s{s}")
      if os.path.exists(os.path.join(path, "metrics.jsonl")):
        run = load(path)
        runs.setdefault(arm, {})[s] = {**run, **measures(run, refs[s]["drifted"])}
  tput = {name: load(os.path.join(root, f"{name}_s0")) for name in ("sync", "stream")
          if os.path.exists(os.path.join(root, f"{name}_s0", "metrics.jsonl"))}
  return refs, runs, tput


def _verdict(ok, detail: str) -> str:
  return f"{'not measured' if ok is None else 'supported' if ok else 'not supported'}: {detail}"


def verdicts(runs: dict, tput: dict) -> dict:
  naive, acob = runs.get("naive", {}), runs.get("acob", {})
  paired = sorted(set(naive) & set(acob))
  out = {}
  dips = [naive[s]["dip"] for s in naive]
  out["H1"] = _verdict(None if not dips else np.mean(dips) >= PREMISE_DIP,
                       f"naive's dip, per seed " + ", ".join(f"s{s} {naive[s]['dip']:+.3f}" for s in sorted(naive))
                       + f" (mean >= {PREMISE_DIP})")
  smaller = sum(acob[s]["dip"] < naive[s]["dip"] for s in paired)
  gain = np.mean([naive[s]["dip"] - acob[s]["dip"] for s in paired]) if paired else math.nan
  out["H2"] = _verdict(None if not paired else smaller >= 2 and gain >= DIP_GAIN,
                       f"acob's dip below naive's in {smaller} of {len(paired)} seeds, by {gain:+.3f} on average "
                       f"(needs >= 2 seeds and >= {DIP_GAIN})")
  held = sum(acob[s]["final"] >= naive[s]["final"] - TIE for s in paired)
  out["H3"] = _verdict(None if not paired else held >= 2,
                       "final success acob vs naive: " + ", ".join(
                           f"s{s} {acob[s]['final']:.3f} vs {naive[s]['final']:.3f}" for s in paired)
                       + f" (acob >= naive - {TIE} in {held}; needs >= 2)")
  parts = []
  for arm in ("acob_no_cal", "acob_no_beta"):
    rs = runs.get(arm, {})
    common = sorted(set(rs) & set(acob))
    if common:
      gap = np.mean([rs[s]["dip"] - acob[s]["dip"] for s in common])
      parts.append(f"{arm} dips {gap:+.3f} more than acob: {'evidence' if gap >= ABLATION_GAP else 'no evidence'} "
                   f"that the removed part reduces the dip (threshold {ABLATION_GAP})")
  out["H4"] = "descriptive: " + ("; ".join(parts) if parts else "no ablation runs")
  if len(tput) == 2:
    ratio = tput["stream"]["rate"] / tput["sync"]["rate"]
    out["H5"] = _verdict(ratio >= SPEEDUP, f"decisions/s stream {tput['stream']['rate']:.1f} vs sync "
                                           f"{tput['sync']['rate']:.1f}: {ratio:.2f}x (needs >= {SPEEDUP})")
  else:
    out["H5"] = _verdict(None, "no throughput pair")
  return out


def table(refs: dict, runs: dict) -> list:
  lines = ["## Arms (seed mean, min-max)", "",
           f"pi_ref on the drifted task: {spread([r['drifted'] for r in refs.values()])}; drift-free: "
           f"{spread([r['drift_free'] for r in refs.values()])}", "",
           "| arm | seeds | min success, first 20% | dip | final success | D_ref (last 20) | trip-wire rollbacks |",
           "|---|---|---|---|---|---|---|"]
  for arm in ARMS:
    rs = runs.get(arm, {})
    if rs:
      cells = [spread([r[k] for r in rs.values()], "{:.3f}") for k in ("min_early", "dip", "final", "d_ref")]
      lines.append(f"| {arm} | {len(rs)} | " + " | ".join(cells) + f" | {sum(r['tripped'] for r in rs.values())} |")
  return lines


def plot(runs: dict, out: str, root: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from experiments.arm_tables import save_figure
  fig, ax = plt.subplots(figsize=(6, 3.5))
  for arm, rs in runs.items():
    steps = [step for step, _ in next(iter(rs.values()))["evals"]]
    mean = [np.mean([dict(r["evals"]).get(step, math.nan) for r in rs.values()]) for step in steps]
    ax.plot([s * ENV_STEPS_PER_ITERATION for s in steps], mean, marker="o", markersize=3, label=arm)
  ax.set_xlabel("environment steps")
  ax.set_ylabel("success (mean over seeds)")
  ax.legend(fontsize=8)
  save_figure(fig, summary_path(out, root, "success.png"))


def render(root: str, seeds) -> str:
  refs, runs, tput = load_all(root, seeds)
  text = results_head("acob", root)
  text += [f"- **{h}**: {v}" for h, v in verdicts(runs, tput).items()]
  text += ["", *table(refs, runs)]
  text += changes_lines(root)
  return "\n".join(text) + "\n"


def main(argv=None):
  args, seeds = parse_summary_args(__doc__, "experiments/acob/runs", argv, one_plot=False)
  write_results(args.out, args.root, render(args.root, seeds))
  _, runs, _ = load_all(args.root, seeds)
  if runs:
    plot(runs, args.out, args.root)


if __name__ == "__main__":
  main()
