"""Self-Retrospection Distillation (SRD): the policy learns from itself shown hindsight (methods/llm.md §4;
the method as specified there is OUR DESIGN: the paper, arXiv 2610.08077, is known to us second-hand only).

After an episode is complete, the same model, shown what it could not know while acting (the episode's
hindsight and the gold answer, rlkit/train/srd.py), is a retrospective teacher; the student acts without it:

  teacher   log p_T(y_t) = log π_θ(y_t | x ⊕ z ⊕ y_<t)     (z: the hindsight block; stop-gradient: a scorer)
  student   log p_S(y_t) = log π_θ(y_t | x ⊕ y_<t)          (the policy, differentiated)

on the student's own action tokens y_t (the loss mask: observations are never trained). Two loss terms
(registry LOSS_TERMS, weights `rl.loss_terms.srd`, `rl.loss_terms.srd_jsd`), each times a row weight:

  srd       A^srd_t = sg(log p_T(y_t) − log p_S(y_t)), the sampled-token estimate of −KL(p_S‖p_T) (OPD's,
            `rlkit.objectives.distill`), in policy-gradient form: loss_t = −w_row · A^srd_t · log p_S(y_t),
            whose gradient is w_row · ∇KL(p_S‖p_T) in expectation (the score-function estimator)
  srd_jsd   loss_t = w_row · JSD_β(p_S(·|t) ‖ p_T(·|t)) on the teacher's top-k support, both renormalised
            there (`generalized_jsd`, `on_teacher_support`); the released method's JSD auxiliary loss

Row weights (OUR DESIGN): the auxiliary signal is strongest exactly where the RL gradient vanishes. SRD runs
after the advantage phase, so a row's group is "zero-variance" when every advantage of the group's loss
tokens has |A| <= tol: whatever the estimator, the policy-gradient term gives these rows nothing.

  w_row = weight_hi   if the row's group is zero-variance
          weight_lo   otherwise

The terms add to whichever policy loss the stage runs (and its correction's token weights, which multiply
every term), so SRD composes with every policy loss, correction and advantage estimator. A term of weight 0
(and no weight schedule) is off: the scorer does not run, and the term adds zeros.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rlkit.objectives.distill import generalized_jsd, on_teacher_support, opd_token_advantage
from rlkit.objectives.loss_terms import LOSS_TERMS, token_mean

Array = jax.Array

# What the `hindsight` scorer (rlkit/train/srd.py) writes to TrainBatch.extras, and the terms read.
TEACHER_LOGP = "hindsight_logp"             # [N, R] the teacher's log-probs of the sampled tokens
TEACHER_DIST_LOGP = "hindsight_dist_logp"   # [N, R, k] the teacher's top-k log-probs (srd_jsd)
TEACHER_DIST_IDS = "hindsight_dist_ids"     # [N, R, k] their token ids
ROW_WEIGHT = "srd_weight"                   # [N] w_row
TERMS = ("srd", "srd_jsd")


def zero_variance_rows(advantages: Array, loss_mask: Array, group_size: int, tol: float = 1e-6) -> Array:
  """[N] bool: the rows of groups (`group_size` contiguous rows) in which every |advantage| on a loss token is
  <= `tol` (a row without loss tokens has no signal, so a group of padding rows is zero-variance too).

  :param advantages: [N, R] per-token advantages, after the advantage phase.
  :param loss_mask: [N, R] bool, the trained tokens.
  """
  signal = jnp.any(loss_mask & (jnp.abs(advantages) > tol), axis=-1)
  flat = ~jnp.any(signal.reshape(-1, group_size), axis=-1)
  return jnp.repeat(flat, group_size)


def row_weights(zero_var: Array, weight_hi: float, weight_lo: float) -> Array:
  """[N] float32 w_row: `weight_hi` on zero-variance rows, `weight_lo` elsewhere."""
  return jnp.where(zero_var, weight_hi, weight_lo).astype(jnp.float32)


def srd_token_advantage(teacher_logp: Array, student_logp: Array, mask: Array) -> Array:
  """A^srd = sg(log p_T − log p_S) on the masked tokens, 0 elsewhere ([N, R])."""
  return opd_token_advantage(student_logp, teacher_logp, mask)


def srd_jsd(student_logits: Array, teacher_logp: Array, teacher_ids: Array, temperature: float,
            beta: float) -> tuple[Array, Array]:
  """(JSD_β per position [N, R], the teacher's kept top-k mass [N, R]) between the student's distribution at
  `temperature` and the teacher's top-k (`teacher_logp`, `teacher_ids` [N, R, k]), both renormalised on the
  teacher's support; gradients reach the student's logits only."""
  student, teacher, mass = on_teacher_support(student_logits, jax.lax.stop_gradient(teacher_logp), teacher_ids,
                                              temperature)
  return generalized_jsd(student, teacher, beta), mass


@LOSS_TERMS.register("srd")
def srd_term(cfg):
  """−w_row · sg(log p_T − log p_S) · log p_S on the sampled tokens, p_T the hindsight teacher."""
  del cfg

  def term(logp, logits, batch, step_inputs):
    del logits
    if TEACHER_LOGP not in batch.extras:      # weight 0: the scorer is off, and so is the term
      return jnp.zeros_like(logp), {}
    mask = batch.loss_mask
    adv = srd_token_advantage(batch.extras[TEACHER_LOGP], logp, mask)
    weight = jax.lax.stop_gradient(batch.extras[ROW_WEIGHT])[:, None]
    return -weight * adv * logp, {"srd/reverse_kl_sampled": token_mean(-adv, mask, step_inputs)}
  return term


@LOSS_TERMS.register("srd_jsd")
def srd_jsd_term(cfg):
  """w_row · JSD_β(student ‖ hindsight teacher) per token, on the teacher's top-k (β = `srd.beta`)."""
  beta, temperature = float(cfg.srd.beta), cfg.temperature

  def term(logp, logits, batch, step_inputs):
    del logp
    if TEACHER_DIST_LOGP not in batch.extras:   # weight 0: the scorer is off, and so is the term
      return jnp.zeros(logits.shape[:-1], jnp.float32), {}
    per_tok, mass = srd_jsd(logits, batch.extras[TEACHER_DIST_LOGP], batch.extras[TEACHER_DIST_IDS], temperature,
                            beta)
    weight = jax.lax.stop_gradient(batch.extras[ROW_WEIGHT])[:, None]
    mask = batch.loss_mask
    return weight * per_tok, {"srd/jsd": token_mean(per_tok, mask, step_inputs),
                              "srd/teacher_mass": token_mean(mass, mask, step_inputs)}
  return term
