"""Schedules of traced step inputs (rlkit/optim/schedules.py, `rl.schedules`): their values and their
validation (in the RL stage: tests/train/test_step_schedules.py)."""
import math

import numpy as np
import pytest

from rlkit.core.errors import ConfigError
from rlkit.optim.schedules import SCHEDULES, check, make_schedule, values_at


def test_schedule_values():
  lin = make_schedule({"kind": "linear", "start": 1.0, "end": 0.0, "steps": 4})
  assert [lin(t) for t in range(6)] == [1.0, 0.75, 0.5, 0.25, 0.0, 0.0]
  late = make_schedule({"kind": "linear", "start": 2.0, "end": 4.0, "steps": 2, "begin": 3})
  assert [late(t) for t in (0, 3, 4, 5, 9)] == [2.0, 2.0, 3.0, 4.0, 4.0]
  cos = make_schedule({"kind": "cosine", "start": 1.0, "end": 0.0, "steps": 4})
  np.testing.assert_allclose([cos(t) for t in (0, 2, 4, 8)], [1.0, 0.5, 0.0, 0.0], atol=1e-12)
  assert math.isclose(cos(1), (1 + math.cos(math.pi / 4)) / 2)
  pw = make_schedule({"kind": "piecewise", "boundaries": [2, 5], "values": [1.0, 0.5, 0.0]})
  assert [pw(t) for t in (0, 1, 2, 4, 5, 100)] == [1.0, 1.0, 0.5, 0.5, 0.0, 0.0]
  assert make_schedule({"kind": "constant", "value": 3})(10) == 3.0
  assert sorted(SCHEDULES) == ["constant", "cosine", "linear", "piecewise"]


def test_onepo_anneal_is_a_linear_schedule():
  """OnePO's alpha(t) = alpha0 max(0, 1 - t/T) is the linear schedule alpha0 -> 0 over T steps, bit for bit."""
  from rlkit.objectives.onepo import anneal
  for alpha0, T in ((1.0, 300), (0.7, 13), (2.5, 1)):
    sched = make_schedule({"kind": "linear", "start": alpha0, "end": 0.0, "steps": T})
    for t in range(0, 2 * T + 2):
      assert np.float32(sched(t)) == np.float32(anneal(t, alpha0, T)), (alpha0, T, t)


def test_bad_schedules_are_config_errors():
  with pytest.raises(ConfigError, match=r"rl.schedules.weight/kl.kind='linar'.*linear"):
    check({"weight/kl": {"kind": "linar", "start": 1, "end": 0, "steps": 3}}, "rl.schedules")
  with pytest.raises(ConfigError, match="rl.schedules.weight/kl: .*steps"):
    check({"weight/kl": {"kind": "linear", "start": 1, "end": 0}}, "rl.schedules")
  with pytest.raises(ConfigError, match="a schedule is a dict with a `kind`"):
    check({"weight/kl": 0.5}, "rl.schedules")
