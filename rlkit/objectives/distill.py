"""On-policy distillation (OPD): the student learns on its own samples from a teacher's per-token feedback
(methods/llm.md §6; GKD, arXiv 2306.13649 / TRL's GKDTrainer; Thinking Machines' "On-Policy Distillation").

Two forms, both reading the teacher as scored in the scoring phase (never inside the student's gradient):

  sampled token   a_t = sg(log p_T(y_t) − log p_S(y_t)): the negative reverse KL at the sampled token, an
                  advantage with discount 0. Its expectation under the student's own samples is −KL(p_S‖p_T)
                  per position, and −E[a_t ∇log p_S(y_t)] is ∇KL(p_S‖p_T) (the score-function estimator), so the
                  loss term `opd` = −a_t·log p_S(y_t) descends the reverse KL with one log-prob per token; the
                  advantage `opd` (rlkit/train/distill.py) feeds the same a_t, plus λ times the RL advantage,
                  to the clipped surrogate instead (importance-corrected like any PPO update).
  full distribution  per position, over the vocabulary (or the teacher's top-k), with both distributions at
                  the sampling temperature:
                    reverse_kl  KL(p_S‖p_T) = Σ p_S (log p_S − log p_T)     exact, mode-seeking
                    forward_kl  KL(p_T‖p_S) = Σ p_T (log p_T − log p_S)     mass-covering (supervised KD)
                    jsd         β KL(p_T‖M) + (1−β) KL(p_S‖M), M = β p_T + (1−β) p_S; β = 0 is forward KL and
                                β = 1 reverse KL exactly (TRL's convention: its ends are special-cased, and
                                JSD_β/β → forward KL as β → 0, JSD_β/(1−β) → reverse KL as β → 1)

Top-k: with `distill.top_k = k > 0` the teacher keeps its k most likely tokens per position; both distributions
are renormalised on that support (the student's log-probs gathered at the teacher's ids), and the teacher's kept
mass is logged (`distill/teacher_mass`), so a user sees how much of the teacher the loss ignores. Across
tokenizers (`distill.cross_tokenizer`, rlkit/objectives/xtok.py) the terms act at the strictly aligned
positions only, on the vocabulary both tokenizers share, which rlkit/train/distill.py supplies as the support.

Each divergence is a loss term (registry LOSS_TERMS, `rl.loss_terms.<name> = weight`): a weight λ mixes it with
the RL policy loss of the same update.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from rlkit.objectives.loss_terms import LOSS_TERMS, token_mean

Array = jax.Array
DIVERGENCES = ("reverse_kl", "forward_kl", "jsd")


def opd_token_advantage(student_logp: Array, teacher_logp: Array, mask: Array) -> Array:
  """a_t = sg(log p_T − log p_S) on the sampled tokens, 0 where masked."""
  return jax.lax.stop_gradient(jnp.where(mask, teacher_logp - student_logp, 0.0))


def _kl(logp: Array, logq: Array) -> Array:
  """KL(p‖q) over the last axis from log-probs; 0·log 0 = 0 where p has no mass."""
  p = jnp.exp(logp)
  return jnp.sum(jnp.where(p > 0, p * (logp - logq), 0.0), axis=-1)


def generalized_jsd(student_logp: Array, teacher_logp: Array, beta: float) -> Array:
  """JSD_β over the last axis (module docstring); β = 0 and β = 1 are forward and reverse KL."""
  if beta == 0.0:
    return _kl(teacher_logp, student_logp)
  if beta == 1.0:
    return _kl(student_logp, teacher_logp)
  mix = jnp.logaddexp(student_logp + jnp.log1p(-beta), teacher_logp + jnp.log(beta))
  return beta * _kl(teacher_logp, mix) + (1.0 - beta) * _kl(student_logp, mix)


def divergence(name: str, student_logp: Array, teacher_logp: Array, beta: float = 0.5) -> Array:
  """Per-position divergence `name` of DIVERGENCES between two [..., V] log-prob arrays."""
  if name == "reverse_kl":
    return _kl(student_logp, teacher_logp)
  if name == "forward_kl":
    return _kl(teacher_logp, student_logp)
  if name == "jsd":
    return generalized_jsd(student_logp, teacher_logp, beta)
  raise ValueError(f"divergence: unknown {name!r}; known: {list(DIVERGENCES)}.")


def on_teacher_support(student_logits: Array, teacher_logp: Array, teacher_ids: Optional[Array],
                       temperature: float) -> tuple[Array, Array, Array]:
  """(student log-probs, teacher log-probs, the teacher's kept mass [...]) on one support: the whole vocabulary
  (teacher_ids None: teacher_logp is [..., V]) or the teacher's top-k ids (both renormalised there)."""
  student = jax.nn.log_softmax(student_logits.astype(jnp.float32) / temperature, axis=-1)
  if teacher_ids is None:
    return student, teacher_logp, jnp.ones(teacher_logp.shape[:-1], jnp.float32)
  gathered = jnp.take_along_axis(student, teacher_ids, axis=-1)
  mass = jnp.exp(jax.nn.logsumexp(teacher_logp, axis=-1))
  return (jax.nn.log_softmax(gathered, axis=-1), jax.nn.log_softmax(teacher_logp, axis=-1), mass)


def teacher_distribution(logits: Array, temperature: float, top_k: int) -> dict:
  """What the scoring phase stores of the teacher ([N, R, V] logits at the response positions): `dist_logp`
  [N, R, V] (top_k 0) or the top-k log-probs [N, R, k] with their ids `dist_ids` (not renormalised: their
  total is the kept mass)."""
  logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
  if not top_k:
    return {"dist_logp": logp}
  values, ids = jax.lax.top_k(logp, top_k)
  return {"dist_logp": values, "dist_ids": ids.astype(jnp.int32)}


def _divergence_term(name: str):
  def make(cfg):
    d = cfg.distill
    logp_key, ids_key = f"{d.teacher}_dist_logp", f"{d.teacher}_dist_ids"
    # A teacher with another tokenizer: only the strictly aligned positions, on the shared vocabulary
    # (rlkit/train/distill.py stores it as a top-k support; its kept mass is logged there, per aligned token).
    aligned_key = f"{d.teacher}_xtok_aligned" if getattr(d, "cross_tokenizer", "") else None

    def term(logp, logits, batch, step_inputs):
      del logp
      student, teacher, mass = on_teacher_support(logits, batch.extras[logp_key], batch.extras.get(ids_key),
                                                  cfg.temperature)
      per_tok = divergence(name, student, teacher, d.beta)
      if aligned_key:
        per_tok = jnp.where(batch.extras[aligned_key], per_tok, 0.0)
      metrics = {f"distill/{name}": token_mean(per_tok, batch.loss_mask, step_inputs)}
      if ids_key in batch.extras and not aligned_key:
        metrics["distill/teacher_mass"] = token_mean(mass, batch.loss_mask, step_inputs)
      return per_tok, metrics
    return term
  make.__doc__ = f"`{name}` between the student and `distill.teacher` over the vocabulary or its top-k."
  return make


for _name in DIVERGENCES:
  LOSS_TERMS.register(_name)(_divergence_term(_name))


@LOSS_TERMS.register("opd")
def opd_term(cfg):
  """−sg(log p_T − log p_S)·log p_S on the sampled tokens: the reverse KL's score-function gradient."""
  key = f"{cfg.distill.teacher}_logp"

  def term(logp, logits, batch, step_inputs):
    del logits
    adv = opd_token_advantage(logp, batch.extras[key], batch.loss_mask)
    return -adv * logp, {"distill/reverse_kl_sampled": token_mean(-adv, batch.loss_mask, step_inputs)}
  return term
