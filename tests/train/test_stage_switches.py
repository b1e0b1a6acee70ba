"""The off-policy correction, engine-mismatch and OnePO switches of the RL stage, each flipped in its context
(tests/train/test_stages.py: FLIPS, CONTEXT, `check_switch`), in a file of their own so the test run can
spread the flips over two workers."""
import pytest

import test_stages as ts


@pytest.fixture(scope="module")
def baseline():
  return ts.one_iteration()


@pytest.mark.parametrize("field", sorted(f for f in ts.FLIPS if f.startswith(ts.OWN_FILE)))
def test_every_rl_stage_switch_changes_the_iteration(baseline, field):
  ts.check_switch(baseline, field)
