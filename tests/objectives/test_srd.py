"""Self-Retrospection Distillation's maths (rlkit/objectives/srd.py): zero-variance groups from the advantages,
the row weights, the sampled-token advantage (zero where teacher and student agree), the `srd` term's
gradient (the reverse KL's score-function estimator, through the student only), and the `srd_jsd` term
(zero on equal distributions, positive otherwise, gradients into the student's logits only)."""
import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.objectives import srd as S
from rlkit.objectives.distill import teacher_distribution
from rlkit.objectives.loss_terms import LOSS_TERMS

V, K = 7, 4
STEP = {"num_tokens": jnp.asarray(12.0)}


def _cfg(beta=0.5):
  return types.SimpleNamespace(srd=types.SimpleNamespace(beta=beta), temperature=1.0)


def _batch(teacher_logits, mask, weight, top_k=K):
  dist = teacher_distribution(teacher_logits, 1.0, top_k)
  logp = jax.nn.log_softmax(teacher_logits, -1)
  return types.SimpleNamespace(loss_mask=mask, extras={
      S.TEACHER_LOGP: logp[..., 0], S.TEACHER_DIST_LOGP: dist["dist_logp"], S.TEACHER_DIST_IDS: dist["dist_ids"],
      S.ROW_WEIGHT: jnp.asarray(weight, jnp.float32)})


def test_zero_variance_rows_are_the_groups_without_advantage_on_their_loss_tokens():
  adv = np.zeros((6, 3), np.float32)
  mask = np.ones((6, 3), bool)
  adv[1, 2] = 0.5                      # group 0 (rows 0-1) has a signal
  adv[3, 0] = 1e-7                     # group 1: below the tolerance
  adv[5, 1], mask[5, 1] = 2.0, False   # group 2: a signal on a masked token only
  got = S.zero_variance_rows(jnp.asarray(adv), jnp.asarray(mask), 2, 1e-6)
  np.testing.assert_array_equal(got, [False, False, True, True, True, True])
  got = S.zero_variance_rows(jnp.asarray(adv), jnp.asarray(mask), 2, 1e-8)     # the tolerance acts
  np.testing.assert_array_equal(got, [False, False, False, False, True, True])
  got = S.zero_variance_rows(jnp.asarray(adv), jnp.asarray(mask), 3, 1e-6)     # groups of 3: one with signal
  np.testing.assert_array_equal(got, [False] * 3 + [True] * 3)


def test_row_weights():
  w = S.row_weights(jnp.asarray([True, False, True]), 1.0, 0.1)
  assert w.dtype == jnp.float32
  np.testing.assert_allclose(w, [1.0, 0.1, 1.0])


def test_the_srd_advantage_is_the_masked_stop_gradient_gap_and_zero_where_teacher_equals_student():
  student = jax.random.normal(jax.random.key(0), (3, 4)) - 2.0
  teacher = student.at[0].add(0.3)
  mask = jnp.ones((3, 4), bool).at[2, 3].set(False)
  adv = S.srd_token_advantage(teacher, student, mask)
  np.testing.assert_allclose(adv[0], 0.3, atol=1e-6)
  np.testing.assert_array_equal(adv[1:], 0.0)
  grad = jax.grad(lambda s: jnp.sum(S.srd_token_advantage(teacher, s, mask)))(student)
  np.testing.assert_array_equal(grad, 0.0)                               # stop-gradient


def test_the_srd_term_is_zero_for_an_equal_teacher_and_weighted_by_row_otherwise():
  logits = jax.random.normal(jax.random.key(1), (3, 4, V))
  logp = jax.nn.log_softmax(logits, -1)[..., 0]
  mask = jnp.ones((3, 4), bool)
  term = LOSS_TERMS.get("srd")(_cfg())
  batch = _batch(logits, mask, [1.0, 0.1, 0.0])
  loss, _ = term(logp, logits, batch, STEP)
  np.testing.assert_allclose(loss, 0.0, atol=1e-6)
  assert np.all(np.asarray(jax.grad(lambda x: jnp.sum(term(x, logits, batch, STEP)[0]))(logp)) == 0)
  teacher = batch.extras[S.TEACHER_LOGP] + jnp.asarray([0.5, 0.5, 0.5])[:, None]
  batch.extras[S.TEACHER_LOGP] = teacher
  grad = jax.grad(lambda x: jnp.sum(term(x, logits, batch, STEP)[0]))(logp)
  # d/dlogp of −w·sg(t − s)·s is −w·(t − s): the teacher's gap, scaled by each row's weight
  np.testing.assert_allclose(grad, -jnp.asarray([1.0, 0.1, 0.0])[:, None] * 0.5 * jnp.ones((3, 4)), atol=1e-6)


def test_the_srd_term_descends_the_reverse_kl_in_expectation():
  """Σ_y p_S(y)·∇[−sg(log p_T − log p_S)·log p_S](y) = ∇KL(p_S‖p_T): the sampled form's exact expectation."""
  s_logits = jax.random.normal(jax.random.key(2), (V,))
  t_logp = jax.nn.log_softmax(jax.random.normal(jax.random.key(3), (V,)))
  term = LOSS_TERMS.get("srd")(_cfg())

  def expected(z):
    logp = jax.nn.log_softmax(z)                                         # every token as a [1, V] batch
    batch = types.SimpleNamespace(loss_mask=jnp.ones((1, V), bool),
                                  extras={S.TEACHER_LOGP: t_logp[None], S.ROW_WEIGHT: jnp.ones(1)})
    loss, _ = term(logp[None], None, batch, STEP)
    return jnp.sum(jax.lax.stop_gradient(jnp.exp(logp)) * loss[0])

  kl = lambda z: jnp.sum(jnp.exp(jax.nn.log_softmax(z)) * (jax.nn.log_softmax(z) - t_logp))
  np.testing.assert_allclose(jax.grad(expected)(s_logits), jax.grad(kl)(s_logits), atol=1e-5)


@pytest.mark.parametrize("beta", [0.0, 0.5, 1.0])
def test_the_jsd_term_is_zero_on_equal_distributions_and_positive_otherwise(beta):
  logits = jax.random.normal(jax.random.key(4), (3, 4, V)) * 2
  mask = jnp.ones((3, 4), bool)
  term = LOSS_TERMS.get("srd_jsd")(_cfg(beta))
  loss, m = term(None, logits, _batch(logits, mask, [1.0, 1.0, 1.0]), STEP)
  np.testing.assert_allclose(loss, 0.0, atol=1e-6)
  other = logits + jax.random.normal(jax.random.key(5), logits.shape)
  batch = _batch(other, mask, [1.0, 0.1, 0.0])
  loss, m = term(None, logits, batch, STEP)
  jsd, _ = S.srd_jsd(logits, batch.extras[S.TEACHER_DIST_LOGP], batch.extras[S.TEACHER_DIST_IDS], 1.0, beta)
  assert np.all(np.asarray(jsd) > 0)
  np.testing.assert_allclose(loss, jnp.asarray([1.0, 0.1, 0.0])[:, None] * jsd, rtol=1e-6)   # w_row · JSD
  assert 0 < float(m["srd/teacher_mass"].value) < 1                     # top-k keeps part of the teacher


def test_gradients_flow_through_the_student_only():
  s_logits = jax.random.normal(jax.random.key(6), (2, 3, V))
  t_logits = jax.random.normal(jax.random.key(7), (2, 3, V))
  mask = jnp.ones((2, 3), bool)
  term = LOSS_TERMS.get("srd_jsd")(_cfg())

  def loss(s, t_dist_logp):
    batch = _batch(t_logits, mask, [1.0, 1.0])
    batch.extras[S.TEACHER_DIST_LOGP] = t_dist_logp
    return jnp.sum(term(None, s, batch, STEP)[0])

  t_dist = teacher_distribution(t_logits, 1.0, K)["dist_logp"]
  g_student, g_teacher = jax.grad(loss, argnums=(0, 1))(s_logits, t_dist)
  assert np.abs(np.asarray(g_student)).max() > 0
  np.testing.assert_array_equal(g_teacher, 0.0)
  srd = LOSS_TERMS.get("srd")(_cfg())
  logp = jax.nn.log_softmax(s_logits, -1)[..., 0]

  def sampled(x, teacher):
    batch = types.SimpleNamespace(loss_mask=mask, extras={S.TEACHER_LOGP: teacher, S.ROW_WEIGHT: jnp.ones(2)})
    return jnp.sum(srd(x, None, batch, STEP)[0])

  g_student, g_teacher = jax.grad(sampled, argnums=(0, 1))(logp, logp - 0.3)
  assert np.abs(np.asarray(g_student)).max() > 0
  np.testing.assert_array_equal(g_teacher, 0.0)
