"""Pieces every off-policy correction shares (correction.py, rollout_correction.py): the corrected tokens, the
sampler/trainer mismatch diagnostics, the applied-weight statistics and the final (weights, keep, metrics).

T = `loss_mask` & row_source == policy: the tokens a correction acts on. Other rows (teacher demonstrations,
peers, padding) have no or other behaviour log-probs: weight 1, keep = loss_mask, and no part in the metrics.
`lr = old_logp - rollout_logp` (trainer minus sampler, verl's convention) in float32, zeroed off T;
`lr_c = clip(lr, -20, 20)` (verl's SAFETY_BOUND) before every exp.

Metrics (prefix `rollout_corr/`; means over T unless said; rows = policy rows with >= 1 token of T):
  kl = mean(-lr); k3_kl = mean(exp(lr_c) - 1 - lr_c); chi2_token = mean(exp(2 lr_c)) - 1;
  chi2_seq = mean_rows exp(2 clip(sum_t lr)) - 1; training_log_ppl / rollout_log_ppl = mean_rows(-mean_t logp);
  log_ppl_diff = mean_rows(mean_t rollout_logp - mean_t old_logp), log_ppl_abs_diff its |.|
                                                      (verl 0.9.1's `compute_offpolicy_metrics`, log-space forms)
  log_ratio_abs_mean = mean |lr|, log_ratio_abs_max = max |lr|                                    (rlkit)
  rollout_is_mean / _max / _min (`weight_stats`): of the weights the correction applies, over T, 0 where it
    removes a token, before any batch normalisation: verl 0.9.1's token-level definition ("from the truncated
    weights"); rollout_correction's sequence level has verl's own (rollout_correction.py).
  rollout_rs_masked_fraction = 1 - |kept| / |T|; rollout_rs_seq_masked_fraction = fraction of rows with a
    rejected token; weight_mean = mean of the final weights over the kept tokens;
  rollout_is_eff_sample_size: Kish ESS fraction 1 / mean_kept((w / mean_kept w)^2) of the final weights, unless
    the correction logs its own (rollout_correction with IS on: verl 0.9.1's, see rollout_correction.py).
Masked reductions return 0 on an empty mask, so a batch without policy tokens logs zeros, never NaN.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rlkit.core.types import ROW_SOURCE

SAFETY_BOUND = 20.0
PREFIX = "rollout_corr/"


def masked_mean(x, m, axis=None):
  return jnp.sum(jnp.where(m, x, 0.0), axis) / jnp.maximum(jnp.sum(m, axis), 1)


def masked_max(x, m, axis=None):
  return jnp.where(m.any(axis), jnp.max(jnp.where(m, x, -jnp.inf), axis), 0.0)


def masked_min(x, m, axis=None):
  return jnp.where(m.any(axis), jnp.min(jnp.where(m, x, jnp.inf), axis), 0.0)


def corrected_inputs(old_logp, rollout_logp, loss_mask, row_source):
  """(corrected mask T, trainer and sampler log-probs zeroed off T, lr = old - rollout on T)."""
  mask = loss_mask & (row_source == ROW_SOURCE["policy"])[:, None]
  old = jnp.where(mask, old_logp.astype(jnp.float32), 0.0)   # zeroed first: garbage off T never reaches a grad
  rollout = jnp.where(mask, rollout_logp.astype(jnp.float32), 0.0)
  return mask, old, rollout, old - rollout


def mismatch_diagnostics(old, rollout, lr, mask) -> dict:
  """verl's `compute_offpolicy_metrics` (log-space forms) and the |log ratio| summary."""
  lr_c = jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)
  rows = mask.any(-1)
  n = jnp.maximum(mask.sum(-1), 1)
  mean_old, mean_rollout = old.sum(-1) / n, rollout.sum(-1) / n
  diff = mean_rollout - mean_old
  return {"kl": masked_mean(-lr, mask), "k3_kl": masked_mean(jnp.expm1(lr_c) - lr_c, mask),
          "chi2_token": masked_mean(jnp.expm1(2.0 * lr_c), mask),
          "chi2_seq": masked_mean(jnp.expm1(2.0 * jnp.clip(lr.sum(-1), -SAFETY_BOUND, SAFETY_BOUND)), rows),
          "training_log_ppl": masked_mean(-mean_old, rows), "rollout_log_ppl": masked_mean(-mean_rollout, rows),
          "log_ppl_diff": masked_mean(diff, rows), "log_ppl_abs_diff": masked_mean(jnp.abs(diff), rows),
          "log_ratio_abs_mean": masked_mean(jnp.abs(lr), mask), "log_ratio_abs_max": masked_max(jnp.abs(lr), mask)}


def weight_stats(w, mask) -> dict:
  """verl 0.9.1's rollout_is_mean / _max / _min: of the applied weights `w` (0 on removed tokens) over T."""
  return {"rollout_is_mean": masked_mean(w, mask), "rollout_is_max": masked_max(w, mask),
          "rollout_is_min": masked_min(w, mask)}


def finish(w, keep, mask, loss_mask, metrics) -> tuple:
  """Final (weights, keep, metrics): outcome metrics, weight 0 on rejected and 1 off the corrected tokens."""
  rows = mask.any(-1)
  lost = mask & ~keep
  wk = jnp.where(keep, w, 0.0)
  k = keep.sum()
  ess = jnp.where(k > 0, jnp.square(wk.sum()) / (k * jnp.maximum(jnp.square(wk).sum(), 1e-30)), 0.0)
  metrics = {"rollout_rs_masked_fraction": masked_mean(lost, mask),
             "rollout_rs_seq_masked_fraction": masked_mean(lost.any(-1), rows),
             "weight_mean": masked_mean(w, keep), "rollout_is_eff_sample_size": ess,
             **metrics}   # a correction's own metrics win (verl's ESS)
  weights = jax.lax.stop_gradient(jnp.where(mask, wk, 1.0))
  return weights, keep | (loss_mask & ~mask), metrics


def to_python(metrics: dict) -> dict:
  return {PREFIX + k: float(v) for k, v in jax.device_get(metrics).items()}
