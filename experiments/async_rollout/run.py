"""Driver of experiments/async_rollout (README.md is the pre-registration): the gate on the sync arm of seed 0,
then every arm of every seed, then the archive.

  python experiments/async_rollout/run.py --root=/tmp/async_rollout [--lock=/tmp/cpu.lock]
  python experiments/async_rollout/summarize.py --root=experiments/async_rollout/runs

Each run is one `launch.py` subprocess (configs/async_rollout.py:<arm>, --config.seed=<seed>) into
ROOT/<arm>_s<seed>; finished workdirs are skipped, unfinished ones resumed (experiments/driver.py). The gate
(README "Calibration gate") reads ROOT/sync_s0 before any other run; its numbers go to ROOT/gate.json.
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks._common import commit  # noqa: E402
from configs.async_rollout import ARMS, WARMUP  # noqa: E402
from experiments.driver import launch, use_compilation_cache  # noqa: E402
from experiments.gate import GATE_FAILED, check, finish_driver, parse_driver_args, record_gate  # noqa: E402

CONFIG = "configs/async_rollout.py"
TAG = "async_rollout"
ARCHIVE = os.path.join("experiments", "async_rollout", "runs")
KEYS = ["stage", "step", "step_s", "sample_s", "update_s", "reward", "accuracy", "collect/", "eval/"]
SHARE = (0.2, 0.8)          # the gate: sampling's share of a sync iteration (README)


def phase_share(path: str) -> float:
  """The median over iterations after WARMUP of sample_s / (sample_s + update_s) of a run; NaN without rows."""
  from rlkit.train.metrics import read_metrics
  file = os.path.join(path, "metrics.jsonl")
  rows = [r for r in read_metrics(file) if "sample_s" in r][WARMUP:] if os.path.exists(file) else []
  if not rows:
    return float("nan")
  return float(np.median([r["sample_s"] / (r["sample_s"] + r["update_s"]) for r in rows]))


def main(argv=None, launch_fn=launch) -> int:
  args = parse_driver_args(__doc__, "/tmp/async_rollout", ARMS, ARCHIVE, argv)
  use_compilation_cache(args.root)
  rev, failed = commit(), []

  def run(arm, seed):
    path = os.path.join(args.root, f"{arm}_s{seed}")
    if launch_fn(args.root, path, f"{CONFIG}:{arm}", [f"--config.seed={seed}"], args.lock, args.dry_run, TAG,
                 name=arm, seed=seed, commit=rev):
      failed.append(path)

  run("sync", 0)
  if failed:
    return finish_driver(args, TAG, KEYS, failed)
  if not args.dry_run:
    share = phase_share(os.path.join(args.root, "sync_s0"))
    if not record_gate(args.root, TAG, [check("G1 sampling share of a sync iteration", share, *SHARE)]):
      finish_driver(args, TAG, KEYS, failed)
      return GATE_FAILED
  for seed in args.seeds:
    for arm in args.arms:
      run(arm, seed)
  return finish_driver(args, TAG, KEYS, failed)


if __name__ == "__main__":
  sys.exit(main())
