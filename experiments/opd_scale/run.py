"""Driver of experiments/opd_scale: per seed the two teachers (SFT then GRPO) and the two students (short SFT),
then every pre-registered (student, teacher) pair's pure OPD run from them.

  python experiments/opd_scale/run.py --root=/tmp/opd_scale                     # 3 seeds x 6 pairs
  python experiments/opd_scale/run.py --root=DIR --seeds=0 --arms=              # calibration: seed 0's base runs
  python experiments/opd_scale/summarize.py --root=DIR                         # tables, overlaps, plots

Each run is one `launch.py` subprocess (configs/opd_scale.py) into its own workdir: DIR/teacher_w<w>_s<seed>,
DIR/student_w<w>_s<seed>, and DIR/<arm>_s<seed> (arm `s<w>_from_t<w><sft|rl>`) with the same seed, started from
the student's workdir (`model.path`) with the teacher's checkpoint (`models.teacher.path`: checkpoint
TEACHER_SFT_STEPS of the teacher workdir for t<w>sft, TEACHER_SFT_STEPS + TEACHER_RL_STEPS for t<w>rl). Finished
workdirs are skipped, unfinished ones resumed (experiments/driver.py); DIR/runs.jsonl gets each command's wall
time. `--lock=PATH` runs every launch under `flock PATH`.

Every launch shares one persistent XLA compilation cache, DIR/jax_cache (unless JAX_COMPILATION_CACHE_DIR is
set), and one data folder, DIR/data (`data.dir`: each seed's split is written once, not once per workdir); a
cache hit is the executable a fresh compile gives and the split is the same records, so neither changes a
number.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from configs.opd_scale import ARMS, STUDENT_WIDTHS, TEACHER_WIDTHS, TEACHERS, teacher_step  # noqa: E402
from experiments.driver import launch, parse_args, report  # noqa: E402

CONFIG = "configs/opd_scale.py"


def teacher_path(root: str, teacher: str, seed: int) -> str:
  """The checkpoint directory of teacher `teacher` (e.g. "t192rl") of `seed`."""
  spec = TEACHERS[teacher]
  return os.path.join(root, f"teacher_w{spec['width']}_s{seed}", "checkpoints", str(teacher_step(spec["kind"])))


def student_path(root: str, width: int, seed: int) -> str:
  return os.path.join(root, f"student_w{width}_s{seed}")


def arm_args(arm: str, seed: int, root: str) -> list:
  """The command-line overrides of `arm` for `seed`: its student (start) and its teacher."""
  spec = ARMS[arm]
  return [f"--config.seed={seed}", f"--config.data.dir={os.path.join(root, 'data')}",
          f"--config.model.path={student_path(root, spec['student'], seed)}",
          f"--config.models.teacher.path={teacher_path(root, spec['teacher'], seed)}"]


def main(argv=None) -> int:
  args, failed = parse_args(__doc__, "/tmp/opd_scale", ARMS, argv), []
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(args.root, "jax_cache"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))     # a size limit turns on its file lock
  data = f"--config.data.dir={os.path.join(args.root, 'data')}"
  for seed in args.seeds:
    bases = [("teacher", w) for w in TEACHER_WIDTHS] + [("student", w) for w in STUDENT_WIDTHS]
    for role, width in bases:
      path = os.path.join(args.root, f"{role}_w{width}_s{seed}")
      if launch(args.root, path, f"{CONFIG}:{role}_w{width}", [f"--config.seed={seed}", data], args.lock,
                args.dry_run, "opd_scale", name=f"{role}_w{width}", seed=seed):
        failed.append(path)
    for arm in args.arms:
      spec = ARMS[arm]
      needs = (student_path(args.root, spec["student"], seed),
               os.path.join(args.root, f"teacher_w{TEACHERS[spec['teacher']]['width']}_s{seed}"))
      if any(n in failed for n in needs):
        continue
      path = os.path.join(args.root, f"{arm}_s{seed}")
      if launch(args.root, path, f"{CONFIG}:{arm}", arm_args(arm, seed, args.root), args.lock, args.dry_run,
                "opd_scale", name=arm, seed=seed):
        failed.append(path)
  return report("opd_scale", failed)


if __name__ == "__main__":
  sys.exit(main())
