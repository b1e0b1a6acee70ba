"""The off-policy correction, engine-mismatch and OnePO switches of the RL stage, each flipped in its context
(tests/train/test_stages.py: FLIPS, CONTEXT, `check_switch`), in a file of their own so the test run can
spread the flips over two workers; and the rewards of rlkit/rewards/catalog.py on the real RL stage (rubric in
two modes and the released protocol's dimensions, constraints, their additive control and CALIF on arithmetic
prompts whose examples carry a rubric and constraints; TIPS' outcome-only reward and the step-label reward on
ProcessBench chains), one iteration each, which reuse the compiled steps
of the flips (the reward values themselves are tested in tests/rewards)."""
import numpy as np
import pytest

import test_stages as ts
from rlkit.data.tasks import make_task


@pytest.fixture(scope="module")
def baseline():
  return ts.one_iteration()


@pytest.mark.parametrize("field", sorted(f for f in ts.FLIPS if f.startswith(ts.OWN_FILE)))
def test_every_rl_stage_switch_changes_the_iteration(baseline, field):
  ts.check_switch(baseline, field)


# ----------------------------------------------------------------------------------- rewards on the stage

RUBRIC = [{"criterion": "the sum is right", "points": 2, "critical": True, "check": {"kind": "answer_correct"}},
          {"criterion": "one or two digits", "points": 1, "check": {"kind": "regex", "pattern": "^[0-9]{1,2}$"}},
          {"criterion": "no zero", "points": -1, "check": {"kind": "contains", "text": "0"}}]
CONSTRAINTS = [{"kind": "max_chars", "n": 2}, {"kind": "forbidden_word", "word": "9"}]
DIMENSIONED = [dict(RUBRIC[0], dimension="answer"), dict(RUBRIC[1], dimension="form"),   # the released protocol's
               {"criterion": "a zero", "fails": "form", "check": {"kind": "contains", "text": "0"}}]


def _arithmetic_source():
  rng = np.random.default_rng(0)
  return [{**ts.TASK.make_example(rng), "rubric": RUBRIC, "dimensioned": DIMENSIONED, "constraints": CONSTRAINTS,
           "ref_len": 2.0} for _ in range(64)]


@pytest.mark.parametrize("reward,kwargs,components", [
    ("rubric", {}, ("gain", "penalty", "gate", "additive")),
    ("rubric", {"mode": "additive"}, ("additive",)),
    ("rubric", {"mode": "dimensions", "field": "dimensioned"}, ("gain", "additive")),
    ("constraints", {}, ("satisfaction", "task", "length_anchor")),
    ("constraints_plus_task", {}, ("satisfaction", "task", "length_anchor")),
    # alpha 0: an untrained policy solves no sum, and a task-anchored reward would be 0 on every row.
    ("calif", {"rho": 1.0, "alpha": 0.0}, ("satisfaction", "task", "length_anchor")),
])
def test_rubric_and_constraint_rewards_train_on_the_rl_stage(reward, kwargs, components):
  run = ts.run_stage({"reward.name": reward, "reward.kwargs": kwargs}, source=_arithmetic_source())
  m = run.metrics
  for name in components:
    assert np.isfinite(m[f"reward/{name}"]), (reward, name, m)
  assert 0.0 <= m["accuracy"] <= 1.0 and np.abs(run.delta).max() > 0
  if kwargs.get("mode") == "additive":      # additive mode's reward is the HealthBench score it logs
    assert m["reward"] == pytest.approx(m["reward/additive"])


@pytest.mark.parametrize("reward,component", [("tips_outcome", "outcome"), ("step_labels", "process")])
def test_process_verifier_rewards_train_on_the_rl_stage(reward, component):
  task = make_task("processbench_chains", subsets=("len3",))
  run = ts.run_stage({"reward.name": reward, "max_new_tokens": 4}, task=task, max_prompt_len=32)
  m = run.metrics
  assert np.isfinite(m[f"reward/{component}"]) and 0.0 <= m["accuracy"] <= 1.0
  assert m["reward"] == pytest.approx(m[f"reward/{component}"] + m["reward/format"])
