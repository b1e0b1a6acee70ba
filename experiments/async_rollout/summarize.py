"""results.md of experiments/async_rollout (README.md is the pre-registration: arms, gate, hypotheses and rules).

  python experiments/async_rollout/summarize.py --root=experiments/async_rollout/runs [--out=DIR]

Reads ROOT/<arm>_s<seed>/metrics.jsonl and ROOT/gate.json; every number and verdict is computed here by README's
rules. The projection to larger clusters is rlkit/rollout/elastic.simulate on a workload calibrated from the sync
arm's measured phases (a model, not a measurement).
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs.async_rollout import ARMS, GROUP, PROMPTS, STALENESS, WARMUP  # noqa: E402
from experiments.driver import changes_lines, load_runs, write_results  # noqa: E402
from experiments.gate import parse_summary_args, results_head  # noqa: E402

TOL = 0.1                 # H2, H4: the margins of README
S0_MAX, FAULT_MIN = 1.05, 0.6
CLUSTERS, SIGMAS = (8, 64, 512), (0.5, 1.5)


def load(path: str) -> dict:
  from rlkit.train.metrics import read_metrics
  rows = read_metrics(os.path.join(path, "metrics.jsonl"))
  train = [r for r in rows if "step_s" in r and r.get("stage") == "rl"]
  evals = [r for r in rows if "eval/accuracy" in r]
  timed = train[WARMUP:]
  out = {"steps": len(train), "accuracy": evals[-1]["eval/accuracy"] if evals else float("nan"),
         "throughput": PROMPTS * GROUP / float(np.median([r["step_s"] for r in timed])) if timed else float("nan"),
         "sample_s": float(np.median([r["sample_s"] for r in timed])) if timed else float("nan"),
         "update_s": float(np.median([r["update_s"] for r in timed])) if timed else float("nan")}
  if train and "collect/async_delivered" in train[0]:
    out.update(staleness_max=max(r["collect/async_staleness_max"] for r in train),
               delivered_ok=all(r["collect/async_delivered"] == PROMPTS * GROUP for r in train),
               dropped_failed=sum(r["collect/async_dropped_failed"] for r in train),
               crashes=sum(r["collect/async_crashes"] for r in train))
  return out


def bounds(sync: dict) -> tuple[float, float]:
  """README H2: the async/sync throughput ratio on 2 cores if each phase scales perfectly with cores (alpha 1)
  and if it uses one core only (alpha 0): (g + t) / (2^alpha max(g, t))."""
  g, t = sync["sample_s"], sync["update_s"]
  return (g + t) / (2 * max(g, t)), (g + t) / max(g, t)


def verdicts(runs: dict, seeds) -> dict:
  out = {}
  bad = []
  for arm, by_seed in runs.items():
    k = ARMS[arm].get("async_rollout.max_staleness")
    for seed, r in by_seed.items():
      if k is not None and not (r["staleness_max"] <= k and r["delivered_ok"] and r["dropped_failed"] == 0):
        bad.append(f"{arm} s{seed}")
  faults = runs.get("async_s1_faults", {})
  died = all(r.get("crashes", 0) > 0 and r["steps"] > 0 for r in faults.values()) and bool(faults)
  out["H1"] = ("supported: every async step within its staleness bound, 64 samples delivered, none dropped; "
               "workers died in every faults run" if not bad and died else
               f"not supported: {', '.join(bad) or 'no worker died in a faults run'}")

  def ratios(arm):
    return {s: runs[arm][s]["throughput"] / runs["sync"][s]["throughput"] for s in seeds
            if s in runs.get(arm, {}) and s in runs.get("sync", {})}

  r1 = ratios("async_s1")
  inside = {s: bounds(runs["sync"][s])[0] - TOL <= v <= bounds(runs["sync"][s])[1] + TOL for s, v in r1.items()}
  out["H2"] = _rule(inside, lambda: "async_s1 / sync " + ", ".join(
      f"s{s} {v:.2f} in [{bounds(runs['sync'][s])[0]:.2f}, {bounds(runs['sync'][s])[1]:.2f}]" for s, v in r1.items()))
  r0 = ratios("async_s0")
  out["H3"] = _rule({s: v <= S0_MAX for s, v in r0.items()},
                    lambda: "async_s0 / sync " + ", ".join(f"s{s} {v:.2f}" for s, v in r0.items()))
  deep = {s: all(abs(runs[a][s]["throughput"] / runs["async_s1"][s]["throughput"] - 1) <= TOL
                 for a in ("async_s2", "async_s4") if s in runs.get(a, {}))
          for s in seeds if s in runs.get("async_s1", {})}
  out["H4"] = _rule(deep, lambda: "async_s2, async_s4 / async_s1 " + ", ".join(
      f"s{s} {runs['async_s2'][s]['throughput'] / runs['async_s1'][s]['throughput']:.2f}, "
      f"{runs['async_s4'][s]['throughput'] / runs['async_s1'][s]['throughput']:.2f}"
      for s in deep if s in runs.get("async_s2", {}) and s in runs.get("async_s4", {})))
  kept = {s: runs["async_s1_faults"][s]["throughput"] / runs["async_s1"][s]["throughput"]
          for s in seeds if s in faults and s in runs.get("async_s1", {})}
  out["H5"] = _rule({s: v >= FAULT_MIN for s, v in kept.items()},
                    lambda: "faults / async_s1 " + ", ".join(f"s{s} {v:.2f}" for s, v in kept.items()))
  return out


def _rule(per_seed: dict, detail) -> str:
  if not per_seed:
    return "not measured"
  ok = sum(per_seed.values())
  return f"{'supported' if ok == len(per_seed) else 'not supported'} ({ok} of {len(per_seed)} seeds): {detail()}"


def projection(sync: dict) -> list:
  """Markdown rows: elastic.simulate's throughput of async and elastic relative to colocated, on a workload
  calibrated from the sync arm (a device makes one sample in 2 g / batch seconds, trains a step in 2 t)."""
  from rlkit.rollout.elastic import Workload, simulate
  lines = ["| devices | gen sigma | async k1 / colocate | async k4 / colocate | elastic k1 / colocate | "
           "elastic k4 / colocate |", "|---|---|---|---|---|---|"]
  for d in CLUSTERS:
    for sigma in SIGMAS:
      w = Workload(batch=8 * d, gen_mean_s=2 * sync["sample_s"] / (PROMPTS * GROUP) * 8, gen_sigma=sigma,
                   train_s1=2 * sync["update_s"] * d / 8, train_alpha=0.9)
      base = simulate("colocate", d, w, steps=20).throughput
      cells = [simulate(s, d, w, steps=20, staleness=k).throughput / base for s in ("async", "elastic")
               for k in (1, 4)]
      lines.append(f"| {d} | {sigma} | " + " | ".join(f"{c:.2f}" for c in [cells[0], cells[1], cells[2], cells[3]])
                   + " |")
  return lines


def render(root: str, seeds) -> str:
  runs = load_runs(root, ARMS, seeds, load)
  v = verdicts(runs, seeds)
  text = results_head("async_rollout", root, " on this 2-core CPU")
  text += [f"- **{h}**: {v[h]}" for h in ("H1", "H2", "H3", "H4", "H5")]
  text += ["", "## Throughput (samples trained per second, median iteration after the first "
           f"{WARMUP}) and held-out accuracy", "",
           "| arm | seed | samples/s | vs sync | sample s | update s | staleness max | worker deaths | accuracy |",
           "|---|---|---|---|---|---|---|---|---|"]
  for arm in ARMS:
    for s, r in sorted(runs.get(arm, {}).items()):
      rel = r["throughput"] / runs["sync"][s]["throughput"] if s in runs.get("sync", {}) else math.nan
      text.append(f"| {arm} | {s} | {r['throughput']:.2f} | {rel:.2f} | {r['sample_s']:.2f} | {r['update_s']:.2f} | "
                  f"{r.get('staleness_max', '-')} | {r.get('crashes', '-')} | {r['accuracy']:.3f} |")
  if 0 in runs.get("sync", {}):
    text += ["", "## Projection to larger clusters (a model: rlkit/rollout/elastic.simulate, calibrated on sync "
             "seed 0)", ""] + projection(runs["sync"][0])
  text += changes_lines(root)
  return "\n".join(text) + "\n"


def main(argv=None):
  args, seeds = parse_summary_args(__doc__, "experiments/async_rollout/runs", argv, one_plot=False)
  write_results(args.out, args.root, render(args.root, seeds))


if __name__ == "__main__":
  main()
