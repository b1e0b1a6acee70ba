"""Driver of experiments/xtok_opd: the two tokenizers, then per seed the teacher's and the student's SFT runs, then
every arm from them.

  python experiments/xtok_opd/run.py --root=/tmp/xtok_opd                  # 3 seeds x 5 arms
  python experiments/xtok_opd/run.py --root=DIR --seeds=0 --arms=aligned,spans
  python experiments/xtok_opd/summarize.py --root=DIR                      # the tables and plot

First `make_bpe.make_tokenizers(DIR/tokenizers)` (trained, or checked if already there); every run reads its
tokenizer from there (`tokenizer.path`), and the workdirs' checkpoints name it. Each run is one `launch.py`
subprocess (configs/xtok_opd.py) into its own workdir: DIR/teacher_s<seed> (tokenizer A), DIR/student_s<seed>
(tokenizer B), and DIR/<arm>_s<seed> with the same seed, started from the student (`model.path`; same_tok: the
teacher's checkpoint at STUDENT_SFT_STEPS), with the teacher's workdir as `models.teacher.path` (the OPD arms).
Finished workdirs are skipped, unfinished ones resumed (experiments/driver.py); DIR/runs.jsonl gets each
command's wall time. `--lock=PATH` runs every launch under `flock PATH`.

Every launch shares one persistent XLA compilation cache, DIR/jax_cache (unless JAX_COMPILATION_CACHE_DIR is
set): the arms and seeds compile the same programs, and a cache hit is the executable a fresh compile gives, so
it saves compile time without changing a number.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from configs.xtok_opd import ARMS, STUDENT_SFT_STEPS  # noqa: E402
from experiments.driver import launch, parse_args, report  # noqa: E402
from experiments.xtok_opd.make_bpe import make_tokenizers  # noqa: E402

CONFIG = "configs/xtok_opd.py"


def arm_args(arm: str, seed: int, root: str, tokenizers: dict) -> list:
  """The command-line overrides of `arm` for `seed`: its tokenizer, its start and (OPD arms) its teacher."""
  spec, teacher = ARMS[arm], os.path.join(root, f"teacher_s{seed}")
  start = (os.path.join(teacher, "checkpoints", str(STUDENT_SFT_STEPS)) if spec["student"] == "a"
           else os.path.join(root, f"student_s{seed}"))
  extra = [] if spec["cross_tokenizer"] is None else [f"--config.models.teacher.path={teacher}"]
  return [f"--config.seed={seed}", f"--config.tokenizer.path={tokenizers[spec['student']]}",
          f"--config.model.path={start}", *extra]


def main(argv=None) -> int:
  args, failed = parse_args(__doc__, "/tmp/xtok_opd", ARMS, argv), []
  folder = os.path.join(args.root, "tokenizers")
  tokenizers = ({"a": os.path.join(folder, "a"), "b": os.path.join(folder, "b")} if args.dry_run
                else make_tokenizers(folder))
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(args.root, "jax_cache"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))     # a size limit turns on its file lock
  for seed in args.seeds:
    base = {}
    for name, tok in (("teacher", "a"), ("student", "b")):
      base[name] = path = os.path.join(args.root, f"{name}_s{seed}")
      if launch(args.root, path, f"{CONFIG}:{name}_sft", [f"--config.seed={seed}",
                f"--config.tokenizer.path={tokenizers[tok]}"], args.lock, args.dry_run, "xtok_opd",
                name=f"{name}_sft", seed=seed):
        failed.append(path)
    for arm in args.arms:
      spec = ARMS[arm]
      needs = ({"student"} if spec["student"] == "b" else {"teacher"}) | (
          {"teacher"} if spec["cross_tokenizer"] is not None else set())
      if any(base[n] in failed for n in needs):
        continue
      path = os.path.join(args.root, f"{arm}_s{seed}")
      if launch(args.root, path, f"{CONFIG}:{arm}", arm_args(arm, seed, args.root, tokenizers), args.lock,
                args.dry_run, "xtok_opd", name=arm, seed=seed):
        failed.append(path)
  return report("xtok_opd", failed)


if __name__ == "__main__":
  sys.exit(main())
