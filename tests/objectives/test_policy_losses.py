"""Policy losses: clipping gradients and metrics, GRPO/GSPO on-policy equivalence, GSPO vs GSPO-token."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.objectives import POLICY_LOSSES
from rlkit.objectives import aggregate
from rlkit.objectives import gspo_loss
from rlkit.objectives import gspo_token_loss
from rlkit.objectives import ppo_clip_loss

N, T = 5, 7
LENGTHS = np.array([7, 3, 5, 1, 6])
MASK = np.arange(T)[None, :] < LENGTHS[:, None]


def _random(seed, shape=(N, T), scale=1.0):
  return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def _loss_fn(policy_loss, old_logp, adv, mode, **kw):
  def loss(logp):
    per_token, _ = policy_loss(logp, old_logp, adv, MASK, **kw)
    return aggregate(per_token, MASK, mode)
  return loss


def test_on_policy_gspo_gradient_equals_grpo_seq_mean_token_mean():
  logp = _random(0) - 2.0
  old_logp = jnp.array(logp)  # same values, but a separate (stop-gradient) input
  adv = _random(1, (N,))
  g_grpo = jax.jit(jax.grad(_loss_fn(ppo_clip_loss, old_logp, adv, "seq-mean-token-mean")))(logp)
  g_gspo = jax.jit(jax.grad(_loss_fn(gspo_loss, old_logp, adv, "seq-mean-token-mean")))(logp)
  np.testing.assert_allclose(g_gspo, g_grpo, rtol=1e-6, atol=1e-7)
  # Both are length-normalised REINFORCE at ratio 1: d/dlogp_it = -A_i / (N |o_i|) on valid tokens.
  expected = np.where(MASK, -np.asarray(adv)[:, None] / (N * LENGTHS[:, None]), 0.0)
  np.testing.assert_allclose(g_grpo, expected, rtol=1e-6, atol=1e-7)


def _one_token_rows(ratios, advantages):
  """Rows of one valid token with the given ratio, plus a padded column holding -inf log-probs."""
  old = jnp.full((len(ratios), 2), -1.0).at[:, 1].set(-jnp.inf)
  logp = old.at[:, 0].add(jnp.log(jnp.asarray(ratios))).at[:, 1].set(-jnp.inf)
  mask = jnp.array([[True, False]] * len(ratios))
  return logp, old, jnp.asarray(advantages, jnp.float32), mask


def test_clipping_zeroes_the_clipped_side_and_counts_it():
  ratios = [1.5, 0.5, 0.5, 1.5, 1.1, 4.0]
  advs = [1.0, 1.0, -1.0, -1.0, 1.0, -1.0]
  logp, old, adv, mask = _one_token_rows(ratios, advs)

  def total(lp, **kw):
    per_token, metrics = ppo_clip_loss(lp, old, adv, mask, eps_low=0.2, eps_high=0.28, **kw)
    return per_token.sum(), metrics

  (value, metrics), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(logp)
  # Clipped: A > 0 with ratio > 1.28, A < 0 with ratio < 0.8. Elsewhere d(-A r)/dlogp = -A r.
  np.testing.assert_allclose(grad[:, 0], [0.0, -0.5, 0.0, 1.5, -1.1, 4.0], rtol=1e-6)
  np.testing.assert_array_equal(grad[:, 1], 0.0)
  np.testing.assert_allclose(value, -(1.28 + 0.5 - 0.8 - 1.5 + 1.1 - 4.0), rtol=1e-6)
  np.testing.assert_allclose(metrics["clip_frac"], 2 / 6, rtol=1e-6)
  np.testing.assert_allclose(metrics["dual_clip_frac"], 0.0)
  np.testing.assert_allclose(metrics["ratio_mean"], np.mean(ratios), rtol=1e-6)

  with_dual = functools.partial(total, dual_clip=3.0)
  (value, metrics), grad = jax.jit(jax.value_and_grad(with_dual, has_aux=True))(logp)
  # Dual clip caps the A < 0, ratio 4 token's loss at -c A = 3 and stops its gradient.
  np.testing.assert_allclose(grad[:, 0], [0.0, -0.5, 0.0, 1.5, -1.1, 0.0], rtol=1e-6)
  np.testing.assert_allclose(value, -(1.28 + 0.5 - 0.8 - 1.5 + 1.1 - 3.0), rtol=1e-6)
  np.testing.assert_allclose(metrics["dual_clip_frac"], 1 / 6, rtol=1e-6)


def test_gspo_matches_paper_formula_and_clips_per_sequence():
  old_logp = _random(2) - 2.0
  logp = old_logp + _random(3, scale=0.3)
  adv = _random(4, (N,))
  @jax.jit
  def loss(logp):
    per_token, metrics = gspo_loss(logp, old_logp, adv, MASK, eps_low=0.02, eps_high=0.02)
    return aggregate(per_token, MASK, "seq-mean-token-mean"), metrics

  value, metrics = loss(logp)
  lr = np.where(MASK, logp - old_logp, 0.0)
  s = np.exp(lr.sum(1) / LENGTHS)
  a = np.asarray(adv)
  expected = -np.mean(np.minimum(s * a, np.clip(s, 0.98, 1.02) * a))
  np.testing.assert_allclose(value, expected, rtol=1e-6)
  clipped = np.maximum(-s * a, -np.clip(s, 0.98, 1.02) * a) > -s * a
  assert 0 < clipped.sum() < N  # the draw mixes clipped and unclipped sequences
  np.testing.assert_allclose(metrics["clip_frac"], (clipped * LENGTHS).sum() / LENGTHS.sum(), rtol=1e-6)


@pytest.mark.parametrize("mode", ["seq-mean-token-mean", "token-mean"])
def test_gspo_token_equals_gspo_for_sequence_advantages(mode):
  old_logp = _random(5) - 2.0
  logp = old_logp + _random(6, scale=0.3)
  adv = _random(7, (N,))
  kw = dict(eps_low=0.1, eps_high=0.1)
  v_seq, g_seq = jax.jit(jax.value_and_grad(_loss_fn(gspo_loss, old_logp, adv, mode, **kw)))(logp)
  v_tok, g_tok = jax.jit(jax.value_and_grad(_loss_fn(gspo_token_loss, old_logp, adv, mode, **kw)))(logp)
  np.testing.assert_allclose(v_tok, v_seq, rtol=1e-6)
  np.testing.assert_allclose(g_tok, g_seq, rtol=1e-5, atol=1e-7)
  assert np.abs(np.asarray(g_seq)).max() > 1e-3
  clip_frac = jax.jit(lambda lp: gspo_loss(lp, old_logp, adv, MASK, **kw)[1]["clip_frac"])(logp)
  assert 0 < clip_frac < 1  # some sequences are clipped, so the equivalence covers both branches

  # With advantages that vary inside a sequence the two differ, as they should.
  adv_tok = _random(8)
  g_seq = jax.jit(jax.grad(_loss_fn(gspo_loss, old_logp, adv_tok, mode, **kw)))(logp)
  g_tok = jax.jit(jax.grad(_loss_fn(gspo_token_loss, old_logp, adv_tok, mode, **kw)))(logp)
  assert not np.allclose(g_tok, g_seq, rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "gspo_token"])
def test_shared_signature_stop_gradients_and_broadcast(name):
  fn = POLICY_LOSSES.get(name)
  old_logp = _random(9) - 2.0
  logp = old_logp + _random(10, scale=0.1)
  adv = _random(11, (N,))
  kw = dict(eps_low=0.2, eps_high=0.28, dual_clip=3.0)
  per_seq, m_seq = fn(logp, old_logp, adv, MASK, **kw)
  per_tok, m_tok = fn(logp, old_logp, jnp.broadcast_to(adv[:, None], (N, T)), MASK, **kw)
  np.testing.assert_allclose(per_seq, per_tok, rtol=1e-6)
  assert set(m_seq) == {"clip_frac", "dual_clip_frac", "ratio_mean", "approx_kl"}
  np.testing.assert_array_equal(np.asarray(per_seq)[~np.asarray(MASK)], 0.0)

  def total(lp, olp, a):
    return fn(lp, olp, a, MASK, **kw)[0].sum()

  _, g_old, g_adv = jax.jit(jax.grad(total, argnums=(0, 1, 2)))(logp, old_logp, adv)
  np.testing.assert_array_equal(g_old, 0.0)
  np.testing.assert_array_equal(g_adv, 0.0)


def test_invalid_clip_settings_raise():
  x = jnp.zeros((1, 1))
  with pytest.raises(ValueError, match="dual_clip"):
    ppo_clip_loss(x, x, x[:, 0], x > -1, dual_clip=1.0)
  with pytest.raises(ValueError, match="eps_low"):
    gspo_loss(x, x, x[:, 0], x > -1, eps_low=1.0)
