"""Driver of experiments/timestep_modules (README.md is the pre-registration): the seed-0 reference expert and the
pilot, the calibration gate and the budget, then every seed's reference expert and arm runs, each seed's analysis,
then the archive.

  python experiments/timestep_modules/run.py --root=/tmp/timestep_modules [--lock=/tmp/cpu.lock]
  python experiments/timestep_modules/run.py --root=DIR --quick --seeds=0 --archive=''     # a smoke run
  python experiments/timestep_modules/summarize.py --root=experiments/timestep_modules/runs

Each training run is one `launch.py` subprocess (configs/timestep_modules.py): ROOT/bc_s<seed> (`bc`), then
ROOT/<arm>_<task>_s<seed> (`<arm>_<task>`, from bc_s<seed>'s expert through `rl.expert_path`); each seed's
measurements are one experiments/timestep_modules/analyze.py subprocess writing ROOT/analysis_s<seed>.json.
Finished workdirs and analyses are skipped, unfinished runs resumed (experiments/driver.py).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.timestep_modules import ARMS, QUICK, TASKS  # noqa: E402
from benchmarks._common import commit  # noqa: E402
from experiments.driver import finished, launch, run_script, use_compilation_cache  # noqa: E402
from experiments.gate import (GATE_FAILED, check, projected_minutes, record_gate,  # noqa: E402
                              parse_driver_args, finish_driver)

CONFIG = "configs/timestep_modules.py"
TAG = "timestep_modules"
ARCHIVE = os.path.join("experiments", "timestep_modules", "runs")
ARCHIVE_KEYS = ["stage", "step", "step_s", "reward", "success", "episodes", "loss", "critic/loss", "clip_frac",
                "eval/"]
PILOT = ("adam", "right")
BUDGET_MINUTES = 90
ANALYSIS_MINUTES = 3.0          # one seed's analysis, estimated (README "Budget")
FREE_MIN, ROOM_MAX, PILOT_GAIN = 0.8, 0.5, 0.3    # G1, G2, G3


def analysis_path(root: str, seed: int) -> str:
  return os.path.join(root, f"analysis_s{seed}.json")


def analyze(args, seed: int) -> int:
  """experiments/timestep_modules/analyze.py for `seed` (under the lock), unless its JSON is there."""
  return run_script(analysis_path(args.root, seed), "experiments/timestep_modules/analyze.py",
                    [f"--root={args.root}", f"--seed={seed}", *(["--quick"] if args.quick else [])], args.lock,
                    args.dry_run, TAG)


def gate(args) -> bool:
  """G1-G4 (README) on bc_s0 and the pilot, written to ROOT/gate.json."""
  sys.path.insert(0, os.path.join(ROOT, "experiments", "timestep_modules"))
  from analyze import pilot_measure                       # jax is imported only where the gate runs
  measured = pilot_measure(args.root, 0, PILOT, args.quick)
  runs = len(args.arms) * len(TASKS) * len(args.seeds)
  more = {"bc_s0": len(args.seeds) - 1, f"{PILOT[0]}_{PILOT[1]}_s0": runs - 1}
  minutes = projected_minutes(args.root, ["bc_s0", f"{PILOT[0]}_{PILOT[1]}_s0"], more) + \
      ANALYSIS_MINUTES * len(args.seeds)
  checks = [check("G1 reference success, drift-free task", measured["s0"]["drift_free"], low=FREE_MIN),
            *[check(f"G2 reference success, task {t}", measured["s0"][t], high=ROOM_MAX) for t in TASKS],
            check("G3 pilot gain (adam, right)", measured["pilot_gain"], low=PILOT_GAIN),
            check("G4 projected minutes", minutes, high=BUDGET_MINUTES)]
  return record_gate(args.root, TAG, checks, measured=measured)


def main(argv=None) -> int:
  sys.argv[1:] = argv if argv is not None else sys.argv[1:]
  quick = "--quick" in sys.argv[1:]
  args = parse_driver_args(__doc__, "/tmp/timestep_modules", list(ARMS), ARCHIVE,
                           [a for a in sys.argv[1:] if a != "--quick"])
  args.quick = quick
  use_compilation_cache(args.root)
  smoke = [f"--config.{k}={v}" for k, v in QUICK.items()] if quick else []
  failed, rev = [], commit()

  def train(seed, preset, extra=()):
    path = os.path.join(args.root, f"{preset}_s{seed}")
    if launch(args.root, path, f"{CONFIG}:{preset}", [f"--config.seed={seed}", *smoke, *extra], args.lock,
              args.dry_run, TAG, name=preset, seed=seed, commit=rev):
      failed.append(path)
    return path

  def arm(seed, name, task):
    return train(seed, f"{name}_{task}", [f"--config.rl.expert_path={os.path.join(args.root, f'bc_s{seed}')}"])

  bc0, pilot = train(0, "bc"), arm(0, *PILOT)
  if not failed and not args.dry_run:
    passed = finished(bc0) and finished(pilot) and gate(args)
    if not passed and not quick:
      return finish(args, failed) or GATE_FAILED
    if not passed:
      print(f"[{TAG}] smoke run: the gate is recorded, not obeyed", flush=True)
  for seed in args.seeds:
    train(seed, "bc")
    for name in args.arms:
      for task in TASKS:
        arm(seed, name, task)
    if not failed and analyze(args, seed):
      failed.append(analysis_path(args.root, seed))
  return finish(args, failed)


def finish(args, failed) -> int:
  return finish_driver(args, TAG, ARCHIVE_KEYS, failed, [f"analysis_s{s}.json" for s in args.seeds])


if __name__ == "__main__":
  sys.exit(main())
