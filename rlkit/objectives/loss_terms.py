"""Loss terms: the pieces the update step sums into one per-token loss (registry `LOSS_TERMS`).

A loss term is built once from the stage config, `make(cfg) -> term`, and the term is a pure array function

  term(logp, logits, batch, step_inputs) -> (per-token loss [N, R], {name: Metric})

with `logp` [N, R] the differentiated log-probs of the batch's response tokens (under the sampler's
processing: temperature, top-k, top-p), `logits` [N, R, V] the raw logits that predict them, `batch` a
`TrainBatch`, and `step_inputs` a dict of traced scalars: the full batch's `num_tokens` / `num_seqs` (loss-mask
counts, for normalising metrics across micro-batches) and any per-step values a method passes in (an annealed
weight, a calibration scale) without recompiling the step. The step computes

  l_t  = sum_terms  step_inputs["weight/<term>"] * term_t           (weights: traced, default from config)
  loss = aggregate(l * token_weights, loss_mask, aggregation)

so a token with weight 0 contributes exactly what a masked token does, except that it stays in the attention
and in the normaliser. Metrics are `Metric`s: a "mean" metric's value is this slice's share of the full
batch's mean (divide by `step_inputs["num_tokens"]`), so micro-batches add up exactly.

Registered: `policy` (the clipped surrogate from `POLICY_LOSSES`), `kl` (penalty to the reference model,
weight `kl_beta`), `entropy` (bonus, weight `entropy_coef`, loss `-H`), `nll` (SFT's next-token
cross-entropy). A method adds its own (distillation, calibration, ...) with `LOSS_TERMS.register`.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable

import jax
import jax.numpy as jnp

from rlkit.core.registry import Registry
from rlkit.core.types import ROW_SOURCE, ROW_SOURCES, Metric
from rlkit.objectives.entropy import token_entropy
from rlkit.objectives.kl import kl_penalty
from rlkit.objectives.policy_losses import POLICY_LOSSES

Array = jax.Array
LossTerm = Callable[[Array, Array, Any, dict], tuple[Array, dict[str, Metric]]]

# name -> factory(cfg) -> LossTerm; cfg is the stage config section (read what the term needs from it).
LOSS_TERMS: Registry[Callable[[Any], LossTerm]] = Registry("loss term")

SFT_ONLY_TERMS = ("nll",)


def policy_loss_error(name: str, eps_low: float, eps_high: float, dual_clip: float, kwargs: dict) -> str:
  """'' if `POLICY_LOSSES[name]` accepts these settings, else its own message: each loss checks its ranges
  (CISPO takes eps_low >= 1 to switch its lower clip off, PPO needs eps_low < 1, SAPO refuses a dual clip),
  so the config is validated by tracing the loss once on a one-token batch."""
  error = policy_kwargs_error(name, kwargs)
  if error:
    return error
  clip = dict(eps_low=eps_low, eps_high=eps_high, **kwargs)
  if dual_clip:
    clip["dual_clip"] = dual_clip
  x, mask = jax.ShapeDtypeStruct((1, 1), jnp.float32), jax.ShapeDtypeStruct((1, 1), jnp.bool_)
  try:   # traced only (eval_shape): validation must not start the XLA backend before jax.distributed does
    jax.eval_shape(lambda a, b, c, m: POLICY_LOSSES.get(name)(a, b, c, m, **clip), x, x, x, mask)
  except (TypeError, ValueError) as e:
    return f"policy loss {name!r}: {e}"
  return ""


def policy_kwargs_error(name: str, kwargs: dict) -> str:
  """'' if `POLICY_LOSSES[name]` takes every key of `kwargs`, else a message naming the ones it does not."""
  params = inspect.signature(POLICY_LOSSES.get(name)).parameters
  own = [p for p, v in params.items() if v.kind == v.KEYWORD_ONLY and p not in ("eps_low", "eps_high", "dual_clip")]
  unknown = sorted(set(kwargs) - set(own))
  if not unknown:
    return ""
  return (f"policy loss {name!r} takes no parameter {', '.join(map(repr, unknown))}; its own parameters: "
          f"{', '.join(own) or 'none'} (eps_low, eps_high and dual_clip are rl fields).")   # read the SFT step's view (targets over the whole sequence), not a TrainBatch


def token_mean(x: Array, mask: Array, step_inputs: dict) -> Metric:
  """This slice's share of the full batch's masked token mean of `x`."""
  return Metric(jnp.sum(jnp.where(mask, x, 0.0)) / step_inputs["num_tokens"])


@LOSS_TERMS.register("policy")
def policy_term(cfg) -> LossTerm:
  """`POLICY_LOSSES[cfg.policy_loss]` on (logp, old_logp, advantages) with the configured clip ranges and
  the loss's own parameters `cfg.policy_kwargs` (e.g. SAPO's temperatures), on the rows whose source is in
  `cfg.surrogate_rows` (default: every row)."""
  loss_fn = POLICY_LOSSES.get(cfg.policy_loss)
  clip = dict(eps_low=cfg.eps_low, eps_high=cfg.eps_high, **dict(cfg.get("policy_kwargs", {})))
  if cfg.dual_clip:
    clip["dual_clip"] = cfg.dual_clip

  rows = set(cfg.get("surrogate_rows", ROW_SOURCES))
  sources = [ROW_SOURCE[s] for s in sorted(rows)]
  every = rows >= set(ROW_SOURCES) - {"padding"}      # padding rows have an all-False loss mask anyway

  def term(logp, logits, batch, step_inputs):
    del logits
    mask = batch.loss_mask
    if not every:                            # e.g. OnePO: teacher rows are trained by their own term
      mask = mask & jnp.isin(batch.row_source, jnp.asarray(sources))[:, None]
    per_tok, m = loss_fn(logp, batch.old_logp, batch.advantages, mask, **clip)
    # The loss reports masked means over its own rows; scaled by the slice's token count they become shares
    # of the full batch's mean.
    share = jnp.sum(mask.astype(jnp.float32)) / step_inputs["num_tokens"]
    return per_tok, {k: Metric(v * share) for k, v in m.items()}
  return term


@LOSS_TERMS.register("kl")
def kl_term(cfg) -> LossTerm:
  """Per-token KL estimate `KL_ESTIMATORS[cfg.kl_estimator](logp, ref_logp)` to the reference model."""
  def term(logp, logits, batch, step_inputs):
    del logits
    kl = kl_penalty(cfg.kl_estimator, logp, jax.lax.stop_gradient(batch.ref_logp))
    return kl, {"kl": token_mean(kl, batch.loss_mask, step_inputs)}
  return term


def scaled_entropy(logits: Array, temperature: float) -> Array:
  """[N, R] entropy of softmax(logits / T): the full sampling distribution before top-k / top-p."""
  return token_entropy(logits.astype(jnp.float32) / temperature)


@LOSS_TERMS.register("entropy")
def entropy_term(cfg) -> LossTerm:
  """`-H(pi_t)`: minimising it with a positive weight is an entropy bonus. Reports the `entropy` metric."""
  def term(logp, logits, batch, step_inputs):
    del logp
    entropy = scaled_entropy(logits, cfg.temperature)
    return -entropy, {"entropy": token_mean(entropy, batch.loss_mask, step_inputs)}
  return term


@LOSS_TERMS.register("nll")
def nll_term(cfg) -> LossTerm:
  """Next-token cross-entropy `-logp` (SFT), with token accuracy (target logit is the row maximum)."""
  del cfg

  def term(logp, logits, batch, step_inputs):
    # Argmax up to exact ties: one max, which the log-normaliser also computes, instead of a variadic argmax.
    target_logit = jnp.take_along_axis(logits, batch["targets"][..., None], axis=-1)[..., 0]
    correct = (target_logit >= jnp.max(logits, axis=-1)) & batch["target_mask"]
    return -logp, {"token_accuracy": Metric(jnp.sum(correct) / step_inputs["num_tokens"])}
  return term
