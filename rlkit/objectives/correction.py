"""Off-policy rollout correction between the sampler and the trainer (registry `CORRECTIONS`, config section
`rl.correction` from `correction_defaults()`, validated by `check`).

The sampler's behaviour log-probs `rollout_logp` and the trainer's `old_logp` of the same tokens differ when the
two compute differently (precision, kernels, quantised or stale rollout weights). A correction turns them into
stop-gradient per-token `weights` (the trainer multiplies `token_weights` by them) and a `keep` mask (the
trainer ANDs it into `loss_mask`, so rejected tokens also leave the loss denominator: slime PR #657's fix).
Only policy tokens T are corrected; `lr = old_logp - rollout_logp` on T, `lr_c = clip(lr, -20, 20)`; sequence
quantities are sums/means of log ratios, exponentiated once (clamped), so 4k-token rows stay finite. The shared
pieces and metrics are in correction_metrics.py.

  none                identity.
  rollout_correction  verl 0.9.1's `compute_rollout_correction_and_rejection_mask` (rollout_correction.py: the
                      semantics, the verl mapping and the deviations): IS weights at token or sequence level,
                      truncated (TIS, `rollout_is_threshold="2.0"`) or windowed (IcePop, "lower_upper", e.g.
                      "0.5_5.0"), optionally batch-normalised, and k1/k2/k3 rejection at token or sequence level.
  icepop              IcePop (Ant Group, Ring-1T) M(rho) = rho if alpha <= rho <= beta else 0 at token level, with
                      the tokens outside [icepop_low, icepop_high] REJECTED: they leave the loss mask and its
                      denominator (and count in rollout_rs_masked_fraction). verl 0.9.1's IcePop
                      (rollout_correction with a "lower_upper" threshold) gives them weight 0 but keeps them in
                      the denominator, and adds sequence level and batch normalisation.
  calibrated          OUR DESIGN (methods/llm.md §9), see calibrated_is.py.
  cis                 the published calibrated-IS rule (kzhao5/CIS-RL; methods/primary-sources.md), see
                      calibrated_is.py: f = min(rho, 1 + cis_lambda * max(1 - p, cis_kappa)) with p the trainer's
                      probability of the token; truncates only, rejects nothing.

Metrics (prefix `rollout_corr/`): correction_metrics.py for the shared ones, rollout_correction.py for verl's;
icepop, calibrated and cis log rollout_is_mean / _max / _min of their applied weights (0 on rejected tokens) and
the generic ESS over the kept tokens, and rollout_is_ratio_fraction_high / _low = fraction of T with rho > beta,
rho < alpha (icepop) or truncated, token-rejected (calibrated); cis logs _high only (truncated). Calibrated also
logs sigma (used for this batch), sigma_batch (this batch's median), calibrated_seq_rejected_fraction (rows) and
calibrated_weight_bias = mean_kept |w - rho| (§9).
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from rlkit.core.registry import Registry
from rlkit.core.sections import RL_SECTIONS, Section
from rlkit.core.types import TrainBatch
from rlkit.objectives import calibrated_is
from rlkit.objectives.correction_metrics import PREFIX, SAFETY_BOUND, corrected_inputs, finish, masked_mean
from rlkit.objectives.correction_metrics import mismatch_diagnostics, to_python, weight_stats
from rlkit.objectives.rollout_correction import IS_LEVELS, K1_BOUNDS, RS_ALIASES, RS_OPTIONS
from rlkit.objectives.rollout_correction import parse_rollout_is_threshold, parse_rollout_rs
from rlkit.objectives.rollout_correction import rollout_correction_weights

__all__ = ["CORRECTIONS", "CorrectionOutput", "CorrectionSpec", "IS_LEVELS", "K1_BOUNDS", "PREFIX", "RS_ALIASES",
           "RS_OPTIONS", "SAFETY_BOUND", "calibrated_correction", "check", "cis_correction", "correction_defaults",
           "icepop_weights", "parse_rollout_is_threshold", "parse_rollout_rs", "rollout_correction_weights"]


class CorrectionOutput(NamedTuple):
  weights: jax.Array   # [N, R] float32 stop-gradient loss multiplier; 1 off the corrected tokens
  keep: jax.Array      # [N, R] bool, False on rejected tokens (AND it into loss_mask)
  metrics: dict        # {name: python float}
  state: dict          # the new state (same structure as `init`)


class CorrectionSpec(NamedTuple):
  apply: Callable      # (batch: TrainBatch, cfg, state: dict) -> CorrectionOutput
  init: Callable       # (cfg) -> state: dict of float32 scalars ({} when stateless)


CORRECTIONS: Registry[CorrectionSpec] = Registry("correction")


def correction_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.name = "none"               # sampler -> trainer correction (registry CORRECTIONS): none | rollout_correction
                                # | icepop | calibrated | cis; fields of the others are ignored
  c.rollout_is = ""             # rollout_correction IS weights (verl 0.9.1): "" off | token | sequence
  c.rollout_is_threshold = "2.0"   # rollout_correction: verl 0.9.1's spec, "upper" truncates the IS weights
                                # (TIS; verl's default 2.0) or "lower_upper" zeroes the weights outside the window
                                # (IcePop, e.g. "0.5_5.0")
  c.rollout_is_batch_normalize = False   # rollout_correction: rescale the IS weights (TIS or IcePop) to mean 1
                                # over the batch's tokens (token IS) or sequences (sequence IS)
  c.rollout_rs = ""             # rollout_correction rejection (verl), "" off or a comma list of token_k1|k2|k3,
                                # seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3 (aliases token | sequence
                                # | geometric = token_k1 | seq_sum_k1 | seq_mean_k1)
  c.rollout_rs_threshold = ""   # rollout_correction: verl's spec, one entry or one per option: k1 "lower_upper"
                                # bounds or "upper" (lower = 1/upper), k2/k3 the upper bound; e.g. "0.5_2.0"
  c.rollout_rs_k1_bounds = "verl"   # rollout_correction: what k1 bounds bound: verl (verl 0.9.1: 1/r, as
                                # -log r in [log lower, log upper]) | ratio (r = pi_old/pi_rollout); the same when
                                # lower = 1/upper
  c.rollout_token_veto_threshold = 0.0   # rollout_correction: reject a whole sequence with a token ratio below
                                # this (0: off)
  c.icepop_low = 0.5            # icepop: tokens with ratio pi_old/pi_rollout below this are rejected (alpha)
  c.icepop_high = 5.0           # icepop: tokens with ratio above this are rejected (beta)
  c.calibrated_tau_hi = 3.0     # calibrated: truncate log ratios above tau_hi * s_t, s_t = sigma (1 - p_t) + eps
  c.calibrated_tau_lo = 6.0     # calibrated: reject tokens with log ratio below -tau_lo * s_t
  c.calibrated_eps = 0.02       # calibrated: floor of the expected mismatch scale s_t
  c.calibrated_max_masked_frac = 0.2     # calibrated: reject a sequence with more than this fraction rejected
  c.calibrated_sigma_decay = 0.99        # calibrated: decay of the (debiased) EMA of the batch's median mismatch
  c.calibrated_sigma_init = 0.1          # calibrated: sigma for the first batch, before any calibration
  c.cis_lambda = 2.3            # cis: cap 1 + lambda * max(1 - p, kappa) on the ratio (the published default)
  c.cis_kappa = 5e-3            # cis: floor of 1 - p in the cap, in [0, 1] (the published default)
  return c


def check(cfg, where: str = "correction") -> None:
  """ValueError naming the key and the fix for any invalid field of the `rl.correction` section."""
  def need(ok: bool, key: str, rule: str) -> None:
    if not ok:
      raise ValueError(f"{where}.{key}={cfg[key]!r} {rule}.")

  CORRECTIONS.check(cfg.name, f"{where}.name")
  need(cfg.rollout_is in IS_LEVELS, "rollout_is", 'must be "" (off), "token" or "sequence"')
  parse_rollout_is_threshold(cfg.rollout_is_threshold, where)
  parse_rollout_rs(cfg.rollout_rs, cfg.rollout_rs_threshold, where)
  need(cfg.rollout_rs_k1_bounds in K1_BOUNDS, "rollout_rs_k1_bounds",
       'must be "verl" (bound 1/r, verl 0.9.1) or "ratio" (bound r)')
  need(cfg.rollout_token_veto_threshold >= 0, "rollout_token_veto_threshold",
       "must be a ratio > 0 (e.g. 1e-4) or 0 to turn the veto off")
  need(cfg.icepop_low > 0, "icepop_low", "must be > 0 (IcePop's alpha, e.g. 0.5)")
  need(cfg.icepop_high > cfg.icepop_low, "icepop_high", f"must be above icepop_low={cfg.icepop_low!r}")
  for key in ("calibrated_tau_hi", "calibrated_tau_lo", "calibrated_eps"):
    need(cfg[key] > 0, key, "must be > 0")
  need(0 <= cfg.calibrated_max_masked_frac <= 1, "calibrated_max_masked_frac", "must be in [0, 1]")
  need(0 <= cfg.calibrated_sigma_decay < 1, "calibrated_sigma_decay", "must be in [0, 1)")
  need(cfg.calibrated_sigma_init >= 0, "calibrated_sigma_init", "must be >= 0")
  need(cfg.cis_lambda >= 0, "cis_lambda", "must be >= 0 (the published default is 2.3)")
  need(0 <= cfg.cis_kappa <= 1, "cis_kappa", "must be in [0, 1] (the published default is 5e-3)")


# ---------------------------------------------------------------------------------------------------------------
# rollout_correction (verl 0.9.1, rollout_correction.py)

def _rollout_correction_apply(batch: TrainBatch, cfg, state: dict) -> CorrectionOutput:
  weights, keep, metrics = rollout_correction_weights(
      batch.old_logp, batch.rollout_logp, batch.loss_mask, batch.row_source, is_level=cfg.rollout_is,
      is_threshold=str(cfg.rollout_is_threshold).strip(), batch_normalize=bool(cfg.rollout_is_batch_normalize),
      rs=parse_rollout_rs(cfg.rollout_rs, cfg.rollout_rs_threshold), k1_bounds=cfg.rollout_rs_k1_bounds,
      veto=float(cfg.rollout_token_veto_threshold))
  return CorrectionOutput(weights, keep, to_python(metrics), state)


# ---------------------------------------------------------------------------------------------------------------
# icepop

@partial(jax.jit, static_argnames=("low", "high"))
def icepop_weights(old_logp, rollout_logp, loss_mask, row_source, *, low=0.5, high=5.0):
  """IcePop's ratio window on the policy tokens, rejecting: (weights, keep, metrics); kept tokens weigh rho."""
  mask, old, rollout, lr = corrected_inputs(old_logp, rollout_logp, loss_mask, row_source)
  lr_c = jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)
  above, below = mask & (lr_c > math.log(high)), mask & (lr_c < math.log(low))
  keep = mask & ~above & ~below
  w = jnp.exp(lr_c)
  metrics = {**mismatch_diagnostics(old, rollout, lr, mask), **weight_stats(jnp.where(keep, w, 0.0), mask),
             "rollout_is_ratio_fraction_high": masked_mean(above, mask),
             "rollout_is_ratio_fraction_low": masked_mean(below, mask)}
  return finish(w, keep, mask, loss_mask, metrics)


# ---------------------------------------------------------------------------------------------------------------
# calibrated (OUR DESIGN, calibrated_is.py)

@partial(jax.jit, static_argnames=("tau_hi", "tau_lo", "eps", "max_masked_frac", "decay", "sigma_init"))
def calibrated_correction(old_logp, rollout_logp, loss_mask, row_source, state, *, tau_hi=3.0, tau_lo=6.0,
                          eps=0.02, max_masked_frac=0.2, decay=0.99, sigma_init=0.1):
  """Calibrated TIS on the policy tokens: (weights, keep, metrics, new state); sigma from before this batch."""
  mask, old, rollout, lr = corrected_inputs(old_logp, rollout_logp, loss_mask, row_source)
  sigma = calibrated_is.current_sigma(state, sigma_init, decay)
  w, keep, truncated, token_rejected, row_rejected = calibrated_is.calibrated_weights(
      lr, rollout, mask, sigma, tau_hi=tau_hi, tau_lo=tau_lo, eps=eps, max_masked_frac=max_masked_frac)
  median, has_any = calibrated_is.batch_sigma(lr, rollout, mask, eps)
  rho = jnp.exp(jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND))
  metrics = {**mismatch_diagnostics(old, rollout, lr, mask), **weight_stats(jnp.where(keep, w, 0.0), mask),
             "rollout_is_ratio_fraction_high": masked_mean(truncated, mask),
             "rollout_is_ratio_fraction_low": masked_mean(token_rejected, mask),
             "sigma": sigma, "sigma_batch": median,
             "calibrated_seq_rejected_fraction": masked_mean(row_rejected, mask.any(-1)),
             "calibrated_weight_bias": masked_mean(jnp.abs(w - rho), keep)}
  weights, keep, metrics = finish(w, keep, mask, loss_mask, metrics)
  return weights, keep, metrics, calibrated_is.update_state(state, median, has_any, decay)


def _calibrated_apply(batch: TrainBatch, cfg, state: dict) -> CorrectionOutput:
  weights, keep, metrics, new_state = calibrated_correction(
      batch.old_logp, batch.rollout_logp, batch.loss_mask, batch.row_source, state,
      tau_hi=float(cfg.calibrated_tau_hi), tau_lo=float(cfg.calibrated_tau_lo), eps=float(cfg.calibrated_eps),
      max_masked_frac=float(cfg.calibrated_max_masked_frac), decay=float(cfg.calibrated_sigma_decay),
      sigma_init=float(cfg.calibrated_sigma_init))
  new_state = {k: jax.device_get(v).astype("float32") for k, v in new_state.items()}
  return CorrectionOutput(weights, keep, to_python(metrics), new_state)


# ---------------------------------------------------------------------------------------------------------------
# cis (the published rule, calibrated_is.py)

@partial(jax.jit, static_argnames=("lam", "kappa"))
def cis_correction(old_logp, rollout_logp, loss_mask, row_source, *, lam=2.3, kappa=5e-3):
  """The published calibrated-IS rule on the policy tokens: (weights, keep, metrics); keeps every token."""
  mask, old, rollout, lr = corrected_inputs(old_logp, rollout_logp, loss_mask, row_source)
  w, truncated = calibrated_is.cis_weights(lr, old, mask, lam=lam, kappa=kappa)
  metrics = {**mismatch_diagnostics(old, rollout, lr, mask), **weight_stats(w, mask),
             "rollout_is_ratio_fraction_high": masked_mean(truncated, mask)}
  return finish(w, mask, mask, loss_mask, metrics)


def _none_apply(batch: TrainBatch, cfg, state: dict) -> CorrectionOutput:
  del cfg
  return CorrectionOutput(jnp.ones(batch.loss_mask.shape, jnp.float32), batch.loss_mask, {}, state)


def _stateless_apply(weights_fn, **keys):
  """The apply of a stateless rule: `weights_fn` (-> weights, keep, metrics) on the batch's four arrays, each of its
  keyword parameters read from the correction config's key `keys[parameter]`."""
  def apply(batch: TrainBatch, cfg, state: dict) -> CorrectionOutput:
    weights, keep, metrics = weights_fn(batch.old_logp, batch.rollout_logp, batch.loss_mask, batch.row_source,
                                        **{name: float(cfg[key]) for name, key in keys.items()})
    return CorrectionOutput(weights, keep, to_python(metrics), state)
  return apply


def _stateless(cfg) -> dict:
  del cfg
  return {}


CORRECTIONS.add("none", CorrectionSpec(_none_apply, _stateless))
CORRECTIONS.add("rollout_correction", CorrectionSpec(_rollout_correction_apply, _stateless))
CORRECTIONS.add("icepop", CorrectionSpec(_stateless_apply(icepop_weights, low="icepop_low", high="icepop_high"),
                                         _stateless))
CORRECTIONS.add("calibrated", CorrectionSpec(_calibrated_apply, lambda cfg: calibrated_is.init_state()))
CORRECTIONS.add("cis", CorrectionSpec(_stateless_apply(cis_correction, lam="cis_lambda", kappa="cis_kappa"),
                                      _stateless))

RL_SECTIONS.add("correction", Section(correction_defaults, lambda stage, name: check(stage.correction,
                                                                                    f"{name}.correction"),
                                      doc="sampler -> trainer off-policy correction (weights, rejections)"))
