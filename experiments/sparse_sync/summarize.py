"""Tables and the plot of experiments/sparse_sync (README.md says what is measured and why).

  python experiments/sparse_sync/summarize.py --root=/tmp/sparse_sync [--out=DIR|FILE.png]

Prints markdown tables (per run: change rate, payload / dense, bit-exact and committed fractions, accuracy;
per arm: median sync times; the payload-per-change law; the refit time projected against link bandwidth; the
fault-injection pass) and writes ROOT/sparse_sync.png, or where --out says (the committed plot:
--out=experiments/sparse_sync).
"""
import argparse
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments import driver  # noqa: E402
from experiments.sparse_sync.run import ARMS  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

GBITS = (1, 10, 100, 400)              # link bandwidths of the projection, Gbit/s
BIG_N = 7e9                            # elements of the projected model
TARGET_RATE, TARGET_RATIO = 0.03, 0.06


def load(path: str) -> dict:
  rows = read_metrics(os.path.join(path, "metrics.jsonl"))
  steps = [r for r in rows if "sync/committed" in r]
  evals = [r for r in rows if "eval/accuracy" in r]
  return {"steps": steps, "evals": evals}


def sft_accuracy(root: str, seed: int):
  row = driver.last_eval(os.path.join(root, f"sft_s{seed}"))
  return None if row is None else row["eval/accuracy"]


def column(steps: list, key: str) -> np.ndarray:
  return np.array([r[key] for r in steps], np.float64)


def receive_s(steps: list) -> np.ndarray:
  return column(steps, "sync/route_s") + column(steps, "sync/apply_s") + column(steps, "sync/verify_s")


def finished_walls(root: str) -> dict:
  """{workdir: wall seconds of its finished launch} from ROOT/runs.jsonl (the runs here were never resumed;
  a failed attempt was deleted and relaunched, so its record is not part of the run)."""
  walls = {}
  with open(os.path.join(root, "runs.jsonl")) as f:
    for line in f:
      r = json.loads(line)
      if r["rc"] == 0 and r["finished"]:
        walls[r["workdir"]] = r["wall_s"]
  return walls


def run_table(root: str, runs: dict) -> list:
  walls = finished_walls(root)
  lines = ["| arm | seed | iterations | change rate (first / median / last) | payload / dense (median) | "
           "steps without fallback | bit-exact | committed | resynced | mismatch/mean (median) | "
           "accuracy SFT -> last eval | wall (s) |", "|" + "---|" * 12]
  for arm, seeds in runs.items():
    for seed, run in seeds.items():
      s = run["steps"]
      rate, ratio = column(s, "sync/change_rate"), column(s, "sync/payload_ratio")
      clean = column(s, "sync/dense_fallbacks") == 0
      exact = column(s, "sync/bit_exact") if "sync/bit_exact" in s[0] else np.zeros(len(s))
      acc = run["evals"][-1]["eval/accuracy"] if run["evals"] else float("nan")
      sft = sft_accuracy(root, seed)
      wall = walls.get(os.path.join(root, f"{arm}_s{seed}"))
      lines.append(f"| {arm} | {seed} | {len(s)} | {rate[0]:.4f} / {np.median(rate):.4f} / {rate[-1]:.4f} | "
                   f"{np.median(ratio):.4f} | {clean.sum()}/{len(s)} | {exact.mean():.3f} | "
                   f"{column(s, 'sync/committed').mean():.3f} | {int(column(s, 'sync/resynced').sum())} | "
                   f"{np.median(column(s, 'mismatch/mean')):.4f} | "
                   f"{'-' if sft is None else f'{sft:.3f}'} -> {acc:.3f} | {'-' if wall is None else f'{wall:.0f}'} |")
  return lines


def pooled(runs: dict, arm: str) -> list:
  return [r for run in runs[arm].values() for r in run["steps"][1:]]     # step 1 includes compilation


def time_table(runs: dict) -> list:
  lines = ["| arm | encode | route | apply | verify | encode + route + apply | dense reshard (export + "
           "device_put) | sparse / dense |", "|" + "---|" * 8]
  for arm in runs:
    s = pooled(runs, arm)
    med = {k: 1e3 * np.median(column(s, f"sync/{k}_s")) for k in ("encode", "route", "apply", "verify", "dense")}
    sparse = 1e3 * np.median(column(s, "sync/encode_s") + column(s, "sync/route_s") + column(s, "sync/apply_s"))
    lines.append(f"| {arm} | {med['encode']:.2f} | {med['route']:.2f} | {med['apply']:.2f} | {med['verify']:.2f} | "
                 f"{sparse:.2f} | {med['dense']:.2f} | {sparse / med['dense']:.1f}x |")
  return ["Median milliseconds per sync over every step but the first (which compiles), all seeds pooled:", ""] + lines


def law_lines(runs: dict) -> list:
  lines = ["| arm | steps without fallback | change rate there (median) | payload / dense there (median) | "
           "payload / (change rate x dense) (median) | implied payload / dense at 3% |", "|" + "---|" * 6]
  for arm in runs:
    s = [r for r in pooled(runs, arm) if r["sync/dense_fallbacks"] == 0 and r["sync/change_rate"] > 0]
    if not s:
      lines.append(f"| {arm} | 0 | - | - | - | - |")
      continue
    rate, ratio = column(s, "sync/change_rate"), column(s, "sync/payload_ratio")
    slope = np.median(ratio / rate)
    lines.append(f"| {arm} | {len(s)} | {np.median(rate):.4f} | {np.median(ratio):.4f} | {slope:.3f} | "
                 f"{slope * TARGET_RATE:.4f} |")
  return lines


def costs(runs: dict, arm: str) -> tuple[float, float, float]:
  """(median payload / dense, median encode seconds per element, median receive (route + apply + verify)
  seconds per element) of an arm, every step but the first pooled."""
  s = pooled(runs, arm)
  n = s[0]["sync/dense_bytes"] / 2
  return (float(np.median(column(s, "sync/payload_ratio"))), float(np.median(column(s, "sync/encode_s"))) / n,
          float(np.median(receive_s(s))) / n)


def projection_lines(runs: dict) -> list:
  """T_dense = 2N/B against T_sparse = N (encode + receive per element) + r 2N/B (CPU costs scaled linearly
  with N: the ratio T_sparse / T_dense is then the same for every N), and the bytes-only limit r 2N/B."""
  bps = np.array(GBITS, np.float64) * 1e9 / 8
  lines = ["| arm | payload / dense r | encode + receive throughput (GB/s of bf16 export) | sparse faster below | "
           + " | ".join(("T_sparse / T_dense at " if i == 0 else "at ") + f"{g} Gbit/s" for i, g in enumerate(GBITS))
           + " |", "|" + "---|" * (4 + len(GBITS))]
  for arm in runs:
    r, enc, rec = costs(runs, arm)
    throughput = 2 / (enc + rec)                       # bytes of dense export handled per second
    ratio = (enc + rec) * bps / 2 + r
    crossover = (1 - r) * throughput * 8 / 1e9
    lines.append(f"| {arm} | {r:.4f} | {throughput / 1e9:.3f} | {crossover:.3g} Gbit/s | "
                 + " | ".join(f"{x:.3g}" for x in ratio) + " |")
  lines += ["", f"For a model of {BIG_N:.0e} elements (bf16: {2 * BIG_N / 1e9:.0f} GB dense): dense / sparse with these "
            "CPU costs / sparse with transfer bytes only (encode and apply overlapped or free):", "",
            "| arm | " + " | ".join(f"{g} Gbit/s" for g in GBITS) + " |", "|" + "---|" * (1 + len(GBITS))]
  for arm in runs:
    r, enc, rec = costs(runs, arm)
    dense = 2 * BIG_N / bps
    cells = [f"{_fmt(d)} / {_fmt(BIG_N * (enc + rec) + r * d)} / {_fmt(r * d)}" for d in dense]
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  return lines


def _fmt(seconds: float) -> str:
  return f"{seconds * 1e3:.3g} ms" if seconds < 1 else f"{seconds:.3g} s"


def _cell(key: str, value) -> str:
  if key == "tensor":                     # a key path as written by jax.tree_util.keystr: ['final_norm']['scale']
    return "`" + ".".join(part.strip("'") for part in value.strip("[]").split("][")) + "`"
  if key == "next_sync_committed":
    return f"{value:.1f}"
  return f"{value:.4f}" if isinstance(value, float) else str(value)


def fault_lines(root: str) -> list:
  path = os.path.join(root, "faults.json")
  if not os.path.exists(path):
    return ["(no faults.json: run `run.py --part=faults`)"]
  faults = driver.read_json(path)
  keys = ("tensor", "failed_acks", "detected", "committed", "baseline_kept", "bit_exact_after_fault",
          "bit_exact_after_resync", "next_sync_committed", "next_sync_bit_exact", "change_rate", "sparse_tensors")
  lines = ["| arm | steps | fault | " + " | ".join(k.replace("bit_exact", "bit-exact").replace("_", " ") for k in keys)
           + " |",
           "|" + "---|" * (3 + len(keys))]
  for arm, result in faults.items():
    for fault in ("drop", "corrupt"):
      r = result[fault]
      if "skipped" in r:
        lines.append(f"| {arm} | {result['steps']} | {fault} | skipped: {r['skipped']} (change rate "
                     f"{r['change_rate']:.4f}) |")
        continue
      cells = " | ".join(_cell(k, r[k]) for k in keys)
      lines.append(f"| {arm} | {result['steps'][0]} -> {result['steps'][1]} | {fault} | {cells} |")
  return lines


def plot(runs: dict, out: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
  colors = {"main": "tab:blue", "lr1e-6": "tab:orange"}
  for arm, seeds in runs.items():
    for i, (seed, run) in enumerate(seeds.items()):
      s = run["steps"]
      x = [r["step"] for r in s]
      label = f"{arm}" if i == 0 else None
      axes[0].plot(x, column(s, "sync/change_rate"), color=colors.get(arm), alpha=0.7, label=label)
      axes[1].plot(x, column(s, "sync/payload_ratio"), color=colors.get(arm), alpha=0.7, label=label)
  axes[0].axhline(TARGET_RATE, color="k", ls=":", label="3%")
  axes[0].set(yscale="log", xlabel="RL iteration", ylabel="change rate (bf16 elements changed / all)",
              title="per-step change rate (3 seeds per arm)")
  axes[1].axhline(TARGET_RATIO, color="k", ls=":", label="target 0.06")
  axes[1].set(yscale="log", xlabel="RL iteration", ylabel="payload / dense bytes", title="sync payload")
  for ax in axes[:2]:
    ax.legend()
  bw = np.logspace(-1, 3, 60)
  for arm in runs:
    r, enc, rec = costs(runs, arm)
    axes[2].plot(bw, (enc + rec) * bw * 1e9 / 8 / 2 + r, color=colors.get(arm), label=f"{arm}: CPU encode/apply")
    axes[2].axhline(r, color=colors.get(arm), ls="--", label=f"{arm}: bytes only (r = {r:.3g})")
  axes[2].axhline(1.0, color="k", ls=":")
  axes[2].set(xscale="log", yscale="log", xlabel="link bandwidth (Gbit/s)", ylabel="T_sparse / T_dense",
              title="refit time vs link bandwidth (any N: costs scale with N)")
  axes[2].legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(out, dpi=110)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/sparse_sync")
  p.add_argument("--seeds", default="0,1,2")
  driver.add_summary_args(p)
  args = p.parse_args(argv)
  seeds = [int(s) for s in args.seeds.split(",")]
  runs = driver.load_runs(args.root, list(ARMS), seeds, load)
  runs = {arm: {seed: run for seed, run in by_seed.items() if run["steps"]} for arm, by_seed in runs.items()}
  runs = {arm: by_seed for arm, by_seed in runs.items() if by_seed}
  if not runs:
    print(f"no runs with sync metrics under {args.root}")
    return 1
  sections = [("Runs", run_table(args.root, runs)), ("Sync time on CPU", time_table(runs)),
              ("Payload per change", law_lines(runs)),
              ("Refit time against link bandwidth (T_dense = 2N/B; T_sparse = encode + payload/B + route + apply "
               "+ verify, CPU medians per element)", projection_lines(runs)),
              ("Fault injection", fault_lines(args.root))]
  for title, lines in sections:
    print(f"### {title}\n")
    print("\n".join(lines) + "\n")
  out = driver.summary_path(args.out, args.root, "sparse_sync.png")
  plot(runs, out)
  print(f"plot: {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
