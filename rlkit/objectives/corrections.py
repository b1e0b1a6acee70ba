"""Off-policy corrections between the sampler and the trainer: per-token weights from the two log-probs
(registry `CORRECTIONS`, config `rl.correction`).

The sampler's behaviour log-probs `rollout_logp` and the trainer's `old_logp` of the same tokens differ when
the two compute differently (precision, kernels, quantised rollout, stale weights). A correction turns them
into stop-gradient `TrainBatch.token_weights` [N, R] that multiply the per-token loss (methods/llm.md §12):

  none  w = 1
  tis   w = min(exp(old_logp - rollout_logp), cap)        truncated importance sampling, token level
        (verl's `rollout_is` with token aggregation and truncation; cap = rl.correction_cap)

A correction is `fn(batch: TrainBatch, cfg) -> (weights [N, R] float32, {name: float} metrics)`, computed
once per iteration after scoring (so the old log-probs exist), weights 0 off the loss mask.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rlkit.core.registry import Registry

CORRECTIONS: Registry[Callable] = Registry("correction")

MAX_LOG_RATIO = 20.0


@CORRECTIONS.register("none")
def no_correction(batch, cfg):
  del cfg
  return batch.token_weights, {}


@jax.jit
def _truncated_is(old_logp, rollout_logp, mask, cap):
  log_ratio = jnp.clip(jnp.where(mask, old_logp - rollout_logp, 0.0), -MAX_LOG_RATIO, MAX_LOG_RATIO)
  ratio = jnp.exp(log_ratio)
  weights = jnp.where(mask, jnp.minimum(ratio, cap), 0.0)
  n = jnp.maximum(mask.sum(), 1)
  masked = jnp.where(mask, ratio, 0.0)
  stats = {"correction/ratio_mean": masked.sum() / n,
           "correction/ratio_max": jnp.where(mask, ratio, -jnp.inf).max(),
           "correction/truncated_frac": jnp.sum(mask & (ratio > cap)) / n,
           # Kish effective sample size of the weights, as a fraction of the tokens: (sum w)^2 / (n sum w^2).
           "correction/ess_frac": jnp.square(weights.sum()) / (n * jnp.maximum(jnp.square(weights).sum(), 1e-30))}
  return jax.lax.stop_gradient(weights), stats


@CORRECTIONS.register("tis")
def truncated_importance_sampling(batch, cfg):
  """Token-level truncated IS weights `min(pi_old / pi_rollout, cap)` on the loss mask."""
  weights, stats = _truncated_is(batch.old_logp, batch.rollout_logp, batch.loss_mask, cfg.correction_cap)
  return weights * batch.token_weights, {k: float(v) for k, v in jax.device_get(stats).items()}
