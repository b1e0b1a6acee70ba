"""OnePO's maths (rlkit/objectives/onepo.py). Our design: the anneal, mixed-group advantages, the shaped
teacher loss. The released rule (huatuo): the reward frontier, at most one replacement per group, the
retirement schedules, the floored teacher surrogate."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.objectives import group_advantages
from rlkit.objectives.onepo import (RETIREMENTS, anneal, floored_teacher_loss, frontier, mixed_group_advantages,
                                    replacement_order, shaped_offpolicy_loss)
from rlkit.objectives.policy_losses import ppo_clip_loss


def test_anneal_is_linear_to_zero_and_off_at_zero_length():
  assert [anneal(t, 2.0, 4) for t in (0, 1, 2, 4, 9)] == [2.0, 1.5, 1.0, 0.0, 0.0]
  assert anneal(0, 1.0, 0) == 0.0


def test_union_baseline_is_grpo_over_the_valid_rows():
  rewards = jnp.array([0.0, 0.0, 0.0, 1.0, 1.0, 0.0, 1.0, 5.0])   # group 2: last row padding (reward ignored)
  teacher = jnp.array([False, False, False, True, False, False, False, False])
  valid = jnp.array([True, True, True, True, True, True, True, False])
  got = mixed_group_advantages(rewards, teacher, valid, 4, teacher_in_baseline=True)
  want = group_advantages("group", rewards, 4, valid=valid)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
  # All-fail group + a successful teacher: mean 1/4, std (ddof 1) 0.5 -> policy rows -0.5, teacher +1.5.
  np.testing.assert_allclose(got[:4], [-0.5, -0.5, -0.5, 1.5], rtol=1e-5)
  assert got[7] == 0


def test_policy_only_baseline_leaves_an_all_fail_groups_policy_rows_at_zero():
  rewards = jnp.array([0.0, 0.0, 0.0, 1.0])
  teacher = jnp.array([False, False, False, True])
  got = mixed_group_advantages(rewards, teacher, jnp.ones(4, bool), 4, teacher_in_baseline=False)
  np.testing.assert_allclose(got, [0.0, 0.0, 0.0, 1.0 / (0.5 + 1e-6)], rtol=1e-6)
  # Mixed group: baseline = mean of the policy rows (1/3), std of the union.
  rewards = jnp.array([1.0, 0.0, 0.0, 1.0])
  got = mixed_group_advantages(rewards, teacher, jnp.ones(4, bool), 4, teacher_in_baseline=False)
  std = np.std([1, 0, 0, 1], ddof=1)
  np.testing.assert_allclose(got, (np.array([1, 0, 0, 1]) - 1 / 3) / (std + 1e-6), rtol=1e-5)
  flat = mixed_group_advantages(jnp.ones(4), teacher, jnp.ones(4, bool), 4, teacher_in_baseline=False)
  assert (np.asarray(flat) == 0).all()


def test_shaped_loss_value_and_gradient():
  logp = jnp.log(jnp.array([[0.05, 0.5, 0.9]]))
  adv = jnp.array([[2.0, 2.0, 2.0]])
  mask = jnp.array([[True, True, False]])
  gamma = 0.1
  loss = shaped_offpolicy_loss(logp, adv, mask, gamma)
  p = np.array([0.05, 0.5, 0.9])
  np.testing.assert_allclose(loss, [[-2 * 0.05 / 0.15, -2 * 0.5 / 0.6, 0.0]], rtol=1e-6)
  grad = jax.grad(lambda lp: shaped_offpolicy_loss(lp, adv, mask, gamma).sum())(logp)
  # d/dlogp [-A p/(p+g)] = -A g p / (p+g)^2: large relative to p for unlikely tokens, vanishing for likely ones.
  np.testing.assert_allclose(grad, [[*(-2 * gamma * p[:2] / (p[:2] + gamma) ** 2), 0.0]], rtol=1e-5)
  assert (np.asarray(jax.grad(lambda a: shaped_offpolicy_loss(logp, a, mask, gamma).sum())(adv)) == 0).all()


# ------------------------------------------------------------------------------------ the released rule


def test_the_teacher_enters_only_strictly_above_every_student():
  students = np.array([[0.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.2, 0.5, 0.1], [0.0, 0.0, 0.0]])
  teacher = np.array([1.0, 1.0, 0.6, np.nan])          # beats; ties the best (no); beats; not finite (no)
  np.testing.assert_array_equal(frontier(teacher, students), [True, False, True, False])
  np.testing.assert_array_equal(frontier(teacher, students, offered=[False, True, True, True]),
                                [False, False, True, False])
  assert not frontier(np.array([0.5]), np.array([[0.5 + 1e-12, 0.0]])).any()   # no tolerance below the best
  with pytest.raises(ValueError, match="finite"):
    frontier(np.array([1.0]), np.array([[np.nan, 0.0]]))


def test_a_group_gets_at_most_one_replacement_and_keeps_its_size():
  replace, pick = np.array([True, False, True]), np.array([2, 1, 0])
  order = replacement_order(12, 4, replace, pick)
  # Rows 0-11, teacher rows 12-14 (one per group): group 0's row 2 and group 2's row 0 become teacher rows.
  np.testing.assert_array_equal(order, [0, 1, 12, 3, 4, 5, 6, 7, 14, 9, 10, 11])
  for g in range(3):
    assert (order[4 * g:4 * g + 4] >= 12).sum() == int(replace[g])
  np.testing.assert_array_equal(replacement_order(8, 4, np.zeros(2, bool), np.array([3, 3])), np.arange(8))
  with pytest.raises(ValueError, match=r"\[0, 4\)"):
    replacement_order(8, 4, np.ones(2, bool), np.array([4, 0]))


def test_retirement_schedules():
  cutoff, linear = RETIREMENTS.get("cutoff"), RETIREMENTS.get("linear")
  assert [cutoff(t, 4) for t in (0, 3, 4, 9)] == [1.0, 1.0, 0.0, 0.0]       # steps 0..T-1 offer the teacher
  assert [linear(t, 4) for t in (0, 1, 2, 4, 9)] == [1.0, 0.75, 0.5, 0.0, 0.0]
  assert cutoff(0, 0) == linear(0, 0) == 0.0                                   # horizon 0: never
  assert sorted(RETIREMENTS) == ["cutoff", "linear"]


def _floored(logp, old, adv, mask, floor=0.1, **kw):
  return floored_teacher_loss(jnp.asarray(logp), jnp.asarray(old), jnp.asarray(adv), jnp.asarray(mask), floor,
                              **kw)


def test_floored_surrogate_is_ppo_where_the_teacher_is_well_supported():
  logp = jnp.log(jnp.array([[0.3, 0.5, 0.9]]))
  old = jnp.log(jnp.array([[0.2, 0.5, 0.95]]))
  for adv in (jnp.array([1.5]), jnp.array([-0.7])):
    mask = jnp.array([[True, True, False]])
    got, m = _floored(logp, old, adv, mask)
    want, _ = ppo_clip_loss(logp, old, adv, mask)
    np.testing.assert_allclose(got, want, rtol=1e-6)
    assert float(m["low_support_frac"]) == 0.0 and float(m["rescaled_frac"]) == 0.0


def test_a_low_support_teacher_token_with_a_positive_advantage_gets_the_full_gradient():
  """pi_old < floor and A > 0: loss -A and gradient -A d log pi, as at ratio 1, whatever the floor; the same
  token under the plain ratio pi/pi_old would be clipped once pi rose 20%, under the floor only past 0.12."""
  p = jnp.array([[0.01, 0.05, 0.11]])
  adv = jnp.array([2.0])
  mask = jnp.ones((1, 3), bool)
  for floor in (0.1, 0.5):
    loss, m = _floored(jnp.log(p), jnp.log(p), adv, mask, floor=floor)
    grad = jax.grad(lambda lp: _floored(lp, jnp.log(p), adv, mask, floor=floor)[0].sum())(jnp.log(p))
    np.testing.assert_allclose(loss, [[-2.0, -2.0, -2.0]], rtol=1e-6)
    np.testing.assert_allclose(grad, [[-2.0, -2.0, -2.0]], rtol=1e-5)
  assert float(m["low_support_frac"]) == 1.0 and float(m["rescaled_frac"]) == 1.0
  # After an update (pi = 0.1 > 1.2 pi_old = 0.06): the plain ratio is clipped (no gradient), the floored is not.
  new, old = jnp.log(jnp.array([[0.1]])), jnp.log(jnp.array([[0.05]]))
  plain = jax.grad(lambda lp: ppo_clip_loss(lp, old, adv, jnp.ones((1, 1), bool))[0].sum())(new)
  floored = jax.grad(lambda lp: _floored(lp, old, adv, jnp.ones((1, 1), bool))[0].sum())(new)
  assert float(plain[0, 0]) == 0.0 and float(floored[0, 0]) == pytest.approx(-2.0, rel=1e-5)
  # ... until pi passes floor * (1 + eps_high): then the clip stops it too.
  past = jax.grad(lambda lp: _floored(lp, old, adv, jnp.ones((1, 1), bool))[0].sum())(jnp.log(jnp.array([[0.13]])))
  assert float(past[0, 0]) == 0.0


def test_a_low_support_teacher_token_with_a_negative_advantage_is_not_pushed_down_further():
  """A <= 0: no rescale, only the floored denominator. The ratio pi/floor is below 1 - eps_low while
  pi < 0.08, where PPO's pessimistic clip leaves no gradient; between 0.08 and the floor the gradient is
  A pi/floor d log pi (damped)."""
  adv, mask = jnp.array([-1.0]), jnp.ones((1, 1), bool)
  for pi, value, slope in ((0.02, 0.8, 0.0), (0.09, 0.9, 0.9)):
    lp = jnp.log(jnp.array([[pi]]))
    loss, m = _floored(lp, lp, adv, mask, floor=0.1)
    grad = jax.grad(lambda x: _floored(x, lp, adv, mask, floor=0.1)[0].sum())(lp)
    np.testing.assert_allclose(loss, [[value]], rtol=1e-5)
    np.testing.assert_allclose(grad, [[slope]], rtol=1e-5, atol=1e-7)
    assert float(m["low_support_frac"]) == 1.0 and float(m["rescaled_frac"]) == 0.0


def test_floored_surrogate_masks_and_checks_its_floor():
  logp = jnp.log(jnp.array([[0.01, 0.3]]))
  loss, _ = _floored(logp, logp, jnp.array([1.0]), jnp.array([[False, True]]))
  assert float(loss[0, 0]) == 0.0
  grad = jax.grad(lambda lp: _floored(lp, logp, jnp.array([1.0]), jnp.array([[False, True]]))[0].sum())(logp)
  assert float(grad[0, 0]) == 0.0 and math.isfinite(float(grad[0, 1]))
  for floor in (0.0, 1.0):
    with pytest.raises(ValueError, match="floor must be in"):
      _floored(logp, logp, jnp.array([1.0]), jnp.ones((1, 2), bool), floor=floor)
