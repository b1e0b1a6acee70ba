"""DAPO helpers: dynamic sampling fills exactly the target with informative groups; overlong penalty."""
import numpy as np
import pytest

from rlkit.objectives import dynamic_sampling_select
from rlkit.objectives import informative_groups
from rlkit.objectives import overlong_penalty


def test_dynamic_sampling_refills_to_exactly_the_target():
  g = 3
  round1 = np.array([1, 1, 1, 0, 1, 0, 0, 0, 0, 1, 0, 0], np.float32)  # groups: flat, inf, flat, inf
  round2 = np.array([0, 0, 0, 1, 0, 1, 0, 1, 1, 1, 1, 1], np.float32)  # groups: flat, inf, inf, flat
  np.testing.assert_array_equal(informative_groups(round1, g), [False, True, False, True])

  first = dynamic_sampling_select(round1, g, target_groups=3)
  assert not first.done and first.num_informative == 2
  np.testing.assert_array_equal(first.group_indices, [1, 3])

  both = np.concatenate([round1, round2])
  sel = dynamic_sampling_select(both, g, target_groups=3)
  assert sel.done and sel.num_informative == 4
  np.testing.assert_array_equal(sel.group_indices, [1, 3, 5])  # first three, surplus group 6 dropped
  np.testing.assert_array_equal(sel.row_indices, [3, 4, 5, 9, 10, 11, 15, 16, 17])
  kept = both[sel.row_indices].reshape(-1, g)
  assert len(kept) == 3 and np.all(kept.std(axis=1) > 0)


def test_dynamic_sampling_input_checks():
  with pytest.raises(ValueError, match="whole groups"):
    dynamic_sampling_select(np.zeros(5), 3, 1)
  with pytest.raises(ValueError, match="target_groups"):
    dynamic_sampling_select(np.zeros(6), 3, 0)


def test_overlong_penalty_at_the_boundaries():
  # max_len 20, cache 4: free up to 16, ramps to -factor at 20, stays there beyond.
  lengths = np.array([0, 16, 17, 18, 20, 21, 100])
  np.testing.assert_allclose(overlong_penalty(lengths, 20, 4, factor=2.0),
                             [0.0, 0.0, -0.5, -1.0, -2.0, -2.0, -2.0], rtol=1e-6)
  np.testing.assert_allclose(overlong_penalty(np.array([19]), 20, 4), [-0.75], rtol=1e-6)
  with pytest.raises(ValueError, match="cache_len"):
    overlong_penalty(lengths, 20, 21)
