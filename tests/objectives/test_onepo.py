"""OnePO's maths (rlkit/objectives/onepo.py): the anneal, mixed-group advantages, the shaped teacher loss."""
import jax
import jax.numpy as jnp
import numpy as np

from rlkit.objectives import group_advantages
from rlkit.objectives.onepo import anneal, mixed_group_advantages, shaped_offpolicy_loss


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
