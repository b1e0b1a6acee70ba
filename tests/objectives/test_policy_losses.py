"""Policy losses: clipping gradients and metrics, GRPO/GSPO on-policy equivalence, GSPO vs GSPO-token, and
CISPO (verl and TRL), SAPO and GMPO against hand-computed values and gradients."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.objectives import POLICY_LOSSES
from rlkit.objectives import aggregate
from rlkit.objectives import cispo_loss
from rlkit.objectives import cispo_trl_loss
from rlkit.objectives import gmpo_loss
from rlkit.objectives import gspo_loss
from rlkit.objectives import gspo_token_loss
from rlkit.objectives import ppo_clip_loss
from rlkit.objectives import sapo_loss

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


SHARED_KW = {"cispo_trl": dict(eps_low=0.2, eps_high=5.0, dual_clip=3.0), "sapo": dict(eps_low=0.2, eps_high=0.28)}
NEW_LOSSES = ["cispo", "cispo_trl", "sapo", "gmpo"]


@pytest.mark.parametrize("name", ["ppo_clip", "gspo", "gspo_token"] + NEW_LOSSES)
def test_shared_signature_stop_gradients_and_broadcast(name):
  fn = POLICY_LOSSES.get(name)
  old_logp = _random(9) - 2.0
  logp = old_logp + _random(10, scale=0.1)
  adv = _random(11, (N,))
  kw = SHARED_KW.get(name, dict(eps_low=0.2, eps_high=0.28, dual_clip=3.0))
  per_seq, m_seq = fn(logp, old_logp, adv, MASK, **kw)
  per_tok, m_tok = fn(logp, old_logp, jnp.broadcast_to(adv[:, None], (N, T)), MASK, **kw)
  np.testing.assert_allclose(per_seq, per_tok, rtol=1e-6)
  assert {"clip_frac", "dual_clip_frac", "ratio_mean", "approx_kl"} <= set(m_seq)
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


def _value_and_grad(fn, logp, old, adv, mask, **kw):
  def total(lp):
    per_token, metrics = fn(lp, old, adv, mask, **kw)
    return per_token.sum(), metrics
  return jax.jit(jax.value_and_grad(total, has_aux=True))(logp)


def test_cispo_verl_clips_the_weight_and_keeps_every_gradient():
  ratios, advs = [1.5, 0.5, 1.1, 0.9], [1.0, -1.0, -1.0, 1.0]
  logp, old, adv, mask = _one_token_rows(ratios, advs)
  (value, metrics), grad = _value_and_grad(cispo_loss, logp, old, adv, mask, eps_low=0.2, eps_high=0.2)
  # Weights clip(r, 0.8, 1.2) = [1.2, 0.8, 1.1, 0.9]; d(-sg[w] A logp)/dlogp = -w A, also on clipped tokens.
  w = np.array([1.2, 0.8, 1.1, 0.9])
  np.testing.assert_allclose(grad[:, 0], [-1.2, 0.8, 1.1, -0.9], rtol=1e-6)
  np.testing.assert_array_equal(grad[:, 1], 0.0)
  np.testing.assert_allclose(value, np.sum(-w * np.array(advs) * (-1.0 + np.log(ratios))), rtol=1e-6)
  np.testing.assert_allclose(metrics["clip_frac"], 2 / 4)
  np.testing.assert_allclose(metrics["ratio_mean"], np.mean(ratios), rtol=1e-6)
  # Default eps_low = 1.0: no lower clip, so the 0.5 ratio keeps its weight.
  (_, metrics), grad = _value_and_grad(cispo_loss, logp, old, adv, mask)
  np.testing.assert_allclose(grad[:, 0], [-1.2, 0.5, 1.1, -0.9], rtol=1e-6)
  np.testing.assert_allclose(metrics["clip_frac"], 1 / 4)


def test_cispo_trl_caps_at_an_absolute_eps_high_and_dual_clip_caps_negative_weights():
  ratios, advs = [0.5, 2.0, 7.0, 7.0], [1.0, 1.0, 1.0, -1.0]
  logp, old, adv, mask = _one_token_rows(ratios, advs)
  (value, metrics), grad = _value_and_grad(cispo_trl_loss, logp, old, adv, mask, eps_high=5.0)
  w = np.array([0.5, 2.0, 5.0, 5.0])  # min(r, 5): no lower clip, and 2.0 is not clipped (absolute cap)
  np.testing.assert_allclose(grad[:, 0], [-0.5, -2.0, -5.0, 5.0], rtol=1e-6)
  np.testing.assert_allclose(value, np.sum(-w * np.array(advs) * (-1.0 + np.log(ratios))), rtol=1e-6)
  np.testing.assert_allclose(metrics["clip_frac"], 2 / 4)
  np.testing.assert_allclose(metrics["dual_clip_frac"], 0.0)
  (_, metrics), grad = _value_and_grad(cispo_trl_loss, logp, old, adv, mask, eps_high=5.0, dual_clip=3.0)
  np.testing.assert_allclose(grad[:, 0], [-0.5, -2.0, -5.0, 3.0], rtol=1e-6)
  np.testing.assert_allclose(metrics["dual_clip_frac"], 1 / 4)
  # verl's cispo with the same numbers treats eps_high as relative: the 2.0 ratio is capped at 1.2.
  (_, _), grad = _value_and_grad(cispo_loss, logp, old, adv, mask, eps_high=0.2)
  np.testing.assert_allclose(grad[:, 0], [-0.5, -1.2, -1.2, 1.2], rtol=1e-6)


def test_sapo_soft_gate_value_and_gradient():
  ratios, advs = [1.0, 1.0, 1.6, 0.7, 3.0, 1.2], [1.0, -1.0, 1.0, -2.0, -1.0, 0.0]
  logp, old, adv, mask = _one_token_rows(ratios, advs)
  (value, metrics), grad = _value_and_grad(sapo_loss, logp, old, adv, mask)
  r, a = np.array(ratios, np.float64), np.array(advs, np.float64)
  tau = np.where(a > 0, 1.0, 1.05)  # A <= 0 uses tau_neg
  sig = 1 / (1 + np.exp(-tau * (r - 1)))
  np.testing.assert_allclose(value, np.sum(-(4 / tau) * sig * a), rtol=1e-6)
  # d/dlogp of -(4/tau) sigmoid(tau (r - 1)) A = -4 sigma (1 - sigma) r A.
  np.testing.assert_allclose(grad[:, 0], -4 * sig * (1 - sig) * r * a, rtol=1e-5, atol=1e-7)
  # On-policy by hand: value -(4 / tau) A / 2 = [-2, 2 / 1.05], gradient -A (PPO's).
  np.testing.assert_allclose(grad[:2, 0], [-1.0, 1.0], rtol=1e-6)
  per_token, _ = sapo_loss(logp, old, adv, mask)
  np.testing.assert_allclose(per_token[:2, 0], [-2.0, 2 / 1.05], rtol=1e-6)
  np.testing.assert_array_equal(per_token[:, 1], 0.0)
  np.testing.assert_allclose(metrics["gate_weight_mean"], np.mean(4 * sig * (1 - sig)), rtol=1e-5)
  np.testing.assert_allclose(metrics["clip_frac"], 0.0)
  # A larger tau_neg damps the far off-policy negative token more.
  (_, _), grad_hot = _value_and_grad(sapo_loss, logp, old, adv, mask, tau_neg=3.0)
  assert abs(grad_hot[4, 0]) < 0.5 * abs(grad[4, 0])


def test_gmpo_matches_hand_computed_case():
  # Row 0: A = +1, log-ratios [0.5, -0.1] -> [0.4, -0.1]; row 1: A = -2, [-0.6, 0.3, 0.6] -> [-0.4, 0.3, 0.6].
  mask = jnp.array([[True, True, False], [True, True, True]])
  old = jnp.full((2, 3), -1.0).at[0, 2].set(jnp.nan)
  logp = old + jnp.array([[0.5, -0.1, 0.0], [-0.6, 0.3, 0.6]])
  logp = logp.at[0, 2].set(-jnp.inf)
  adv = jnp.array([1.0, -2.0])
  rho0, rho1 = np.exp(0.15), np.exp(0.5 / 3)

  def loss(lp, **kw):
    per_token, metrics = gmpo_loss(lp, old, adv, mask, **kw)
    return aggregate(per_token, mask, "seq-mean-token-mean"), metrics

  (value, metrics), grad = jax.jit(jax.value_and_grad(loss, has_aux=True))(logp)
  np.testing.assert_allclose(value, 0.5 * (-rho0 + 2 * rho1), rtol=1e-6)
  # d(-A rho_i)/dlogp_it = -A rho_i / |o_i| on unclipped tokens, times 1/S = 1/2; clipped tokens get 0.
  np.testing.assert_allclose(grad, [[0.0, -rho0 / 4, 0.0], [0.0, rho1 / 3, rho1 / 3]], rtol=1e-6)
  np.testing.assert_allclose(metrics["clip_frac"], 2 / 5)
  np.testing.assert_allclose(metrics["ratio_mean"], (2 * rho0 + 3 * rho1) / 5, rtol=1e-6)
  # Dual clip c = 1.1 caps row 1's loss 2 rho1 = 2.36 at -c A = 2.2 and stops its gradient.
  (value, metrics), grad = jax.jit(jax.value_and_grad(lambda lp: loss(lp, dual_clip=1.1), has_aux=True))(logp)
  np.testing.assert_allclose(value, 0.5 * (-rho0 + 2.2), rtol=1e-6)
  np.testing.assert_allclose(grad[1], 0.0)
  np.testing.assert_allclose(metrics["dual_clip_frac"], 3 / 5)


def test_gmpo_equals_verl_formula_with_token_advantages():
  old_logp = _random(12) - 2.0
  logp = old_logp + _random(13, scale=0.5)
  adv = np.where(np.random.default_rng(14).random((N, T)) < 0.2, 0.0, _random(15))  # some A == 0 tokens
  per_token, metrics = jax.jit(lambda lp: gmpo_loss(lp, old_logp, adv, MASK, eps_low=0.3, eps_high=0.2))(logp)
  # verl compute_policy_loss_geo_mean, transcribed: sgn * min(sgn * lr, sgn * clamp(lr)), sequence mean A.
  lr = (logp - old_logp).astype(np.float64)
  sgn = np.sign(adv)
  lr_min = sgn * np.minimum(sgn * lr, sgn * np.clip(lr, -0.3, 0.2))
  n = MASK.sum(-1)
  ratio = np.exp((lr_min * MASK).sum(-1) / n)
  a_bar = (adv * MASK).sum(-1) / n
  np.testing.assert_allclose(aggregate(per_token, MASK, "seq-mean-token-mean"), np.mean(-a_bar * ratio), rtol=1e-5)
  clipped = (lr_min != lr) & MASK & (adv != 0)  # A == 0 tokens leave the ratio (lr -> 0), not clipped
  np.testing.assert_allclose(metrics["clip_frac"], clipped.sum() / MASK.sum(), rtol=1e-6)


@pytest.mark.parametrize("name", NEW_LOSSES)
@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean"])
def test_new_losses_on_policy_gradient_equals_ppo(name, mode):
  # At ratio 1 nothing is clipped and every loss reduces to REINFORCE: the gradient of ppo_clip.
  logp = _random(16) - 2.0
  old_logp = jnp.array(logp)
  adv = _random(17, (N,))
  kw = SHARED_KW.get(name, {})
  grad_fn = jax.jit(jax.grad(_loss_fn(POLICY_LOSSES.get(name), old_logp, adv, mode, **kw)))
  expected = jax.jit(jax.grad(_loss_fn(ppo_clip_loss, old_logp, adv, mode)))(logp)
  np.testing.assert_allclose(grad_fn(logp), expected, rtol=1e-5, atol=1e-7)
  assert np.abs(np.asarray(expected)).max() > 1e-3
  _, metrics = POLICY_LOSSES.get(name)(logp, old_logp, adv, MASK, **kw)
  np.testing.assert_allclose(metrics["clip_frac"], 0.0)
  np.testing.assert_allclose(metrics["ratio_mean"], 1.0, rtol=1e-6)
  np.testing.assert_allclose(metrics["approx_kl"], 0.0, atol=1e-7)


@pytest.mark.parametrize("name", NEW_LOSSES)
def test_new_losses_ignore_garbage_on_padding(name):
  fn = POLICY_LOSSES.get(name)
  old_logp = _random(18) - 2.0
  logp = old_logp + _random(19, scale=0.3)
  adv = _random(20, (N,))
  pad = ~MASK
  bad_logp = np.where(pad, -np.inf, logp).astype(np.float32)
  bad_logp[1, -1], bad_logp[2, -1] = np.nan, np.inf  # rows 1 and 2 are padded at the end
  bad_old = np.where(pad, 1e30, old_logp).astype(np.float32)
  kw = SHARED_KW.get(name, {})

  def total(lp, olp):
    per_token, metrics = fn(lp, olp, adv, MASK, **kw)
    return aggregate(per_token, MASK, "token-mean"), metrics

  (clean, m_clean), g_clean = jax.jit(jax.value_and_grad(total, has_aux=True))(logp, old_logp)
  (value, m_bad), grad = jax.jit(jax.value_and_grad(total, has_aux=True))(bad_logp, bad_old)
  assert np.isfinite(value) and np.all(np.isfinite(grad))
  np.testing.assert_allclose(value, clean, rtol=1e-6)
  np.testing.assert_allclose(grad, g_clean, rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(grad)[pad], 0.0)
  for k in m_clean:
    np.testing.assert_allclose(m_bad[k], m_clean[k], rtol=1e-6)


def test_new_losses_refuse_bad_settings():
  x = jnp.zeros((1, 1))
  with pytest.raises(ValueError, match="absolute"):
    cispo_trl_loss(x, x, x[:, 0], x > -1, eps_high=0.28)
  with pytest.raises(ValueError, match="dual_clip"):
    sapo_loss(x, x, x[:, 0], x > -1, dual_clip=3.0)
  with pytest.raises(ValueError, match="temperatures"):
    sapo_loss(x, x, x[:, 0], x > -1, tau_neg=0.0)
  with pytest.raises(ValueError, match="eps_low"):
    gmpo_loss(x, x, x[:, 0], x > -1, eps_low=-0.1)
  with pytest.raises(ValueError, match="dual_clip"):
    cispo_loss(x, x, x[:, 0], x > -1, dual_clip=0.5)
