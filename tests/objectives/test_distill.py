"""On-policy distillation's maths: a teacher equal to the student gives zero loss and zero gradient; the
sampled-token estimator's expectation (and its gradient's) is the exact reverse KL on a small vocabulary; the
divergences against hand computation; JSD(β) at and near its ends; the top-k support renormalises and reports
the kept mass."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.objectives import distill as D
from rlkit.objectives.loss_terms import LOSS_TERMS

V = 6


def _logits(seed, shape=(3, 4, V)):
  return jax.random.normal(jax.random.key(seed), shape) * 1.5


def _cfg(**distill):
  d = {"teacher": "teacher", "top_k": 0, "beta": 0.5, **distill}
  return types.SimpleNamespace(distill=types.SimpleNamespace(**d), temperature=1.0)


def _batch(teacher_logits, mask, top_k=0, sampled=None):
  extras = {f"teacher_dist_{k[len('dist_'):]}": v for k, v in D.teacher_distribution(teacher_logits, 1.0,
                                                                                          top_k).items()}
  if sampled is not None:
    extras["teacher_logp"] = sampled
  return types.SimpleNamespace(extras=extras, loss_mask=mask)


STEP = {"num_tokens": jnp.asarray(12.0)}


@pytest.mark.parametrize("name", ["opd", *D.DIVERGENCES])
def test_a_teacher_equal_to_the_student_gives_zero_loss_and_zero_gradient(name):
  logits, mask = _logits(0), jnp.ones((3, 4), bool)
  tokens = jnp.zeros((3, 4), jnp.int32) + 2
  term = LOSS_TERMS.get(name)(_cfg())

  def loss(lg):
    logp = jnp.take_along_axis(jax.nn.log_softmax(lg), tokens[..., None], -1)[..., 0]
    batch = _batch(jax.lax.stop_gradient(lg), mask, sampled=jax.lax.stop_gradient(logp))
    per_tok, _ = term(logp, lg, batch, STEP)
    return jnp.sum(per_tok)
  value, grad = jax.value_and_grad(loss)(logits)
  assert abs(float(value)) < 1e-6
  np.testing.assert_allclose(grad, 0.0, atol=1e-6)


def test_the_sampled_token_estimator_is_the_reverse_kl_in_expectation_and_in_gradient():
  student, teacher = _logits(1, (V,)), _logits(2, (V,))
  exact = D.divergence("reverse_kl", jax.nn.log_softmax(student), jax.nn.log_softmax(teacher))
  y = jax.random.categorical(jax.random.key(3), student, shape=(200_000,))

  def estimate(lg):                     # -E[a log p_S(y)], a = sg(log p_T - log p_S): the `opd` term's loss
    logp = jax.nn.log_softmax(lg)[y]
    adv = D.opd_token_advantage(logp, jax.nn.log_softmax(teacher)[y], jnp.ones_like(logp, bool))
    return jnp.mean(-adv * logp), jnp.mean(-adv)
  (_, kl_sampled), grad = jax.value_and_grad(estimate, has_aux=True)(student)
  exact_grad = jax.grad(lambda lg: D.divergence("reverse_kl", jax.nn.log_softmax(lg),
                                                jax.nn.log_softmax(teacher)))(student)
  np.testing.assert_allclose(kl_sampled, exact, rtol=0.02)
  np.testing.assert_allclose(grad, exact_grad, atol=0.02 * float(jnp.abs(exact_grad).max()))


def test_divergences_match_hand_computation():
  p, q = np.array([0.5, 0.3, 0.2]), np.array([0.2, 0.2, 0.6])
  lp, lq = jnp.log(p), jnp.log(q)
  rev, fwd = np.sum(p * np.log(p / q)), np.sum(q * np.log(q / p))
  np.testing.assert_allclose(D.divergence("reverse_kl", lp, lq), rev, rtol=1e-6)
  np.testing.assert_allclose(D.divergence("forward_kl", lp, lq), fwd, rtol=1e-6)
  beta = 0.3
  m = beta * q + (1 - beta) * p
  jsd = beta * np.sum(q * np.log(q / m)) + (1 - beta) * np.sum(p * np.log(p / m))
  np.testing.assert_allclose(D.divergence("jsd", lp, lq, beta), jsd, rtol=1e-6)


def test_jsd_is_forward_kl_at_beta_0_and_reverse_kl_at_beta_1_and_tends_to_them():
  s, t = jax.nn.log_softmax(_logits(4, (V,))), jax.nn.log_softmax(_logits(5, (V,)))
  fwd, rev = D.divergence("forward_kl", s, t), D.divergence("reverse_kl", s, t)
  np.testing.assert_allclose(D.generalized_jsd(s, t, 0.0), fwd, rtol=1e-6)
  np.testing.assert_allclose(D.generalized_jsd(s, t, 1.0), rev, rtol=1e-6)
  eps = 1e-3                             # the scaled divergence is continuous at both ends
  np.testing.assert_allclose(D.generalized_jsd(s, t, eps) / eps, fwd, rtol=2e-2)
  np.testing.assert_allclose(D.generalized_jsd(s, t, 1 - eps) / eps, rev, rtol=2e-2)


def test_top_k_renormalises_both_on_the_teachers_support_and_reports_its_mass():
  student, teacher = _logits(6, (2, V)), _logits(7, (2, V))
  dist = D.teacher_distribution(teacher, 1.0, 3)
  s, t, mass = D.on_teacher_support(student, dist["dist_logp"], dist["dist_ids"], 1.0)
  full_t = jax.nn.softmax(teacher)
  top = np.argsort(-np.asarray(full_t), axis=-1)[:, :3]
  np.testing.assert_array_equal(np.sort(dist["dist_ids"], -1), np.sort(top, -1))
  np.testing.assert_allclose(mass, np.take_along_axis(np.asarray(full_t), top, -1).sum(-1), rtol=1e-6)
  np.testing.assert_allclose(jnp.exp(s).sum(-1), 1.0, rtol=1e-6)
  np.testing.assert_allclose(jnp.exp(t).sum(-1), 1.0, rtol=1e-6)
  ps = np.asarray(jax.nn.softmax(student))
  gathered = np.take_along_axis(ps, np.asarray(dist["dist_ids"]), -1)
  np.testing.assert_allclose(jnp.exp(s), gathered / gathered.sum(-1, keepdims=True), rtol=1e-5)   # the ratios kept
  with pytest.raises(ValueError, match="unknown"):
    D.divergence("kl", s, t)


def test_the_divergence_terms_report_their_value_and_the_kept_mass():
  logits, teacher = _logits(8), _logits(9)
  mask = jnp.asarray(np.arange(12).reshape(3, 4) % 3 != 0)
  per_tok, metrics = LOSS_TERMS.get("forward_kl")(_cfg(top_k=2))(None, logits, _batch(teacher, mask, 2), STEP)
  assert per_tok.shape == (3, 4) and set(metrics) == {"distill/forward_kl", "distill/teacher_mass"}
  expected = float(jnp.sum(jnp.where(mask, per_tok, 0.0)) / 12.0)
  np.testing.assert_allclose(metrics["distill/forward_kl"].value, expected, rtol=1e-6)


@pytest.mark.parametrize("name", D.DIVERGENCES)
def test_across_tokenizers_a_divergence_counts_the_aligned_positions_only(name):
  """With `distill.cross_tokenizer` the term reads the aligned mask: an unaligned position adds nothing
  whatever the teacher holds there, an aligned one is the divergence on the given support, renormalised."""
  logits, mask = _logits(3), jnp.ones((3, 4), bool)
  batch = _batch(_logits(4), mask, top_k=3)
  aligned = jnp.asarray(np.random.default_rng(0).random((3, 4)) < 0.5)
  batch.extras["teacher_xtok_aligned"] = aligned
  cross, _ = LOSS_TERMS.get(name)(_cfg(cross_tokenizer="aligned"))(None, logits, batch, STEP)
  plain, _ = LOSS_TERMS.get(name)(_cfg())(None, logits, batch, STEP)
  assert 0 < aligned.sum() < aligned.size
  np.testing.assert_array_equal(np.asarray(cross)[~np.asarray(aligned)], 0.0)
  np.testing.assert_allclose(np.asarray(cross)[np.asarray(aligned)], np.asarray(plain)[np.asarray(aligned)])
  assert (np.asarray(plain) > 0).all()
