"""Returns and critic pieces: GAE against verl's loop, Monte-Carlo identities, whitening, REINFORCE++ (and
-baseline) hand cases, outcome-reward placement, the clipped value loss."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.objectives import aggregate
from rlkit.objectives import clipped_value_loss
from rlkit.objectives import discounted_returns
from rlkit.objectives import explained_variance
from rlkit.objectives import gae
from rlkit.objectives import masked_whiten
from rlkit.objectives import outcome_token_rewards
from rlkit.objectives import reinforce_pp_advantages
from rlkit.objectives import reinforce_pp_baseline_advantages

N, T = 6, 8
LENGTHS = np.array([8, 3, 0, 5, 1, 6])
PREFIX_MASK = np.arange(T)[None, :] < LENGTHS[:, None]
# Multi-turn style: interior masked spans (rows 0 and 3) as well as trailing padding.
MASK = PREFIX_MASK.copy()
MASK[0, 2:4] = False
MASK[3, 1] = False


def _randn(seed, shape, scale=1.0):
  return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def _verl_gae(rewards, values, mask, gamma, lam):
  """verl compute_gae_advantage_return's loop, transcribed (before its whitening)."""
  mask = mask.astype(np.float64)
  next_values, last_gae, out = np.zeros(len(rewards)), np.zeros(len(rewards)), []
  for t in reversed(range(rewards.shape[1])):
    delta = rewards[:, t] + gamma * next_values - values[:, t]
    last_gae_ = delta + gamma * lam * last_gae
    next_values = values[:, t] * mask[:, t] + (1 - mask[:, t]) * next_values
    last_gae = last_gae_ * mask[:, t] + (1 - mask[:, t]) * last_gae
    out.append(last_gae)
  return np.stack(out[::-1], axis=1)


def _mc_returns(rewards, mask, gamma):
  """Reward-to-go over each row's valid tokens, masked steps skipped."""
  out = np.zeros_like(rewards, np.float64)
  for i in range(len(rewards)):
    g = 0.0
    for t in reversed(range(rewards.shape[1])):
      if mask[i, t]:
        g = rewards[i, t] + gamma * g
        out[i, t] = g
  return out


_gae = jax.jit(gae)


@pytest.mark.parametrize("gamma, lam", [(0.9, 0.95), (1.0, 0.8), (0.7, 1.0)])
def test_gae_matches_verl_loop_with_padding_and_interior_masks(gamma, lam):
  rewards = np.where(MASK, _randn(0, (N, T)), 0.0)
  values = _randn(1, (N, T))
  garbage = np.where(MASK, values, 1e3)  # finite garbage, so verl's multiply-by-mask loop stays finite
  expected = _verl_gae(rewards.astype(np.float64), garbage.astype(np.float64), MASK, gamma, lam)
  adv, ret = _gae(rewards, garbage, MASK, gamma, lam)
  np.testing.assert_allclose(np.where(MASK, adv, 0.0), np.where(MASK, expected, 0.0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, np.where(MASK, expected + values, 0.0), rtol=1e-5, atol=1e-5)
  np.testing.assert_array_equal(np.asarray(adv)[~MASK], 0.0)
  # NaN off the mask changes nothing.
  adv_nan, ret_nan = _gae(np.where(MASK, rewards, np.nan), np.where(MASK, values, np.nan), MASK, gamma, lam)
  np.testing.assert_array_equal(adv_nan, adv)
  np.testing.assert_array_equal(ret_nan, ret)


def test_gae_with_gamma_lam_one_is_monte_carlo_minus_values():
  rewards = np.where(MASK, _randn(2, (N, T)), 0.0)
  values = np.where(MASK, _randn(3, (N, T)), 0.0)
  mc = _mc_returns(rewards, MASK, 1.0)
  adv, ret = _gae(rewards, values, MASK, 1.0, 1.0)
  np.testing.assert_allclose(adv, np.where(MASK, mc - values, 0.0), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(ret, mc, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(discounted_returns(rewards, MASK, 1.0), mc, rtol=1e-5, atol=1e-5)
  # lam = 0: one-step TD errors r_t + gamma V_next - V_t.
  adv0, _ = _gae(rewards, values, MASK, 0.5, 0.0)
  i, t = 0, 1  # row 0's next valid step after t = 1 is t = 4 (2 and 3 are masked)
  np.testing.assert_allclose(adv0[i, t], rewards[i, t] + 0.5 * values[i, 4] - values[i, t], rtol=1e-5)


def test_discounted_returns_hand_case_and_verl_reinforce_pp_loop_on_prefix_masks():
  rewards = np.array([[0., 1., 0.], [2., 0., 0.]], np.float32)
  mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
  np.testing.assert_allclose(discounted_returns(rewards, mask, 0.5), [[0.5, 1.0, 0.0], [2.0, 0.0, 0.0]])
  # verl's REINFORCE++ loop (running return reset at masked tokens) agrees when padding only trails.
  rewards = np.where(PREFIX_MASK, _randn(4, (N, T)), 0.0)
  running, verl = np.zeros(N), np.zeros((N, T))
  for t in reversed(range(T)):
    running = rewards[:, t] + 0.9 * running
    verl[:, t] = running
    running = running * PREFIX_MASK[:, t]
  np.testing.assert_allclose(discounted_returns(rewards, PREFIX_MASK, 0.9), np.where(PREFIX_MASK, verl, 0.0),
                             rtol=1e-5, atol=1e-6)
  # With an interior masked span the return passes through it (verl's reset would cut it to 0 here).
  interior = np.array([[1, 0, 1]], bool)
  np.testing.assert_allclose(discounted_returns([[0., 5., 1.]], interior, 0.5), [[0.5, 0.0, 1.0]])


def test_outcome_token_rewards_on_last_valid_token():
  mask = np.array([[1, 1, 1, 0], [0, 0, 0, 0], [1, 0, 1, 1], [1, 1, 1, 1]], bool)
  out = outcome_token_rewards(jnp.array([1.0, 2.0, -3.0, 4.0]), mask)
  np.testing.assert_array_equal(out, [[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, -3], [0, 0, 0, 4]])
  with pytest.raises(ValueError, match="rewards"):
    outcome_token_rewards(jnp.zeros(3), mask)


def test_masked_whiten_mean_zero_std_one_on_the_mask():
  x = _randn(5, (N, T), 3.0) + 2.0
  garbage = np.where(MASK, x, np.nan)
  w = np.asarray(jax.jit(masked_whiten)(garbage, MASK))
  np.testing.assert_allclose(w[MASK].mean(), 0.0, atol=1e-6)
  np.testing.assert_allclose(w[MASK].std(ddof=1), 1.0, rtol=1e-5)
  np.testing.assert_array_equal(w[~MASK], 0.0)
  ref = (x[MASK] - x[MASK].mean()) / np.sqrt(x[MASK].var(ddof=1) + 1e-8)
  np.testing.assert_allclose(w[MASK], ref, rtol=1e-5, atol=1e-6)
  unshifted = np.asarray(masked_whiten(garbage, MASK, shift_mean=False))
  np.testing.assert_allclose(unshifted[MASK], ref + x[MASK].mean(), rtol=1e-5, atol=1e-6)


def test_masked_whiten_degenerate_inputs_give_zero():
  mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
  flat = np.full((2, 3), 0.1, np.float32)  # float mean of 0.1s need not be 0.1: the residue must not survive
  np.testing.assert_array_equal(masked_whiten(flat, mask), 0.0)
  np.testing.assert_allclose(masked_whiten(flat, mask, shift_mean=False), np.where(mask, 0.1, 0.0), rtol=1e-6)
  one = np.array([[1, 0, 0], [0, 0, 0]], bool)
  np.testing.assert_array_equal(masked_whiten(_randn(6, (2, 3)), one), 0.0)
  out = masked_whiten(_randn(7, (2, 3)), np.zeros((2, 3), bool))
  assert np.all(np.asarray(out) == 0.0)


def test_reinforce_pp_hand_case():
  rewards = np.array([[0., 1., 0.], [2., 0., 0.]], np.float32)
  mask = np.array([[1, 1, 0], [1, 0, 0]], bool)
  # Returns [0.5, 1] and [2]: mean 7/6, deviations [-2/3, -1/6, 5/6], unbiased variance 7/12.
  expected = np.array([[-2 / 3, -1 / 6, 0.0], [5 / 6, 0.0, 0.0]]) / np.sqrt(7 / 12 + 1e-8)
  np.testing.assert_allclose(reinforce_pp_advantages(rewards, mask, 0.5), expected, rtol=1e-5, atol=1e-7)


def test_reinforce_pp_baseline_hand_case_flat_groups_and_padding_rows():
  # G = 2: group (1, 0) centres to (0.5, -0.5), group (3, 3) is flat. Tokens: 0.5 x2, -0.5 x1, 0 x3.
  rewards = np.array([1., 0., 3., 3.], np.float32)
  lengths = np.array([2, 1, 1, 2])
  mask = np.arange(3)[None, :] < lengths[:, None]
  # Mean over the 6 tokens 1/12, deviations [5/12, 5/12, -7/12, -1/12 x3], unbiased variance 17/120.
  std = np.sqrt(17 / 120 + 1e-8)
  verl = np.array([[5, 5, 0], [-7, 0, 0], [-1, 0, 0], [-1, -1, 0]]) / 12 / std
  fn = jax.jit(reinforce_pp_baseline_advantages, static_argnames=("group_size", "zero_flat_groups"))
  np.testing.assert_allclose(fn(rewards, mask, group_size=2, zero_flat_groups=False), verl, rtol=1e-5)
  house = verl.copy()
  house[2:] = 0.0  # the flat group gets exactly 0 (verl shifts it to -mean / std)
  out = np.asarray(fn(rewards, mask, group_size=2))
  np.testing.assert_allclose(out, house, rtol=1e-5)
  assert np.all(out[2:] == 0.0)
  # A third group: an invalid row with tokens and a garbage reward, and a valid row with no tokens. Neither
  # changes the statistics; the lone valid member centres to 0.
  rewards6 = np.append(rewards, [100.0, 7.0]).astype(np.float32)
  mask6 = np.concatenate([mask, [[True] * 3, [False] * 3]])
  valid = np.array([True] * 4 + [False, True])
  out6 = np.asarray(fn(rewards6, mask6, group_size=2, valid=valid))
  np.testing.assert_allclose(out6[:4], house, rtol=1e-5)
  np.testing.assert_array_equal(out6[4:], 0.0)
  # An all-flat batch: exactly zero, not 1e4 times a rounding residue.
  np.testing.assert_array_equal(fn(np.full(4, 0.1, np.float32), mask, group_size=2, zero_flat_groups=False), 0.0)


def test_clipped_value_loss_hand_case():
  # c = 0.5. Token a: v=1 clipped to 0.5 (old 0), R=2: max(1, 2.25) -> clipped. b: v inside [0.3, 1.3]: equal
  # terms, not clipped. c: v=-1 clipped to -0.5, R=-3: max(4, 6.25) -> clipped. d: v=2 clipped to 0.5, R=0:
  # max(4, 0.25) -> unclipped. Column 4 is padding holding NaN.
  values = jnp.array([[1.0, 1.0, -1.0, 2.0, jnp.nan]])
  old = jnp.array([[0.0, 0.8, 0.0, 0.0, jnp.nan]])
  returns = jnp.array([[2.0, 0.0, -3.0, 0.0, jnp.nan]])
  mask = jnp.array([[True, True, True, True, False]])

  def total(v, clip=0.5):
    per_token, metrics = clipped_value_loss(v, old, returns, mask, clip)
    return aggregate(per_token, mask, "token-sum"), (per_token, metrics)

  (value, (per_token, metrics)), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(values)
  np.testing.assert_allclose(per_token, [[1.125, 0.5, 3.125, 2.0, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(value, 6.75, rtol=1e-6)
  np.testing.assert_allclose(grad, [[0.0, 1.0, 0.0, 2.0, 0.0]], rtol=1e-6)  # clipped terms: no gradient
  np.testing.assert_allclose(metrics["vf_clipfrac"], 0.5)
  # R - V = [1, -1, -2, -2] (unbiased var 2), R = [2, 0, -3, 0] (unbiased var 4.25).
  np.testing.assert_allclose(explained_variance(values, returns, mask), 1.0 - 2.0 / (4.25 + 1e-5), rtol=1e-6)

  (value, (_, metrics)), grad = jax.value_and_grad(lambda v: total(v, None), has_aux=True)(values)
  np.testing.assert_allclose(value, 0.5 * (1 + 1 + 4 + 4), rtol=1e-6)
  np.testing.assert_allclose(grad, [[-1.0, 1.0, 2.0, 2.0, 0.0]], rtol=1e-6)
  np.testing.assert_allclose(metrics["vf_clipfrac"], 0.0)
  g_old, g_ret = jax.grad(lambda o, r: clipped_value_loss(values, o, r, mask, 0.5)[0].sum(), argnums=(0, 1))(
      old, returns)
  assert np.all(np.asarray(g_old) == 0.0) and np.all(np.asarray(g_ret) == 0.0)
