"""Where experiments/opd_scale's runs live under its root and what they scored: the paths the driver launches into
(run.py), the overlaps read (overlaps.py) and the summary and the gate read (summarize.py, run.py).

  ROOT/teacher_<run>_s<seed>      run base | w192 | self (configs/opd_scale.py TEACHERS)
  ROOT/student_w<width>_s<seed>
  ROOT/<arm>_s<seed>              arm s<width>_from_<teacher>
"""
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs.opd_scale import ARMS, STUDENT_WIDTHS, TEACHERS, teacher_step  # noqa: E402
from experiments.arm_tables import first_eval  # noqa: E402
from experiments.driver import last_eval  # noqa: E402


def teacher_run(root: str, run: str, seed: int) -> str:
  """The workdir of teacher run `run` (base | w192 | self) of `seed`."""
  return os.path.join(root, f"teacher_{run}_s{seed}")


def teacher_path(root: str, teacher: str, seed: int) -> str:
  """The checkpoint directory of teacher `teacher` (e.g. "t192rl") of `seed`."""
  return os.path.join(teacher_run(root, TEACHERS[teacher][0], seed), "checkpoints", str(teacher_step(teacher)))


def student_path(root: str, width: int, seed: int) -> str:
  return os.path.join(root, f"student_w{width}_s{seed}")


def arm_path(root: str, arm: str, seed: int) -> str:
  return os.path.join(root, f"{arm}_s{seed}")


def base_accuracy(root: str, seed: int) -> dict:
  """{"base", "tbase_sft", ..., "tself", "s128", "s96"}: held-out accuracy of the pretrained base before its
  fine-tuning (teacher_base's evaluation before its first update), of each teacher (the last evaluation of its
  stage in its run) and student (its last); nan where a run is missing."""
  from rlkit.train.metrics import read_metrics
  out = {"base": first_eval(teacher_run(root, "base", seed))}
  for teacher, (run, stage) in TEACHERS.items():
    path = os.path.join(teacher_run(root, run, seed), "metrics.jsonl")
    rows = [r for r in read_metrics(path) if "eval/accuracy" in r and r.get("stage") == stage] if os.path.exists(
        path) else []
    out[teacher] = rows[-1]["eval/accuracy"] if rows else np.nan
  for w in STUDENT_WIDTHS:
    e = last_eval(student_path(root, w, seed))
    out[f"s{w}"] = e["eval/accuracy"] if e else np.nan
  return out


def room(bases: dict, arm: str) -> float:
  """Teacher accuracy minus student accuracy of pair `arm` given one seed's `base_accuracy`."""
  spec = ARMS[arm]
  return bases[spec["teacher"]] - bases[f"s{spec['student']}"]
