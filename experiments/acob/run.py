"""Driver of experiments/acob (README.md is the pre-registration): the seed-0 reference expert, pi_ref's success
and the pilot `acob_s0`, the calibration gate and the budget, then every seed's reference expert and arms, the
throughput pair, then the archive.

  python experiments/acob/run.py --root=/tmp/acob [--lock=/tmp/cpu.lock]
  python experiments/acob/summarize.py --root=experiments/acob/runs

Each training run is one `launch.py` subprocess (configs/acob.py): ROOT/bc_s<seed> (`bc`), ROOT/<arm>_s<seed>
(from bc_s<seed>'s expert through `acob.expert_path`), ROOT/sync_s0 and ROOT/stream_s0; pi_ref's success is one
experiments/acob/reference.py subprocess per seed (ROOT/ref_s<seed>.json). Finished workdirs are skipped,
unfinished runs resumed (experiments/driver.py).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.acob import ARMS, THROUGHPUT  # noqa: E402
from benchmarks._common import commit  # noqa: E402
from experiments.driver import finished, launch, read_json, run_script, use_compilation_cache  # noqa: E402
from experiments.gate import (GATE_FAILED, check, parse_driver_args, projected_minutes,  # noqa: E402
                              record_gate, finish_driver)

CONFIG = "configs/acob.py"
TAG = "acob"
ARCHIVE = os.path.join("experiments", "acob", "runs")
ARCHIVE_KEYS = ["stage", "step", "step_s", "reward", "success", "episodes", "critic/loss", "acob/", "stream/",
                "eval/"]
PILOT = "acob"
BUDGET_MINUTES = 90
THROUGHPUT_MINUTES = 4.0        # the sync and stream runs, estimated (README "Budget")
REF_FREE_MIN, REF_RANGE = 0.8, (0.35, 0.65)      # G1, G2


def reference(args, seed: int) -> int:
  """experiments/acob/reference.py for `seed` (under the lock), unless ROOT/ref_s<seed>.json is there."""
  return run_script(os.path.join(args.root, f"ref_s{seed}.json"), "experiments/acob/reference.py",
                    [f"--root={args.root}", f"--seed={seed}"], args.lock, args.dry_run, TAG)


def gate(args) -> bool:
  """G1-G3 (README) on bc_s0, ref_s0.json and the pilot's wall, written to ROOT/gate.json."""
  ref = read_json(os.path.join(args.root, "ref_s0.json"))
  runs = len(args.arms) * len(args.seeds)
  minutes = projected_minutes(args.root, ["bc_s0", f"{PILOT}_s0"],
                              {"bc_s0": len(args.seeds) - 1, f"{PILOT}_s0": runs - 1}) + THROUGHPUT_MINUTES
  checks = [check("G1 pi_ref success, drift-free task", ref["drift_free"], low=REF_FREE_MIN),
            check("G2 pi_ref success, drifted task", ref["drifted"], low=REF_RANGE[0], high=REF_RANGE[1]),
            check("G3 projected minutes", minutes, high=BUDGET_MINUTES)]
  return record_gate(args.root, TAG, checks, measured=ref)


def main(argv=None) -> int:
  args = parse_driver_args(__doc__, "/tmp/acob", list(ARMS), ARCHIVE, argv)
  use_compilation_cache(args.root)
  failed, rev = [], commit()

  def train(seed, preset, expert=True):
    path = os.path.join(args.root, f"{preset}_s{seed}")
    extra = [f"--config.acob.expert_path={os.path.join(args.root, f'bc_s{seed}')}"] if expert else []
    if launch(args.root, path, f"{CONFIG}:{preset}", [f"--config.seed={seed}", *extra], args.lock, args.dry_run,
              TAG, name=preset, seed=seed, commit=rev):
      failed.append(path)
    return path

  bc0 = train(0, "bc", expert=False)
  if not failed and reference(args, 0):
    failed.append(os.path.join(args.root, "ref_s0.json"))
  pilot = train(0, PILOT)
  if not failed and not args.dry_run and not (finished(bc0) and finished(pilot) and gate(args)):
    return finish(args, failed) or GATE_FAILED
  for seed in args.seeds:
    train(seed, "bc", expert=False)
    if not failed and reference(args, seed):
      failed.append(os.path.join(args.root, f"ref_s{seed}.json"))
    for arm in args.arms:
      train(seed, arm)
  for name in THROUGHPUT:
    train(0, name)
  return finish(args, failed)


def finish(args, failed) -> int:
  return finish_driver(args, TAG, ARCHIVE_KEYS, failed, [f"ref_s{s}.json" for s in args.seeds])


if __name__ == "__main__":
  sys.exit(main())
