"""Advantage estimators: hand-computed values, RLOO against a loop, flat groups give exactly zero."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.objectives import ADVANTAGES
from rlkit.objectives import aggregate
from rlkit.objectives import group_advantages
from rlkit.objectives import informative_groups
from rlkit.objectives import ppo_clip_loss

# Three groups of four: informative, flat (0.1 is not exact in binary, so its float mean is not 0.1),
# informative with a spread.
REWARDS = np.array([1., 0., 0., 1., .1, .1, .1, .1, 2., 1., 0., 3.], np.float32)


def _randn(seed, shape, scale=1.0):
  return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def test_group_matches_hand_computed():
  # Group 1: mean 0.5, Bessel std sqrt(1/3); group 3: mean 1.5, std sqrt(5/3).
  a, b = 0.5 / np.sqrt(1 / 3), 1 / np.sqrt(5 / 3)
  expected = [a, -a, -a, a, 0, 0, 0, 0, 0.5 * b, -0.5 * b, -1.5 * b, 1.5 * b]
  np.testing.assert_allclose(group_advantages("group", REWARDS, 4, eps=0.0), expected, rtol=1e-6, atol=1e-6)
  # eps sits in the denominator next to the std.
  np.testing.assert_allclose(group_advantages("group", REWARDS, 4, eps=0.1)[:2],
                             [0.5 / (np.sqrt(1 / 3) + 0.1), -0.5 / (np.sqrt(1 / 3) + 0.1)], rtol=1e-6)


def test_batch_and_none_match_numpy():
  r = REWARDS.astype(np.float64).reshape(3, 4)
  centred = r - r.mean(1, keepdims=True)
  centred[1] = 0.0
  batch_std = REWARDS.astype(np.float64).std(ddof=1)
  np.testing.assert_allclose(group_advantages("batch", REWARDS, 4, eps=1e-6),
                             (centred / (batch_std + 1e-6)).ravel(), rtol=1e-6, atol=1e-6)
  np.testing.assert_allclose(group_advantages("none", REWARDS, 4), centred.ravel(), rtol=1e-6, atol=1e-6)


def test_rloo_matches_explicit_loop():
  rewards = _randn(0, (15,))
  g = 5
  expected = np.zeros(15)
  for start in range(0, 15, g):
    for i in range(start, start + g):
      others = [rewards[j] for j in range(start, start + g) if j != i]
      expected[i] = rewards[i] - sum(others) / len(others)
  np.testing.assert_allclose(group_advantages("rloo", rewards, g), expected, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["group", "batch", "none", "rloo"])
def test_flat_group_gets_exactly_zero_advantage_and_gradient(name):
  adv = group_advantages(name, REWARDS, 4)
  assert np.all(np.asarray(adv[4:8]) == 0.0)
  assert np.all(np.asarray(adv[:4]) != 0.0)

  logp = _randn(1, (12, 6)) - 2.0
  old_logp = logp + _randn(2, (12, 6), 0.05)
  mask = jnp.ones((12, 6), bool)

  def loss(lp):
    per_token, _ = ppo_clip_loss(lp, old_logp, adv, mask)
    return aggregate(per_token, mask, "token-mean")

  grad = np.asarray(jax.jit(jax.grad(loss))(logp))
  assert np.all(grad[4:8] == 0.0)
  assert np.all(np.abs(grad[:4]).sum(-1) > 0)


@pytest.mark.parametrize("name", ["group", "batch", "none", "rloo"])
def test_one_member_groups_get_zero(name):
  np.testing.assert_array_equal(group_advantages(name, REWARDS[:3], 1), np.zeros(3))


def test_informative_groups_and_input_checks():
  np.testing.assert_array_equal(informative_groups(REWARDS, 4), [True, False, True])
  with pytest.raises(ValueError, match="groups of 5"):
    group_advantages("group", REWARDS, 5)
  with pytest.raises(ValueError, match="flat"):
    group_advantages("group", REWARDS.reshape(3, 4), 4)
  assert ADVANTAGES.names() == ["batch", "group", "none", "rloo"]


def test_jit_with_static_group_size():
  fn = jax.jit(group_advantages, static_argnums=(0, 2))
  np.testing.assert_allclose(fn("group", REWARDS, 4), group_advantages("group", REWARDS, 4), rtol=1e-6)
