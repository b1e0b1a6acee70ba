"""verl 0.9.1's rollout correction (registry name `rollout_correction` in correction.py): truncated IS (TIS),
IcePop and rejection between the sampler's and the trainer's log-probs of the same tokens.

Source: `compute_rollout_correction_and_rejection_mask` and the helpers it calls in
verl/trainer/ppo/rollout_corr_helper.py of verl 0.9.1 (the PyPI release `verl==0.9.1`, its newest), read for
their semantics. IS and rejection are computed independently from the same `lr` (correction_metrics.py) and
composed as there: rejected tokens leave the loss mask (and its denominator) and get weight 0.

IS weights: `rollout_is` = token | sequence ("" off); `rollout_is_threshold` = "upper" (TIS) | "lower_upper"
(IcePop):
  raw_t = exp(lr_c_t)                            token
  raw_t = exp(clip(s)), s = sum_t lr_t           sequence: the row's unclamped log ratios summed, clamped once
  TIS     w = min(raw, upper)
  IcePop  w = raw if lower <= raw <= upper else 0   (Ant Group's Ring-1T M(rho); at sequence level the whole row.
          The token stays in the loss mask and its denominator with weight 0, as verl does.)
  rollout_is_batch_normalize: after the metrics, w /= the mean of w over T (token) or of the row weights over
          rows (sequence), skipped (factor 1) when that mean is <= 1e-8; IcePop's zeros count in the mean.
IS metrics (before batch normalisation; lower' = lower for IcePop, 1/upper for TIS):
  token     rollout_is_mean / _max / _min of w over T (0.9.1: the truncated weights; the old snapshot used raw);
            rollout_is_ratio_fraction_high / _low = mean_T(raw > upper), mean_T(raw < lower')
  sequence  rollout_is_max = exp(min(max_rows s, 20)), rollout_is_min = exp(min_rows s); rollout_is_mean = mean_T w
            (token-weighted); rollout_is_ratio_fraction_high / _low = mean_rows(s > log upper), (s < log lower')
  both      c = clip(w, 0, upper)   (0.9.1; the old snapshot clamped to [1/upper, upper])
            rollout_is_std = sqrt(mean_T c^2 - (mean_T c)^2), 0 when |T| <= 1
            rollout_is_eff_sample_size = 1 / mean_T((c / (mean_T c + 1e-8))^2)
            rollout_is_oob_ratio (IcePop) = mean_T(raw outside [lower, upper]), token-weighted at both levels
            rollout_is_batch_norm_factor (batch normalisation on)
Rejection, `rollout_rs` a comma list (every option must pass), with k1 = -lr_c, k2 = lr_c^2 / 2,
k3 = exp(lr_c) - 1 - lr_c and the statistic per token (token_k*), row sum (seq_sum_k*), row mean (seq_mean_k*)
or row max (seq_max_k2|k3):
  k2 / k3  keep if statistic <= upper
  k1       `rollout_rs_k1_bounds`:
             verl   log lower <= statistic <= log upper: bounds 1/r (verl 0.9.1's code; the default)
             ratio  lower <= r <= upper: bounds r (verl's docs, "ratio bounds"; rlkit before 0.9.1)
           with r = exp(lr_t) | exp(sum_t lr_c) | exp(mean_t lr_c). The two agree when lower = 1/upper, which a
           lone "upper" entry means: only an asymmetric "lower_upper" tells them apart.
  `rollout_rs_threshold`: one entry shared by all options or one per option; k1 entries "lower_upper" or "upper",
  k2/k3 entries one upper bound. Per option (verl): rollout_rs_<opt>_masked_fraction, _seq_masked_fraction, _mean
  (token-weighted), _max, _min (over rows for sequence options), of the statistic (k1 = -lr).
  `rollout_token_veto_threshold` (rlkit; verl #4544 replaced its veto by seq_max_k2|k3): reject the whole row if
  a token has exp(lr) < veto; metrics rollout_is_veto_fraction (rows), rollout_is_catastrophic_token_fraction.
Old snapshot names accepted: rollout_rs token | sequence | geometric = token_k1 | seq_sum_k1 | seq_mean_k1.

Deviations from verl 0.9.1, and why:
  * Empty cases: verl raises on an all-masked batch; here a batch without policy tokens gets identity weights
    and 0 metrics, an all-rejected batch has no kept token, and the ESS of all-zero weights is 0 (verl: 1/0).
  * Row quantities (sequence rollout_is_max / _min / fractions, row rejection metrics, seq_masked_fraction)
    range over rows with a corrected token; verl's over all rows, an empty row counting as ratio 1.
  * Sequence rollout_is_min is clamped at e^20 like _max (verl clamps _max only), so it stays finite.
  * `rollout_is = ""` (verl's yaml null, the default) logs the metrics and rejects only.
  * Thresholds are strings (an ml_collections field has one type); verl also takes floats.
  * Not logged: verl's rollout_is_seq_*, rollout_rs_<opt>_std / _fraction_* / _seq_*, the exp-scale ppl metrics.
"""
from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from rlkit.objectives.correction_metrics import SAFETY_BOUND, corrected_inputs, finish, masked_max, masked_mean
from rlkit.objectives.correction_metrics import masked_min, mismatch_diagnostics, weight_stats

IS_LEVELS = ("", "token", "sequence")
RS_OPTIONS = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
              "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")
RS_ALIASES = {"token": "token_k1", "sequence": "seq_sum_k1", "geometric": "seq_mean_k1"}
K1_BOUNDS = ("verl", "ratio")


def _bounds(spec: str, key: str, what: str) -> list[float]:
  """The numbers of one "upper" or "lower_upper" entry: finite, > 0 and lower <= upper (verl's rules)."""
  try:
    values = [float(b) for b in spec.split("_", 1)]
  except ValueError:
    raise ValueError(f"{key}: {spec!r} is not a number or lower_upper pair ({what}).") from None
  if not all(v > 0 and math.isfinite(v) for v in values):
    raise ValueError(f"{key}: bounds must be finite and > 0, got {spec!r} ({what}).")
  if len(values) == 2 and values[0] > values[1]:
    raise ValueError(f"{key}: the lower bound {values[0]} must not exceed the upper bound {values[1]}.")
  return values


def parse_rollout_is_threshold(spec, where: str = "correction") -> tuple:
  """verl 0.9.1's `rollout_is_threshold`: "upper" -> (upper, None) (TIS), "lower_upper" -> (upper, lower) (IcePop)."""
  if isinstance(spec, bool):   # bool is an int: verl refuses it rather than truncating at 1
    raise ValueError(f"{where}.rollout_is_threshold={spec!r} must be a number or \"lower_upper\", not a boolean.")
  values = _bounds(str(spec).strip(), f"{where}.rollout_is_threshold={spec!r}",
                   'TIS: the upper bound, e.g. "2.0" (verl\'s default); IcePop: "lower_upper", e.g. "0.5_5.0"')
  return values[-1], (values[0] if len(values) == 2 else None)


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
    raise ValueError(f"{key}: rollout_rs={rollout_rs!r} needs thresholds, e.g. \"0.5_2.0\" (bounds of a k1 "
                     "option) or \"0.01\" (upper bound of a k2/k3 option).")
  if len(specs) not in (1, len(names)):
    raise ValueError(f"{key}: give one threshold for all options or one per option ({len(names)}: "
                     f"{', '.join(names)}), comma-separated.")
  out = []
  for name, spec in zip(names, specs * len(names) if len(specs) == 1 else specs):
    k1 = name.endswith("k1")
    if not k1 and "_" in spec:
      raise ValueError(f"{key}: {name} takes a single upper bound, not {spec!r}.")
    values = _bounds(spec, key, name)
    if len(values) == 2:
      lower, upper = values
    else:   # a k1 option's lone bound is the upper one, lower = 1/upper (verl); k2/k3 have no lower bound
      lower, upper = (1.0 / values[0] if k1 else 0.0), values[0]
    out.append((name, lower, upper))
  return tuple(out)


def _is_weights(lr, mask, level, upper, lower, batch_normalize):
  """verl's `compute_rollout_correction_weights` + `compute_is_metrics`: (weights, metrics); IcePop if lower."""
  rows = mask.any(-1)
  icepop = lower is not None
  low = lower if icepop else 1.0 / upper
  if level == "token":
    raw = jnp.exp(jnp.clip(lr, -SAFETY_BOUND, SAFETY_BOUND))
  else:
    seq = lr.sum(-1)   # verl sums the unclamped token log ratios, then clamps the sum
    raw = jnp.broadcast_to(jnp.exp(jnp.clip(seq, -SAFETY_BOUND, SAFETY_BOUND))[:, None], lr.shape)
  w = jnp.where((raw >= low) & (raw <= upper), raw, 0.0) if icepop else jnp.minimum(raw, upper)
  if level == "token":
    m = {**weight_stats(w, mask), "rollout_is_ratio_fraction_high": masked_mean(raw > upper, mask),
         "rollout_is_ratio_fraction_low": masked_mean(raw < low, mask)}
  else:   # verl takes the row extremes in log space, from the raw row sums
    m = {"rollout_is_mean": masked_mean(w, mask),
         "rollout_is_max": jnp.exp(jnp.minimum(masked_max(seq, rows), SAFETY_BOUND)),
         "rollout_is_min": jnp.exp(jnp.minimum(masked_min(seq, rows), SAFETY_BOUND)),
         "rollout_is_ratio_fraction_high": masked_mean(seq > math.log(upper), rows),
         "rollout_is_ratio_fraction_low": masked_mean(seq < math.log(low), rows)}
  c = jnp.clip(w, 0.0, upper)   # a no-op for TIS and IcePop weights; kept as verl's definition
  cm = masked_mean(c, mask)
  m["rollout_is_std"] = jnp.where(mask.sum() > 1, jnp.sqrt(jnp.maximum(masked_mean(c * c, mask) - cm * cm, 0.0)),
                                  0.0)
  second = masked_mean(jnp.square(c / (cm + 1e-8)), mask)
  m["rollout_is_eff_sample_size"] = jnp.where(second > 0, 1.0 / jnp.where(second > 0, second, 1.0), 0.0)
  if icepop:
    m["rollout_is_oob_ratio"] = masked_mean((raw < low) | (raw > upper), mask)
  if batch_normalize:
    mean = masked_mean(w, mask) if level == "token" else masked_mean(w[:, 0], rows)
    factor = jnp.where(mean > 1e-8, mean, 1.0)
    w = w / factor
    m["rollout_is_batch_norm_factor"] = factor
  return w, m


def _rejection(option, lower, upper, lr, mask, k1_bounds):
  """One verl `rollout_rs` option: (keep [N, R] bool, metrics)."""
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
      level_stat = masked_max(stat, mask, axis=-1)
    where = rows
  if kind == "k1":   # the statistic is -log r: verl bounds it by the logs (1/r), "ratio" bounds log r
    x = level_stat if k1_bounds == "verl" else -level_stat
    ok = (x >= math.log(lower)) & (x <= math.log(upper))
  else:
    ok = level_stat <= upper
  keep = mask & (ok if ok.ndim == 2 else ok[:, None])
  lost = mask & ~keep
  per_token = level_stat if level_stat.ndim == 2 else jnp.broadcast_to(level_stat[:, None], mask.shape)
  p = f"rollout_rs_{option}"
  return keep, {f"{p}_masked_fraction": masked_mean(lost, mask),
                f"{p}_seq_masked_fraction": masked_mean(lost.any(-1), rows),
                f"{p}_mean": masked_mean(per_token, mask),
                f"{p}_max": masked_max(level_stat, where), f"{p}_min": masked_min(level_stat, where)}


@partial(jax.jit, static_argnames=("is_level", "is_threshold", "batch_normalize", "rs", "k1_bounds", "veto"))
def rollout_correction_weights(old_logp, rollout_logp, loss_mask, row_source, *, is_level="", is_threshold=2.0,
                               batch_normalize=False, rs=(), k1_bounds="verl", veto=0.0):
  """verl 0.9.1's rollout correction on the policy tokens: (weights [N, R], keep [N, R], metrics of jnp scalars).

  `is_threshold` is verl's spec ("2.0" or 2.0: TIS; "0.5_5.0": IcePop), `rs` `parse_rollout_rs(...)`'s tuple,
  `k1_bounds` one of K1_BOUNDS, `veto` a ratio (0: off)."""
  mask, old, rollout, lr = corrected_inputs(old_logp, rollout_logp, loss_mask, row_source)
  metrics = mismatch_diagnostics(old, rollout, lr, mask)
  w = jnp.ones_like(lr)
  if is_level:
    upper, lower = parse_rollout_is_threshold(is_threshold)
    w, is_metrics = _is_weights(lr, mask, is_level, upper, lower, batch_normalize)
    metrics.update(is_metrics)
  keep = mask
  for option, lower, upper in rs:
    option_keep, option_metrics = _rejection(option, lower, upper, lr, mask, k1_bounds)
    keep = keep & option_keep
    metrics.update(option_metrics)
  if veto > 0:
    catastrophic = mask & (lr < math.log(veto))
    vetoed = catastrophic.any(-1)
    keep = keep & ~vetoed[:, None]
    metrics.update(rollout_is_veto_fraction=masked_mean(vetoed, mask.any(-1)),
                   rollout_is_catastrophic_token_fraction=masked_mean(catastrophic, mask))
  # With IS on, verl's ESS (of the clamped IS weights over T) in `metrics` overrides finish's generic one.
  return finish(w, keep, mask, loss_mask, metrics)
