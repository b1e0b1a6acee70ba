"""Driver of experiments/accrue (README.md is the pre-registration): the seed-0 base and the pilot, the calibration
gate and the budget, then every seed's base and arms, then the archive.

  python experiments/accrue/run.py --root=/tmp/accrue [--lock=/tmp/cpu.lock]
  python experiments/accrue/summarize.py --root=experiments/accrue/runs --out=experiments/accrue

Each training run is one `launch.py` subprocess (configs/accrue.py): ROOT/bc_s<seed> (`bc`, the frozen base) and
ROOT/<arm>_s<seed> (from bc_s<seed>'s expert through `accrue.expert_path`). Finished workdirs are skipped,
unfinished runs resumed (experiments/driver.py).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.accrue import ARMS  # noqa: E402
from benchmarks._common import commit  # noqa: E402
from experiments.driver import finished, launch, use_compilation_cache  # noqa: E402
from experiments.gate import GATE_FAILED, check, finish_driver, parse_driver_args, projected_minutes  # noqa: E402
from experiments.gate import record_gate  # noqa: E402

CONFIG = "configs/accrue.py"
TAG = "accrue"
ARCHIVE = os.path.join("experiments", "accrue", "runs")
ARCHIVE_KEYS = ["stage", "step", "step_s", "reward", "success", "critic/loss", "accrue/", "eval/"]
PILOT = "accrue"
BUDGET_MINUTES = 90
BASE_MAX, LEARN_MIN = 0.3, 0.8      # G1, G2


def gate(args) -> bool:
  """G1-G3 (README) on base_s0, the pilot accrue_s0 and their walls, written to ROOT/gate.json."""
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from summarize import load
  base, pilot = load(os.path.join(args.root, "base_s0")), load(os.path.join(args.root, f"{PILOT}_s0"))
  learners = [arm for arm in args.arms if arm != "base"]
  runs = {"bc_s0": len(args.seeds) - 1, "base_s0": len(args.seeds) - 1,
          f"{PILOT}_s0": len(learners) * len(args.seeds) - 1}
  minutes = projected_minutes(args.root, list(runs), runs)
  first = max(s for step, task, s in pilot["evals"] if task == 0)
  checks = [check("G1 the base's highest task success", max(base["final_row"]), high=BASE_MAX),
            check("G2 the pilot's best evaluated success on task 1", first, low=LEARN_MIN),
            check("G3 projected minutes", minutes, high=BUDGET_MINUTES)]
  return record_gate(args.root, TAG, checks, measured={"base": base["final_row"], "pilot_task1": first})


def main(argv=None) -> int:
  args = parse_driver_args(__doc__, "/tmp/accrue", list(ARMS), ARCHIVE, argv)
  use_compilation_cache(args.root)
  failed, rev = [], commit()

  def train(seed, preset):
    path = os.path.join(args.root, f"{preset}_s{seed}")
    extra = [] if preset == "bc" else [f"--config.accrue.expert_path={os.path.join(args.root, f'bc_s{seed}')}"]
    if launch(args.root, path, f"{CONFIG}:{preset}", [f"--config.seed={seed}", *extra], args.lock, args.dry_run,
              TAG, name=preset, seed=seed, commit=rev):
      failed.append(path)
    return path

  gate_runs = [train(0, "bc"), train(0, "base"), train(0, PILOT)]
  if not failed and not args.dry_run and not (all(finished(p) for p in gate_runs) and gate(args)):
    return finish_driver(args, TAG, ARCHIVE_KEYS, failed) or GATE_FAILED
  for seed in args.seeds:
    train(seed, "bc")
    for arm in args.arms:
      train(seed, arm)
  return finish_driver(args, TAG, ARCHIVE_KEYS, failed)


if __name__ == "__main__":
  sys.exit(main())
