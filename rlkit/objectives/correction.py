"""Off-policy rollout correction between the sampler and the trainer (registry `CORRECTIONS`, config section
`rl.correction` from `correction_defaults()`, validated by `check`).

The sampler's behaviour log-probs `rollout_logp` and the trainer's `old_logp` of the same tokens differ when the
two compute differently (precision, kernels, quantised or stale rollout weights). A correction turns them into
stop-gradient per-token `weights` (the trainer multiplies `token_weights` by them) and a `keep` mask (the
trainer ANDs it into `loss_mask`, so rejected tokens also leave the loss denominator: slime PR #657's fix).
Only policy tokens are corrected (T = `loss_mask` & row_source == policy); other rows (teacher demonstrations,
peers, padding) have no or other behaviour log-probs: weight 1, keep = loss_mask, and no part in the metrics.

`lr = old_logp - rollout_logp` (trainer minus sampler, verl's convention) in float32; `lr_c = clip(lr, -20, 20)`
(verl's SAFETY_BOUND) before every exp; sequence quantities are sums/means of log ratios, exponentiated once
(clamped), so 4k-token rows stay finite.

  none                identity.
  rollout_correction  verl's `compute_rollout_correction_and_rejection_mask` (verl/trainer/ppo/
                      rollout_corr_helper.py @ b178a3cd), IS and rejection composed as there:
      rollout_is = token      w_t = min(exp(lr_c_t), thr)
      rollout_is = sequence   w_t = min(exp(clip(sum_t lr_t)), thr)  for every token of the row
      rollout_is_batch_normalize  w /= mean of the truncated weights over T (token) or over rows (sequence),
                              taken before rejection, skipped when that mean is <= 1e-8 (verl).
      rollout_rs (comma list, every option must pass), with k1 = -lr_c, k2 = lr_c^2 / 2, k3 = exp(lr_c) - 1 - lr_c:
        token_k1 / seq_sum_k1 / seq_mean_k1   keep if lower <= ratio <= upper, ratio = exp(lr_c_t) /
                              exp(sum_t lr_c) / exp(mean_t lr_c) (the geometric mean)
        token_k2|k3, seq_sum_k2|k3, seq_mean_k2|k3, seq_max_k2|k3   keep if the statistic <= upper
      rollout_token_veto_threshold  reject the whole row if some token has exp(lr) < veto (0: off).
      Rejection only masks; IS weights are computed from all of T independently (as verl), rejected tokens
      get weight 0.
  icepop              IcePop (Ant Group, Ring-1T) M(rho) = rho if alpha <= rho <= beta else 0: tokens outside
                      [icepop_low, icepop_high] are rejected, the others keep their untruncated ratio
                      (verl has no IcePop mode; its token_k1 is the same window without the weights).
  calibrated          OUR DESIGN (methods/llm.md §9), see calibrated_is.py.

verl mapping (the snapshot renamed the rejection levels): old `rollout_rs` token | sequence | geometric are
token_k1 | seq_sum_k1 | seq_mean_k1 (accepted here as aliases); old `rollout_rs_threshold` + `_threshold_lower`
are now one string spec `rollout_rs_threshold`: one entry shared by all options or one per option (comma list);
k1 entries "lower_upper" or "upper" (lower = 1/upper), k2/k3 entries one upper bound. verl #4544 replaced the
per-token veto by seq_max_k2|k3; we keep it too, with the pre-#4544 semantics (`rollout_token_veto_threshold`,
unclamped lr).
Deviations from verl, and why:
  * k1 bounds bound the ratio r (docs: "ratios outside [lower, upper]"; pre-#4544 code). verl HEAD compares
    k1 = -log r to [log lower, log upper], i.e. bounds 1/r; the two agree for lower = 1/upper (the default).
  * Empty cases: verl raises on an all-masked batch and divides by zero when every sequence is rejected; here a
    batch without policy tokens gets identity weights and 0 metrics, and an all-rejected batch simply has no
    kept policy token. Row-level metrics average over policy rows with >= 1 corrected token (verl: all rows).
  * `rollout_is = ""` (verl yaml null, the trainer's default): rollout_correction with IS off logs metrics and
    rejects only.

Metrics (prefix `rollout_corr/`; every non-none correction; means over T unless said, rows = corrected rows):
  kl = mean(-lr); k3_kl = mean(exp(lr_c) - 1 - lr_c); chi2_token = mean(exp(2 lr_c)) - 1;
  chi2_seq = mean_rows exp(2 clip(sum_t lr)) - 1; training_log_ppl / rollout_log_ppl = mean_rows(-mean_t logp);
  log_ppl_diff = mean_rows(mean_t rollout_logp - mean_t old_logp), log_ppl_abs_diff its |.|     (all verl's)
  log_ratio_abs_mean = mean |lr|, log_ratio_abs_max = max |lr|                                    (rlkit)
  rollout_is_mean / _max / _min: the raw (untruncated) ratio exp(lr_c) (sequence IS: verl's seq-level values)
  rollout_is_ratio_fraction_high / _low: fraction above the truncation / below the low bound (token IS: raw >
    thr, < 1/thr; sequence IS: rows with sum lr > log thr, < -log thr; icepop: rho > beta, rho < alpha;
    calibrated: truncated tokens, token-rejected tokens)
  rollout_is_eff_sample_size: Kish ESS fraction 1 / mean((w / mean w)^2) over the kept tokens of the applied
    weights; with rollout_is on, verl's exactly: of clip(raw, 1/thr, thr) over T.   rollout_is_std (IS on): verl.
  rollout_rs_masked_fraction = 1 - |kept| / |T| (all rejection: RS, veto, icepop, calibrated);
  rollout_rs_seq_masked_fraction = fraction of rows with a rejected token; weight_mean = mean of w over kept.
  Per rejection option (verl): rollout_rs_<opt>_masked_fraction, _seq_masked_fraction, _mean, _max, _min (of the
  statistic, k1 = -lr). Veto: rollout_is_veto_fraction (rows), rollout_is_catastrophic_token_fraction.
  Batch normalisation: rollout_is_batch_norm_factor. Calibrated: sigma (used for this batch), sigma_batch (this
  batch's median), calibrated_seq_rejected_fraction (rows), calibrated_weight_bias = mean_kept |w - rho| (§9).
"""
from __future__ import annotations

import math
from functools import partial
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections

from rlkit.core.registry import Registry
from rlkit.core.types import ROW_SOURCE, TrainBatch
from rlkit.objectives import calibrated_is

SAFETY_BOUND = 20.0
IS_LEVELS = ("", "token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
RS_ALIASES = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}
PREFIX = "rollout_corr/"


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
                                # | icepop | calibrated; fields of the others are ignored
  c.rollout_is = ""             # rollout_correction IS weights (verl): "" off | token | sequence
  c.rollout_is_threshold = 2.0  # rollout_correction: truncation of the IS weights (verl's default)
  c.rollout_is_batch_normalize = False   # rollout_correction: rescale the IS weights to mean 1 over the batch's
                                # tokens (token IS) or sequences (sequence IS)
  c.rollout_rs = ""             # rollout_correction rejection (verl), "" off or a comma list of token_k1|k2|k3,
                                # seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, seq_max_k2|k3 (aliases token | sequence
                                # | geometric = token_k1 | seq_sum_k1 | seq_mean_k1)
  c.rollout_rs_threshold = ""   # rollout_correction: verl's spec, one entry or one per option: k1 "lower_upper"
                                # ratio bounds or "upper" (lower = 1/upper), k2/k3 the upper bound; e.g. "0.5_2.0"
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
  return c


def parse_rollout_rs(rollout_rs: str, threshold: str, where: str = "correction") -> tuple:
  """verl's `rollout_rs` / `rollout_rs_threshold` pair as ((option, lower, upper), ...); lower is 0 for k2/k3."""
  names: list[str] = []
  for part in str(rollout_rs).split(","):
    name = RS_ALIASES.get(part.strip(), part.strip())
    if name and name not in names:
      if name not in RS_OPTIONS:
        raise ValueError(f"{where}.rollout_rs: unknown option {name!r}; use \"\" (off) or a comma list of "
                         f"{', '.join(RS_OPTIONS)} (aliases: token, sequence, geometric).")
      names.append(name)
  if not names:
    return ()
  specs = [s.strip() for s in str(threshold).split(",") if s.strip()]
  key = f"{where}.rollout_rs_threshold={threshold!r}"
  if not specs:
    raise ValueError(f"{key}: rollout_rs={rollout_rs!r} needs thresholds, e.g. \"0.5_2.0\" (ratio bounds of a k1 "
                     "option) or \"0.01\" (upper bound of a k2/k3 option).")
  if len(specs) not in (1, len(names)):
    raise ValueError(f"{key}: give one threshold for all options or one per option ({len(names)}: "
                     f"{', '.join(names)}), comma-separated.")
  out = []
  for name, spec in zip(names, specs * len(names) if len(specs) == 1 else specs):
    bounds = spec.split("_", 1) if name.endswith("k1") else [spec]
    if not name.endswith("k1") and "_" in spec:
      raise ValueError(f"{key}: {name} takes a single upper bound, not {spec!r}.")
    try:
      values = [float(b) for b in bounds]
    except ValueError:
      raise ValueError(f"{key}: {spec!r} for {name} is not a number{' or lower_upper' * name.endswith('k1')}.") \
          from None
    if not all(v > 0 and math.isfinite(v) for v in values):
      raise ValueError(f"{key}: thresholds of {name} must be finite and > 0, got {spec!r}.")
    if len(values) == 2:
      lower, upper = values
    else:   # a k1 option's lone bound is the upper one, lower = 1/upper (verl); k2/k3 have no lower bound
      lower, upper = (1.0 / values[0] if name.endswith("k1") else 0.0), values[0]
    if lower >= upper:
      raise ValueError(f"{key}: {name}'s lower bound {lower} must be below its upper bound {upper}.")
    out.append((name, lower, upper))
  return tuple(out)


def check(cfg, where: str = "correction") -> None:
  """ValueError naming the key and the fix for any invalid field of the `rl.correction` section."""
  def need(ok: bool, key: str, rule: str) -> None:
    if not ok:
      raise ValueError(f"{where}.{key}={cfg[key]!r} {rule}.")

  CORRECTIONS.check(cfg.name, f"{where}.name")
  need(cfg.rollout_is in IS_LEVELS, "rollout_is", 'must be "" (off), "token" or "sequence"')
  need(cfg.rollout_is_threshold > 0, "rollout_is_threshold", "must be > 0 (verl's default is 2.0)")
  parse_rollout_rs(cfg.rollout_rs, cfg.rollout_rs_threshold, where)
  need(cfg.rollout_token_veto_threshold >= 0, "rollout_token_veto_threshold",
       "must be a ratio > 0 (e.g. 1e-4) or 0 to turn the veto off")
  need(cfg.icepop_low > 0, "icepop_low", "must be > 0 (IcePop's alpha, e.g. 0.5)")
  need(cfg.icepop_high > cfg.icepop_low, "icepop_high", f"must be above icepop_low={cfg.icepop_low!r}")
  for key in ("calibrated_tau_hi", "calibrated_tau_lo", "calibrated_eps"):
    need(cfg[key] > 0, key, "must be > 0")
  need(0 <= cfg.calibrated_max_masked_frac <= 1, "calibrated_max_masked_frac", "must be in [0, 1]")
  need(0 <= cfg.calibrated_sigma_decay < 1, "calibrated_sigma_decay", "must be in [0, 1)")
  need(cfg.calibrated_sigma_init >= 0, "calibrated_sigma_init", "must be >= 0")


# ---------------------------------------------------------------------------------------------------------------
# Shared pieces. Masked reductions return 0 on an empty mask so empty batches log zeros, never NaN.

def _mean(x, m):
  return jnp.sum(jnp.where(m, x, 0.0)) / jnp.maximum(jnp.sum(m), 1)


def _max(x, m, axis=None):
  return jnp.where(m.any(axis), jnp.max(jnp.where(m, x, -jnp.inf), axis), 0.0)


def _min(x, m):
  return jnp.where(m.any(), jnp.min(jnp.where(m, x, jnp.inf)), 0.0)


def _inputs(old_logp, rollout_logp, loss_mask, row_source):
  """(corrected mask T, trainer and sampler log-probs zeroed off T, lr = old - rollout on T)."""
  mask = loss_mask & (row_source == ROW_SOURCE["policy"])[:, None]
  old = jnp.where(mask, old_logp.astype(jnp.float32), 0.0)   # zeroed first: garbage off T never reaches a grad
  rollout = jnp.where(mask, rollout_logp.astype(jnp.float32), 0.0)
  return mask, old, rollout, old - rollout


def _diagnostics(old, rollout, lr, mask) -> dict:
  """verl's `compute_offpolicy_metrics` (log-space forms) and the |log ratio| summary."""
  lr_c = jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)
  rows = mask.any(-1)
  n = jnp.maximum(mask.sum(-1), 1)
  mean_old, mean_rollout = old.sum(-1) / n, rollout.sum(-1) / n
  diff = mean_rollout - mean_old
  return {"kl": _mean(-lr, mask), "k3_kl": _mean(jnp.expm1(lr_c) - lr_c, mask),
          "chi2_token": _mean(jnp.expm1(2.0 * lr_c), mask),
          "chi2_seq": _mean(jnp.expm1(2.0 * jnp.clip(lr.sum(-1), -SAFETY_BOUND, SAFETY_BOUND)), rows),
          "training_log_ppl": _mean(-mean_old, rows), "rollout_log_ppl": _mean(-mean_rollout, rows),
          "log_ppl_diff": _mean(diff, rows), "log_ppl_abs_diff": _mean(jnp.abs(diff), rows),
          "log_ratio_abs_mean": _mean(jnp.abs(lr), mask), "log_ratio_abs_max": _max(jnp.abs(lr), mask)}


def _ratio_stats(lr, mask) -> dict:
  rho = jnp.exp(jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND))
  return {"rollout_is_mean": _mean(rho, mask), "rollout_is_max": _max(rho, mask), "rollout_is_min": _min(rho, mask)}


def _finish(w, keep, mask, loss_mask, metrics) -> tuple:
  """Final (weights, keep, metrics): outcome metrics, weight 0 on rejected and 1 off the corrected tokens."""
  rows = mask.any(-1)
  lost = mask & ~keep
  wk = jnp.where(keep, w, 0.0)
  k = keep.sum()
  ess = jnp.where(k > 0, jnp.square(wk.sum()) / (k * jnp.maximum(jnp.square(wk).sum(), 1e-30)), 0.0)
  metrics = {"rollout_rs_masked_fraction": _mean(lost, mask), "rollout_rs_seq_masked_fraction": _mean(
      lost.any(-1), rows), "weight_mean": _mean(w, keep), "rollout_is_eff_sample_size": ess,
      **metrics}   # a correction's own metrics win (rollout_correction's verl ESS)
  weights = jax.lax.stop_gradient(jnp.where(mask, wk, 1.0))
  return weights, keep | (loss_mask & ~mask), metrics


def _python(metrics: dict) -> dict:
  return {PREFIX + k: float(v) for k, v in jax.device_get(metrics).items()}


# ---------------------------------------------------------------------------------------------------------------
# rollout_correction (verl)

def _rollout_is(lr, mask, level, thr, batch_normalize):
  """verl's `compute_rollout_correction_weights` + `compute_is_metrics`: (truncated weights, metrics)."""
  rows = mask.any(-1)
  if level == "token":
    raw = jnp.exp(jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND))
    m = {**_ratio_stats(lr, mask), "rollout_is_ratio_fraction_high": _mean(raw > thr, mask),
         "rollout_is_ratio_fraction_low": _mean(raw < 1.0 / thr, mask)}
  else:
    seq = lr.sum(-1)   # verl sums the unclamped token log ratios, then clamps the sum
    raw = jnp.broadcast_to(jnp.exp(jnp.clip(seq, -SAFETY_BOUND, SAFETY_BOUND))[:, None], lr.shape)
    m = {"rollout_is_mean": _mean(raw, mask), "rollout_is_max": jnp.exp(jnp.minimum(_max(seq, rows), SAFETY_BOUND)),
         "rollout_is_min": jnp.exp(jnp.where(rows.any(), jnp.min(jnp.where(rows, seq, jnp.inf)), 0.0)),
         "rollout_is_ratio_fraction_high": _mean(seq > math.log(thr), rows),
         "rollout_is_ratio_fraction_low": _mean(seq < -math.log(thr), rows)}
  clamped = jnp.clip(raw, 1.0 / thr, thr)   # verl's std and ESS use weights clamped to [1/thr, thr]
  cm = _mean(clamped, mask)
  m["rollout_is_std"] = jnp.sqrt(jnp.maximum(_mean(jnp.square(clamped), mask) - jnp.square(cm), 0.0))
  second = _mean(jnp.square(clamped / (cm + 1e-8)), mask)
  m["rollout_is_eff_sample_size"] = jnp.where(mask.any(), 1.0 / jnp.maximum(second, 1e-30), 0.0)
  w = jnp.minimum(raw, thr)
  if batch_normalize:
    mean = _mean(w, mask) if level == "token" else _mean(w[:, 0], rows)
    factor = jnp.where(mean > 1e-8, mean, 1.0)
    w = w / factor
    m["rollout_is_batch_norm_factor"] = factor
  return w, m


def _rejection(option, lower, upper, lr, mask):
  """One verl `rollout_rs` option: (keep [N, R] bool, metrics). k1 bounds the ratio (see the module docstring)."""
  lr_c = jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)
  kind = option[-2:]
  stat = {"k1": -lr_c, "k2": 0.5 * jnp.square(lr_c), "k3": jnp.expm1(lr_c) - lr_c}[kind]
  stat = jnp.where(mask, stat, 0.0)
  rows = mask.any(-1)
  if option.startswith("token"):
    level_stat, where = stat, mask
  else:
    if option.startswith("seq_sum"):
      level_stat = stat.sum(-1)
    elif option.startswith("seq_mean"):
      level_stat = stat.sum(-1) / jnp.maximum(mask.sum(-1), 1)
    else:
      level_stat = _max(stat, mask, axis=-1)
    where = rows
  if kind == "k1":   # -k1 is the (summed / averaged) log ratio
    ok = (-level_stat >= math.log(lower)) & (-level_stat <= math.log(upper))
  else:
    ok = level_stat <= upper
  keep = mask & (ok if ok.ndim == 2 else ok[:, None])
  lost = mask & ~keep
  per_token = level_stat if level_stat.ndim == 2 else jnp.broadcast_to(level_stat[:, None], mask.shape)
  p = f"rollout_rs_{option}"
  return keep, {f"{p}_masked_fraction": _mean(lost, mask), f"{p}_seq_masked_fraction": _mean(lost.any(-1), rows),
                f"{p}_mean": _mean(per_token, mask), f"{p}_max": _max(level_stat, where),
                f"{p}_min": _min(level_stat, where)}


@partial(jax.jit, static_argnames=("is_level", "is_threshold", "batch_normalize", "rs", "veto"))
def rollout_correction_weights(old_logp, rollout_logp, loss_mask, row_source, *, is_level="", is_threshold=2.0,
                               batch_normalize=False, rs=(), veto=0.0):
  """verl's rollout correction on the policy tokens: (weights [N, R], keep [N, R], metrics of jnp scalars).

  `rs` is `parse_rollout_rs(...)`'s tuple; `veto` a ratio (0: off)."""
  mask, old, rollout, lr = _inputs(old_logp, rollout_logp, loss_mask, row_source)
  metrics = _diagnostics(old, rollout, lr, mask)
  w = jnp.ones_like(lr)
  if is_level:
    w, is_metrics = _rollout_is(lr, mask, is_level, is_threshold, batch_normalize)
    metrics.update(is_metrics)
  keep = mask
  for option, lower, upper in rs:
    option_keep, option_metrics = _rejection(option, lower, upper, lr, mask)
    keep = keep & option_keep
    metrics.update(option_metrics)
  if veto > 0:
    catastrophic = mask & (lr < math.log(veto))
    vetoed = catastrophic.any(-1)
    keep = keep & ~vetoed[:, None]
    metrics.update(rollout_is_veto_fraction=_mean(vetoed, mask.any(-1)),
                   rollout_is_catastrophic_token_fraction=_mean(catastrophic, mask))
  # With IS on, verl's ESS (of the clamped raw weights over T) in `metrics` overrides _finish's generic one.
  return _finish(w, keep, mask, loss_mask, metrics)


def _rollout_correction_apply(batch: TrainBatch, cfg, state: dict) -> CorrectionOutput:
  weights, keep, metrics = rollout_correction_weights(
      batch.old_logp, batch.rollout_logp, batch.loss_mask, batch.row_source, is_level=cfg.rollout_is,
      is_threshold=float(cfg.rollout_is_threshold), batch_normalize=bool(cfg.rollout_is_batch_normalize),
      rs=parse_rollout_rs(cfg.rollout_rs, cfg.rollout_rs_threshold),
      veto=float(cfg.rollout_token_veto_threshold))
  return CorrectionOutput(weights, keep, _python(metrics), state)


# ---------------------------------------------------------------------------------------------------------------
# icepop

@partial(jax.jit, static_argnames=("low", "high"))
def icepop_weights(old_logp, rollout_logp, loss_mask, row_source, *, low=0.5, high=5.0):
  """IcePop's ratio window on the policy tokens: (weights, keep, metrics); kept tokens weigh rho."""
  mask, old, rollout, lr = _inputs(old_logp, rollout_logp, loss_mask, row_source)
  lr_c = jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND)
  above, below = mask & (lr_c > math.log(high)), mask & (lr_c < math.log(low))
  metrics = {**_diagnostics(old, rollout, lr, mask), **_ratio_stats(lr, mask),
             "rollout_is_ratio_fraction_high": _mean(above, mask), "rollout_is_ratio_fraction_low": _mean(below, mask)}
  return _finish(jnp.exp(lr_c), mask & ~above & ~below, mask, loss_mask, metrics)


def _icepop_apply(batch: TrainBatch, cfg, state: dict) -> CorrectionOutput:
  weights, keep, metrics = icepop_weights(batch.old_logp, batch.rollout_logp, batch.loss_mask, batch.row_source,
                                          low=float(cfg.icepop_low), high=float(cfg.icepop_high))
  return CorrectionOutput(weights, keep, _python(metrics), state)


# ---------------------------------------------------------------------------------------------------------------
# calibrated (OUR DESIGN, calibrated_is.py)

@partial(jax.jit, static_argnames=("tau_hi", "tau_lo", "eps", "max_masked_frac", "decay", "sigma_init"))
def calibrated_correction(old_logp, rollout_logp, loss_mask, row_source, state, *, tau_hi=3.0, tau_lo=6.0,
                          eps=0.02, max_masked_frac=0.2, decay=0.99, sigma_init=0.1):
  """Calibrated TIS on the policy tokens: (weights, keep, metrics, new state); sigma from before this batch."""
  mask, old, rollout, lr = _inputs(old_logp, rollout_logp, loss_mask, row_source)
  sigma = calibrated_is.current_sigma(state, sigma_init, decay)
  w, keep, truncated, token_rejected, row_rejected = calibrated_is.calibrated_weights(
      lr, rollout, mask, sigma, tau_hi=tau_hi, tau_lo=tau_lo, eps=eps, max_masked_frac=max_masked_frac)
  median, has_any = calibrated_is.batch_sigma(lr, rollout, mask, eps)
  rho = jnp.exp(jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND))
  metrics = {**_diagnostics(old, rollout, lr, mask), **_ratio_stats(lr, mask),
             "rollout_is_ratio_fraction_high": _mean(truncated, mask),
             "rollout_is_ratio_fraction_low": _mean(token_rejected, mask),
             "sigma": sigma, "sigma_batch": median,
             "calibrated_seq_rejected_fraction": _mean(row_rejected, mask.any(-1)),
             "calibrated_weight_bias": _mean(jnp.abs(w - rho), keep)}
  weights, keep, metrics = _finish(w, keep, mask, loss_mask, metrics)
  return weights, keep, metrics, calibrated_is.update_state(state, median, has_any, decay)


def _calibrated_apply(batch: TrainBatch, cfg, state: dict) -> CorrectionOutput:
  weights, keep, metrics, new_state = calibrated_correction(
      batch.old_logp, batch.rollout_logp, batch.loss_mask, batch.row_source, state,
      tau_hi=float(cfg.calibrated_tau_hi), tau_lo=float(cfg.calibrated_tau_lo), eps=float(cfg.calibrated_eps),
      max_masked_frac=float(cfg.calibrated_max_masked_frac), decay=float(cfg.calibrated_sigma_decay),
      sigma_init=float(cfg.calibrated_sigma_init))
  new_state = {k: jax.device_get(v).astype("float32") for k, v in new_state.items()}
  return CorrectionOutput(weights, keep, _python(metrics), new_state)


def _none_apply(batch: TrainBatch, cfg, state: dict) -> CorrectionOutput:
  del cfg
  return CorrectionOutput(jnp.ones(batch.loss_mask.shape, jnp.float32), batch.loss_mask, {}, state)


def _stateless(cfg) -> dict:
  del cfg
  return {}


CORRECTIONS.add("none", CorrectionSpec(_none_apply, _stateless))
CORRECTIONS.add("rollout_correction", CorrectionSpec(_rollout_correction_apply, _stateless))
CORRECTIONS.add("icepop", CorrectionSpec(_icepop_apply, _stateless))
CORRECTIONS.add("calibrated", CorrectionSpec(_calibrated_apply, lambda cfg: calibrated_is.init_state()))
