"""The `accrue` stage from configs/embodied.py:accrue_test: two tasks of three iterations after BC; the actor
waits `n_warm` iterations at the start of each task (the critic learns the task's reward first), every task is evaluated at each
task's end, and a run cut inside the second task resumes to the uninterrupted run's metrics."""
import pytest

from rlkit.core.errors import ConfigError
from rlkit.train.config_checks import validate
from rlkit.train.metrics import without_timings
from tests.embodied.embodied_config import embodied_config
from tests.resume import cut_and_resume


def test_accrue_runs_its_task_sequence_and_resumes(tmp_path, monkeypatch):
  reference, resumed = cut_and_resume(embodied_config("accrue_test"), tmp_path, monkeypatch, 8)
  assert without_timings(resumed) == without_timings(reference)
  rows = [r for r in reference if r["stage"] == "accrue" and "accrue/task" in r]
  assert [r["accrue/task"] for r in rows] == [0, 0, 0, 1, 1, 1]
  assert [("loss" in r) for r in rows] == [False, True, True, False, True, True]     # n_warm = 1 on each task
  ends = [r for r in rows if "accrue/success_t0" in r]
  assert [r["step"] for r in ends] == [7, 10] and all(0 <= r["accrue/success_t1"] <= 1 for r in ends)


def test_the_task_sequence_is_checked():
  c = embodied_config("accrue_test")
  c.accrue.steps = 7
  with pytest.raises(ConfigError, match=r"accrue.steps=7 must be len\(tasks\) x steps_per_task = 2 x 3 = 6"):
    validate(c)
  c.accrue.steps = 6
  c.accrue.tasks = ({"goal": [0.0, 0.0]},)
  with pytest.raises(ConfigError, match=r"accrue.tasks\[0\]="):
    validate(c)
