"""Driver of experiments/opd_scale: the calibration gate on seed 0, then per seed the teachers, the students and
every pre-registered pair's pure OPD run; the top-k overlaps; the archive.

  python experiments/opd_scale/run.py --root=/tmp/opd_scale                   # gate, 3 seeds x 7 pairs, archive
  python experiments/opd_scale/run.py --root=DIR --arms=                      # the gate only (and its archive)
  python experiments/opd_scale/summarize.py --root=experiments/opd_scale/runs # the tables, from the archive

1. The gate's runs, seed 0: teacher_base, teacher_w192, student_w128, student_w96, teacher_self, the initial
   overlaps of seed 0's pairs (overlaps.py), then the pilot pair PILOT. 2. The gate (`gate_checks`, README
   "Calibration gate") is written to ROOT/gate.json; if it fails, no other pair runs and the driver exits
   GATE_FAILED (2) after archiving what ran. 3. Per seed the five base runs and every pair in --arms. 4. The
   overlaps of every seed (initial and final). 5. The archive (experiments/archive.py; `--archive`, default
   experiments/opd_scale/runs, '' for none, e.g. a smoke run): each finished workdir's config.json and its
   metrics cut to KEYS, ROOT/gate.json, ROOT/overlaps.json and the runs' wall records.

Each run is one `launch.py` subprocess (configs/opd_scale.py) into its own workdir (workdirs.py); finished
workdirs are skipped, unfinished ones resumed (experiments/driver.py); ROOT/runs.jsonl gets each command's wall
time. `--lock=PATH` runs every launch and the overlaps under `flock PATH`. `--base=PATH` replaces the pretrained
base (teacher_base's model and every from-scratch run's tokenizer), e.g. by a stand-in for a smoke run.

Every launch shares one persistent XLA compilation cache, ROOT/jax_cache (unless JAX_COMPILATION_CACHE_DIR is
set), and one data folder, ROOT/data (`data.dir`): a cache hit is the executable a fresh compile gives and the
split is the same records, so neither changes a number.
"""
import argparse
import os
import subprocess
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))

from configs.opd_scale import ARMS, BASE, PILOT, STUDENT_WIDTHS, TEACHERS  # noqa: E402
from experiments.driver import finished, last_eval, launch, report  # noqa: E402
from experiments.gate import (GATE_FAILED, archive_with_gate, check, parse_driver_args, projected_minutes,  # noqa: E402
                              record_gate)
from experiments.opd_scale.overlaps import OVERLAP_FILE, read_overlaps  # noqa: E402
from experiments.opd_scale.workdirs import (arm_path, base_accuracy, room, student_path, teacher_path,  # noqa: E402
                                            teacher_run)

CONFIG = "configs/opd_scale.py"
ARCHIVE = "experiments/opd_scale/runs"
KEYS = ["stage", "step", "step_s", "eval/", "at_stage_start", "loss", "loss_ema", "reward", "entropy"]
SEEDS = 3                       # the pre-registered seed set, which the gate's projection is for
GATE_SEED = 0
MAX_MINUTES = 135.0             # the projection's ceiling: 1.5 x the ~90-minute budget (README, "Budget")


def base_runs(root: str, seed: int, base: str) -> list:
  """[(workdir, preset, overrides)] of a seed's teachers and students, in launch order (teacher_self starts from
  student_w128)."""
  data, tok = f"--config.data.dir={os.path.join(root, 'data')}", f"--config.tokenizer.path={base}"
  common = [f"--config.seed={seed}", data]
  return ([(teacher_run(root, "base", seed), "teacher_base", common + [f"--config.model.path={base}"]),
           (teacher_run(root, "w192", seed), "teacher_w192", common + [tok])]
          + [(student_path(root, w, seed), f"student_w{w}", common + [tok]) for w in STUDENT_WIDTHS]
          + [(teacher_run(root, "self", seed), "teacher_self",
              common + [f"--config.model.path={student_path(root, 128, seed)}"])])


def arm_args(arm: str, seed: int, root: str) -> list:
  """The command-line overrides of `arm` for `seed`: its student (start) and its teacher."""
  spec = ARMS[arm]
  return [f"--config.seed={seed}", f"--config.data.dir={os.path.join(root, 'data')}",
          f"--config.model.path={student_path(root, spec['student'], seed)}",
          f"--config.models.teacher.path={teacher_path(root, spec['teacher'], seed)}"]


def gate_checks(root: str) -> tuple[list, bool]:
  """The README's calibration gate on seed 0's runs: (checks, passed). The overlap range is reported with the
  checks but does not stop the experiment (it decides whether H1 is tested)."""
  b = base_accuracy(root, GATE_SEED)
  checks = [check(f"room of {arm} (teacher - student accuracy, seed 0)", room(b, arm), low=0.40) for arm in ARMS]
  checks += [check(f"student s{w} accuracy (seed 0)", b[f"s{w}"], low=0.10) for w in STUDENT_WIDTHS]
  pilot = last_eval(arm_path(root, PILOT, GATE_SEED))
  student = b[f"s{ARMS[PILOT]['student']}"]
  checks.append(check(f"pilot {PILOT}: gain in accuracy (seed 0)", pilot["eval/accuracy"] - student if pilot
                      else np.nan, low=0.10))
  gate_runs = [os.path.basename(w) for w, _, _ in base_runs(root, GATE_SEED, "")] + [f"{PILOT}_s{GATE_SEED}"]
  more = {name: SEEDS - 1 for name in gate_runs[:-1]}
  more[gate_runs[-1]] = SEEDS * len(ARMS) - 1          # every pair as long as the pilot (its teacher: the base)
  checks.append(check("projected minutes of the 3-seed set", projected_minutes(root, gate_runs, more),
                      high=MAX_MINUTES))
  passed = all(c.passed for c in checks)
  initial = [v["initial"]["overlap@5"] for (arm, seed), v in read_overlaps(root).items()
             if seed == GATE_SEED and v["initial"]]
  checks.append(check("range of seed 0's initial overlap@5 over the pairs (reported: H1's condition, does not "
                      "stop)", float(np.ptp(initial)) if len(initial) == len(ARMS) else np.nan, low=0.05))
  return checks, passed


def overlaps(args, seeds) -> int:
  """Runs overlaps.py for `seeds` (under the lock, if any); its exit status."""
  cmd = [sys.executable, os.path.join(HERE, "overlaps.py"), f"--root={args.root}",
         f"--seeds={','.join(map(str, seeds))}"]
  cmd = (["flock", args.lock] if args.lock else []) + cmd
  print("[opd_scale] " + " ".join(cmd), flush=True)
  return 0 if args.dry_run else subprocess.call(cmd)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(add_help=False)
  p.add_argument("--base", default=BASE)
  known, rest = p.parse_known_args(argv)
  args, failed = parse_driver_args(__doc__, "/tmp/opd_scale", ARMS, ARCHIVE, rest), []
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(args.root, "jax_cache"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))     # a size limit turns on its file lock

  def run(path, preset, overrides, seed):
    if launch(args.root, path, f"{CONFIG}:{preset}", overrides, args.lock, args.dry_run, "opd_scale",
              name=os.path.basename(path).rsplit("_s", 1)[0], seed=seed):
      failed.append(path)

  def run_arm(arm, seed):
    spec = ARMS[arm]
    needs = (student_path(args.root, spec["student"], seed), teacher_run(args.root, TEACHERS[spec["teacher"]][0], seed))
    if not any(n in failed for n in needs):
      run(arm_path(args.root, arm, seed), arm, arm_args(arm, seed, args.root), seed)

  def archive():
    if args.archive and not args.dry_run:
      names = archive_with_gate(args.root, args.archive, KEYS, files=(OVERLAP_FILE,))
      print(f"[opd_scale] archived {len(names)} workdir(s) into {args.archive}", flush=True)

  # 1-2. The calibration gate.
  for path, preset, overrides in base_runs(args.root, GATE_SEED, known.base):
    run(path, preset, overrides, GATE_SEED)
  if failed:
    return report("opd_scale", failed)
  if overlaps(args, [GATE_SEED]):
    return report("opd_scale", ["overlaps.py"])
  run_arm(PILOT, GATE_SEED)
  if failed:
    return report("opd_scale", failed)
  gate_runs = [w for w, _, _ in base_runs(args.root, GATE_SEED, "")] + [arm_path(args.root, PILOT, GATE_SEED)]
  if all(finished(w) for w in gate_runs):
    checks, passed = gate_checks(args.root)
    if not record_gate(args.root, "opd_scale", checks, passed=passed, seed=GATE_SEED):
      archive()
      return GATE_FAILED
  else:
    print("[opd_scale] gate: not evaluated (dry run: its runs have not run)", flush=True)
  # 3-5. Every seed, the overlaps, the archive.
  for seed in args.seeds:
    for path, preset, overrides in base_runs(args.root, seed, known.base):
      run(path, preset, overrides, seed)
    for arm in args.arms:
      run_arm(arm, seed)
  if overlaps(args, args.seeds):
    failed.append("overlaps.py")
  archive()
  return report("opd_scale", failed)


if __name__ == "__main__":
  sys.exit(main())
