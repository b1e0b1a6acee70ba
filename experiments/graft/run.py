"""Driver of experiments/graft: the SFT pairs from the base, the calibration gate, then every arm and seed.

  python experiments/graft/run.py --root=/tmp/graft                  # gate, then 2 overlaps x 2 arms x 3 seeds
  python experiments/graft/run.py --root=DIR --seeds=0 --arms=graft  # a subset (the gate's runs always run)
  python experiments/graft/run.py --root=DIR --dry_run               # print the commands only
  python experiments/graft/summarize.py --root=experiments/graft/runs   # the tables and plot, from the archive

Each run is one `launch.py` subprocess (configs/graft.py) into its own workdir. In order:
1. the SFT pair of every overlap from the base, seed 0, shared by the seeds: DIR/sft_add_<o>, DIR/sft_sub_<o>;
2. the calibration gate (README): G1 per overlap from the pair's evaluations on the balanced set; for each
   overlap passing G1, `independent` seed 0 (DIR/independent_<o>_s0, also an arm's run) and G2 from its
   training rewards; G3, the projected minutes of the whole set. DIR/gate.json records it. An overlap that
   fails G1 or G2 runs no arm; when none passes, or G3 fails, the driver stops here (exit 2);
3. every other arm and seed of the passing overlaps: DIR/<arm>_<o>_s<seed>, A = sft_add_<o> as the policy, B =
   sft_sub_<o> as the peer, with the seed (its data split and sampling).
Finished workdirs are skipped, unfinished ones resumed (experiments/driver.py); DIR/runs.jsonl gets each
command's wall time; `--lock=PATH` runs every launch under `flock PATH`. At the end the finished workdirs (cut to
what summarize.py reads) and gate.json are archived into `--archive` (default experiments/graft/runs; '' skips).
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.graft import ARMS, MODELS, OVERLAPS, STEPS  # noqa: E402
from experiments.driver import last_eval, launch, report  # noqa: E402
from experiments.gate import (GATE_FAILED, archive_with_gate, check, parse_driver_args, projected_minutes,  # noqa: E402
                              record_gate)
from rlkit.train.metrics import read_metrics  # noqa: E402

ARCHIVE = "experiments/graft/runs"
# What summarize.py reads of a workdir (experiments/archive.py keys: a key ending in "/" is a prefix).
KEYS = ("stage", "step", "step_s", "at_stage_start", "eval/", "peer/eval/", "reward", "peer/reward", "grad_norm",
        "peer/grad_norm", "graft/", "peer/graft/")
# The gate (README "Calibration gate").
OWN_MIN, WEAK_MIN, MARGIN_MIN = 0.20, 0.02, 0.10   # G1, per SFT model, on the balanced set
MOVE_WINDOW, MOVE_MIN = 10, 0.03                   # G2: reward gain, last vs first iterations, mean of A and B
BUDGET_MAX_MIN = 135.0                             # G3: 1.5 x the 90-minute budget


def sft_checks(root: str, tag: str) -> list:
  """G1 of an overlap: each SFT model's own and weak skill on the balanced set, and their margin."""
  checks = []
  for model, (own, weak) in MODELS.items():
    e = last_eval(os.path.join(root, f"sft_{model}_{tag}")) or {}
    acc = {op: e.get(f"eval/mixed/accuracy/{op}", np.nan) for op in "+-"}
    checks += [check(f"{tag} {model}: own skill '{own}'", acc[own], low=OWN_MIN),
               check(f"{tag} {model}: weak skill '{weak}'", acc[weak], low=WEAK_MIN),
               check(f"{tag} {model}: own - weak", acc[own] - acc[weak], low=MARGIN_MIN)]
  return checks


def reward_gain(path: str, prefix: str, window: int = MOVE_WINDOW) -> float:
  """Mean training reward of the last `window` iterations minus the first `window` (NaN without them)."""
  rewards = [r[prefix + "reward"] for r in read_metrics(os.path.join(path, "metrics.jsonl"))
             if r.get("stage") == "graft" and prefix + "reward" in r]
  if len(rewards) < 2 * window:
    return np.nan
  return float(np.mean(rewards[-window:]) - np.mean(rewards[:window]))


def move_check(root: str, tag: str):
  """G2 of an overlap: `independent` seed 0 moves (the mean of A's and B's training-reward gain)."""
  path = os.path.join(root, f"independent_{tag}_s0")
  gain = np.mean([reward_gain(path, prefix) for prefix in ("", "peer/")])
  return check(f"{tag}: independent s0 reward gain (mean of A, B)", gain, low=MOVE_MIN)


def main(argv=None) -> int:
  args = parse_driver_args(__doc__, "/tmp/graft", ARMS, ARCHIVE, argv)
  failed = []

  def run(name: str, preset: str, seed: int, extra=()) -> bool:
    path = os.path.join(args.root, name)
    if launch(args.root, path, f"configs/graft.py:{preset}", [f"--config.seed={seed}", *extra], args.lock,
              args.dry_run, "graft", name=name, seed=seed):
      failed.append(path)
      return False
    return True

  def arm(arm_name: str, tag: str, seed: int) -> bool:
    sft = {m: os.path.join(args.root, f"sft_{m}_{tag}") for m in MODELS}
    return run(f"{arm_name}_{tag}_s{seed}", f"{arm_name}_{tag}", seed,
               [f"--config.model.path={sft['add']}", f"--config.models.peer.path={sft['sub']}"])

  sft_ok = all([run(f"sft_{m}_{tag}", f"sft_{m}_{tag}", 0) for tag in OVERLAPS for m in MODELS])
  if not sft_ok:
    return finish(args, failed)
  checks, passing = [], []
  for tag in OVERLAPS:
    g1 = sft_checks(args.root, tag)
    checks += g1
    if (args.dry_run or all(c.passed for c in g1)) and arm("independent", tag, 0):
      checks.append(move_check(args.root, tag))
      if args.dry_run or checks[-1].passed:
        passing.append(tag)
  if args.dry_run:
    print("[graft] dry run: the gate is checked here", flush=True)
  else:
    todo = len(args.seeds) * len(args.arms) - ("independent" in args.arms and 0 in args.seeds)
    measured = [f"sft_{m}_{t}" for t in OVERLAPS for m in MODELS] + [f"independent_{t}_s0" for t in passing]
    minutes = projected_minutes(args.root, measured, {f"independent_{t}_s0": todo for t in passing})
    checks.append(check("projected minutes of the whole set", minutes, high=BUDGET_MAX_MIN))
    if not record_gate(args.root, "graft", checks, passed=bool(passing) and checks[-1].passed,
                       overlaps_passed=passing, steps=STEPS):
      finish(args, failed)
      return GATE_FAILED
  for tag in passing:
    for seed in args.seeds:
      for name in args.arms:
        arm(name, tag, seed)
  return finish(args, failed)


def finish(args, failed: list) -> int:
  if args.archive and not args.dry_run:
    names = archive_with_gate(args.root, args.archive, list(KEYS))
    print(f"[graft] archived {len(names)} workdir(s) into {args.archive}", flush=True)
  return report("graft", failed)


if __name__ == "__main__":
  sys.exit(main())
