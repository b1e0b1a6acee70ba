"""`rl.schedules` in the RL stage: a scheduled step input reaches the update step every iteration without
recompiling it, and a schedule of an input the stage does not read is a config error."""
import ml_collections
import numpy as np
import pytest

import test_stages as ts   # the RL stage's test components (pytest's rootdir import: the same module object)
from rlkit.core.errors import ConfigError
from rlkit.optim.schedules import values_at
from rlkit.train import rl_stage


def test_a_schedule_of_an_unread_input_is_a_config_error():
  with pytest.raises(ConfigError, match="not a step input of this stage.*weight/kl"):
    ts._config({"kl_beta": 0.1, "schedules": {"weight/kll": {"kind": "constant", "value": 1.0}}})


def test_a_scheduled_weight_reaches_every_update_without_recompiling():
  """weight/kl goes 0 -> 0.3 over 3 iterations: each iteration's update sees that iteration's value (the KL
  term's share of the loss moves), and the jitted step compiles once."""
  schedule = {"weight/kl": {"kind": "piecewise", "boundaries": [1, 2], "values": [0.0, 0.3, 3.0]}}
  seen, compiled = [], []

  def spy(make):
    def wrapped(*args, **kwargs):
      step = make(*args, **kwargs)

      def run(state, batch, inputs):
        seen.append(float(inputs["weight/kl"]))
        out = step(state, batch, inputs)
        compiled.append(step._cache_size())
        return out
      return run
    return wrapped

  run = ts.run_stage({"steps": 3, "kl_beta": 0.1, "schedules": schedule}, patches=[(rl_stage, "make_rl_step", spy)])
  assert seen == [float(np.float32(v)) for v in (0.0, 0.0, 0.3, 0.3, 3.0, 3.0)]   # 2 ppo epochs an iteration
  assert compiled[0] == compiled[-1]         # compiled by the first update (or before), never again
  assert [row["schedule/weight/kl"] for row in run.rows] == [0.0, 0.3, 3.0]
  assert values_at(ml_collections.ConfigDict(schedule), 7) == {"weight/kl": 3.0}
