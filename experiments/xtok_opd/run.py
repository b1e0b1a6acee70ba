"""Driver of experiments/xtok_opd: the calibration gate on seed 0, then per seed the teacher's and the two
students' runs and every arm from them; the archive.

  python experiments/xtok_opd/run.py --root=/tmp/xtok_opd                   # gate, 3 seeds x 5 arms, archive
  python experiments/xtok_opd/run.py --root=DIR --arms=                     # the gate only (and its archive)
  python experiments/xtok_opd/summarize.py --root=experiments/xtok_opd/runs # the tables, from the archive

1. The gate's runs, seed 0: teacher, student_b, student_d, then the pilot arm PILOT (same_tok). 2. The gate
(`gate_checks`, README "Calibration gate") is written to ROOT/gate.json; if it fails, no other arm runs and the
driver exits GATE_FAILED (2) after archiving what ran. 3. Per seed the three base runs and every arm in --arms.
4. The archive (experiments/archive.py; `--archive`, default experiments/xtok_opd/runs, '' for none, e.g. a smoke
run): each finished workdir's config.json and its metrics cut to KEYS, ROOT/gate.json and the wall records.

Each run is one `launch.py` subprocess (configs/xtok_opd.py) into its own workdir: ROOT/teacher_s<seed> (the base
fine-tuned; tokenizer D, the base's), ROOT/student_b_s<seed> (tokenizer B, the committed bpe/b),
ROOT/student_d_s<seed> (tokenizer D) and ROOT/<arm>_s<seed> with the same seed, started from its student
(`model.path`; its tokenizer comes with the checkpoint), with the teacher's workdir as `models.teacher.path`
(the OPD arms). Finished workdirs are skipped, unfinished ones resumed (experiments/driver.py); ROOT/runs.jsonl
gets each command's wall time. `--lock=PATH` runs every launch under `flock PATH`. `--base=PATH` replaces the
pretrained base (the teacher's start and student D's tokenizer), e.g. by a stand-in for a smoke run.

Every launch shares one persistent XLA compilation cache, ROOT/jax_cache (unless JAX_COMPILATION_CACHE_DIR is
set), and one data folder, ROOT/data (`data.dir`; the split is text, the same for both tokenizers): a cache hit is
the executable a fresh compile gives and the split is the same records, so neither changes a number.
"""
import argparse
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from configs.xtok_opd import ARMS, BASE, PILOT  # noqa: E402
from experiments.driver import finished, last_eval, launch, report  # noqa: E402
from experiments.gate import (GATE_FAILED, archive_with_gate, check, parse_driver_args, projected_minutes,  # noqa: E402
                              record_gate)

CONFIG = "configs/xtok_opd.py"
ARCHIVE = "experiments/xtok_opd/runs"
KEYS = ["stage", "step", "step_s", "eval/", "at_stage_start", "loss", "loss_ema", "reward", "entropy", "distill/"]
SEEDS = 3                       # the pre-registered seed set, which the gate's projection is for
GATE_SEED = 0
MAX_MINUTES = 135.0             # the projection's ceiling: 1.5 x the ~90-minute budget (README, "Budget")
BASES = ("teacher", "student_b", "student_d")


def workdir(root: str, name: str, seed: int) -> str:
  """ROOT/<name>_s<seed>: a base run (BASES) or an arm."""
  return os.path.join(root, f"{name}_s{seed}")


def base_args(name: str, seed: int, root: str, base: str) -> list:
  """The command-line overrides of base run `name` for `seed`."""
  extra = {"teacher": [f"--config.model.path={base}"], "student_b": [],
           "student_d": [f"--config.tokenizer.path={base}"]}[name]
  return [f"--config.seed={seed}", f"--config.data.dir={os.path.join(root, 'data')}", *extra]


def arm_args(arm: str, seed: int, root: str) -> list:
  """The command-line overrides of `arm` for `seed`: its start (the student) and (OPD arms) its teacher."""
  spec = ARMS[arm]
  teacher = ([] if spec["cross_tokenizer"] is None
             else [f"--config.models.teacher.path={workdir(root, 'teacher', seed)}"])
  return [f"--config.seed={seed}", f"--config.data.dir={os.path.join(root, 'data')}",
          f"--config.model.path={workdir(root, 'student_' + spec['student'], seed)}", *teacher]


def needs(arm: str) -> tuple:
  """The base runs `arm` starts from or reads."""
  spec = ARMS[arm]
  return (f"student_{spec['student']}",) + (() if spec["cross_tokenizer"] is None else ("teacher",))


def accuracy(root: str, name: str, seed: int) -> float:
  e = last_eval(workdir(root, name, seed))
  return e["eval/accuracy"] if e else np.nan


def gate_checks(root: str) -> list:
  """The README's calibration gate on seed 0's runs."""
  t, b, d = (accuracy(root, n, GATE_SEED) for n in BASES)
  student = accuracy(root, f"student_{ARMS[PILOT]['student']}", GATE_SEED)
  gate_runs = [f"{n}_s{GATE_SEED}" for n in (*BASES, PILOT)]
  more = {name: SEEDS - 1 for name in gate_runs[:-1]}
  more[gate_runs[-1]] = SEEDS * len(ARMS) - 1          # every arm as long as the pilot (README, "Budget")
  return [check("teacher - student B accuracy (seed 0)", t - b, low=0.40),
          check("teacher - student D accuracy (seed 0)", t - d, low=0.40),
          check("student B accuracy (seed 0)", b, low=0.10),
          check("student D accuracy (seed 0)", d, low=0.10),
          check(f"pilot {PILOT}: gain in accuracy (seed 0)", accuracy(root, PILOT, GATE_SEED) - student, low=0.10),
          check("projected minutes of the 3-seed set", projected_minutes(root, gate_runs, more), high=MAX_MINUTES)]


def main(argv=None) -> int:
  p = argparse.ArgumentParser(add_help=False)
  p.add_argument("--base", default=BASE)
  known, rest = p.parse_known_args(argv)
  args, failed = parse_driver_args(__doc__, "/tmp/xtok_opd", ARMS, ARCHIVE, rest), []
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(args.root, "jax_cache"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))     # a size limit turns on its file lock

  def run(name, seed, preset, overrides):
    path = workdir(args.root, name, seed)
    if launch(args.root, path, f"{CONFIG}:{preset}", overrides, args.lock, args.dry_run, "xtok_opd", name=name,
              seed=seed):
      failed.append(path)

  def bases(seed):
    for name in BASES:
      run(name, seed, name, base_args(name, seed, args.root, known.base))

  def run_arm(arm, seed):
    if not any(workdir(args.root, n, seed) in failed for n in needs(arm)):
      run(arm, seed, arm, arm_args(arm, seed, args.root))

  def archive():
    if args.archive and not args.dry_run:
      names = archive_with_gate(args.root, args.archive, KEYS)
      print(f"[xtok_opd] archived {len(names)} workdir(s) into {args.archive}", flush=True)

  # 1-2. The calibration gate.
  bases(GATE_SEED)
  run_arm(PILOT, GATE_SEED)
  if failed:
    return report("xtok_opd", failed)
  if all(finished(workdir(args.root, n, GATE_SEED)) for n in (*BASES, PILOT)):
    if not record_gate(args.root, "xtok_opd", gate_checks(args.root), seed=GATE_SEED):
      archive()
      return GATE_FAILED
  else:
    print("[xtok_opd] gate: not evaluated (dry run: its runs have not run)", flush=True)
  # 3-4. Every seed, the archive.
  for seed in args.seeds:
    bases(seed)
    for arm in args.arms:
      run_arm(arm, seed)
  archive()
  return report("xtok_opd", failed)


if __name__ == "__main__":
  sys.exit(main())
