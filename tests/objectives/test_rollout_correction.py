"""rollout_correction against verl 0.9.1 (rlkit/objectives/rollout_correction.py): a numpy transliteration of
verl 0.9.1's formulas (verl/trainer/ppo/rollout_corr_helper.py: `compute_rollout_correction_weights`,
`compute_is_metrics`, `compute_rollout_rejection_mask`), written here independently of rlkit's code, on small
random batches whose rows all have a loss token (where verl's all-rows and rlkit's corrected-rows means agree);
IcePop at token and sequence level, its "lower_upper" threshold and batch normalisation; the k1 bound conventions."""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.core.types import ROW_SOURCE, TrainBatch
from rlkit.objectives.correction import CORRECTIONS, correction_defaults, rollout_correction_weights

P = "rollout_corr/"
E = np.exp
SB = 20.0


def _masked_mean(x, m, axis=None):   # verl_F.masked_mean: sum(x m) / (sum(m) + 1e-8)
  return (x * m).sum(axis) / (m.sum(axis) + 1e-8)


def verl_is(lr, mask, level, threshold, batch_normalize):
  """verl 0.9.1's IS weights and metrics, in numpy float64."""
  m = mask.astype(np.float64)
  parts = [float(x) for x in str(threshold).split("_", 1)]
  upper, lower = parts[-1], (parts[0] if len(parts) == 2 else None)
  if level == "token":
    raw = E(np.clip(lr, -SB, SB))
  else:
    s = (lr * m).sum(-1, keepdims=True)
    raw = np.broadcast_to(E(np.clip(s, -SB, SB)), lr.shape)
  raw = raw * m
  if lower is None:
    w = np.minimum(raw, upper)
  else:
    w = np.where((raw >= lower) & (raw <= upper), raw, 0.0)
  low = 1.0 / upper if lower is None else lower
  out = {"rollout_is_mean": _masked_mean(w, m)}
  if level == "sequence":
    out["rollout_is_max"] = E(min(s.max(), SB))
    out["rollout_is_min"] = E(s.min())
    out["rollout_is_ratio_fraction_high"] = (s > math.log(upper)).mean()
    out["rollout_is_ratio_fraction_low"] = (s < math.log(low)).mean()
  else:
    out["rollout_is_ratio_fraction_high"] = _masked_mean(raw > upper, m)
    out["rollout_is_ratio_fraction_low"] = _masked_mean(raw < low, m)
    out["rollout_is_max"] = w[mask].max()
    out["rollout_is_min"] = w[mask].min()
  c = np.clip(w, 0.0, upper)
  mc = _masked_mean(c, m)
  out["rollout_is_std"] = math.sqrt(max(_masked_mean(c ** 2, m) - mc ** 2, 0.0)) if m.sum() > 1 else 0.0
  out["rollout_is_eff_sample_size"] = 1.0 / _masked_mean((c / (mc + 1e-8)) ** 2, m)
  if lower is not None:
    out["rollout_is_oob_ratio"] = _masked_mean((raw < lower) | (raw > upper), m)
  if batch_normalize:
    if level == "token":
      mean = _masked_mean(w, m)
    else:
      row_mean = _masked_mean(w, m, axis=-1)
      valid = (m.sum(-1) > 0).astype(np.float64)
      mean = (row_mean * valid).sum() / max(valid.sum(), 1e-8)
    if mean > 1e-8:
      w = w / mean
    out["rollout_is_batch_norm_factor"] = mean if mean > 1e-8 else 1.0
  return w, out


def verl_rejection(lr, mask, option, lower, upper):
  """verl 0.9.1's keep mask and per-option metrics of one `rollout_rs` option (k1 bounds -log r by the logs)."""
  m = mask.astype(np.float64)
  lc = np.clip(lr, -SB, SB)
  stat = {"k1": -lc, "k2": 0.5 * lc ** 2, "k3": E(lc) - 1.0 - lc}[option[-2:]]
  if option.startswith("token"):
    per_token = stat
  else:
    if option.startswith("seq_sum"):
      seq = (stat * m).sum(-1)
    elif option.startswith("seq_mean"):
      seq = _masked_mean(stat, m, axis=-1)
    else:
      seq = np.where(mask, stat, -np.inf).max(-1)
    per_token = np.broadcast_to(seq[:, None], lr.shape)
  if option.endswith("k1"):
    keep = (per_token >= math.log(lower)) & (per_token <= math.log(upper))
  else:
    keep = per_token <= upper
  lost = mask & ~keep
  p = f"rollout_rs_{option}"
  extremes = per_token[mask] if option.startswith("token") else seq
  return keep & mask, {f"{p}_mean": _masked_mean(per_token, m), f"{p}_max": extremes.max(),
                       f"{p}_min": extremes.min(), f"{p}_masked_fraction": _masked_mean(lost, m),
                       f"{p}_seq_masked_fraction": lost.any(-1).mean()}


def _case(seed, n=5, r=6, scale=0.6):
  rng = np.random.default_rng(seed)
  rollout = -rng.uniform(0.05, 3.0, (n, r))
  lr = rng.normal(0.0, scale, (n, r))
  mask = rng.random((n, r)) > 0.3
  mask[:, 0] = True   # every row has a loss token
  return rollout + lr, rollout, lr, mask


def _run(old, rollout, mask, **kw):
  n = mask.shape[0]
  w, keep, m = rollout_correction_weights(jnp.asarray(old, jnp.float32), jnp.asarray(rollout, jnp.float32),
                                          jnp.asarray(mask), jnp.zeros(n, jnp.int32), **kw)
  return np.asarray(w), np.asarray(keep), {k: float(v) for k, v in m.items()}


@pytest.mark.parametrize("level", ["token", "sequence"])
@pytest.mark.parametrize("threshold", ["2.0", "1.3", "0.5_5.0", "0.8_1.5"])
@pytest.mark.parametrize("batch_normalize", [False, True])
def test_is_weights_and_metrics_match_verl_0_9_1(level, threshold, batch_normalize):
  for seed in range(3):
    old, rollout, lr, mask = _case(seed)
    lr = old.astype(np.float32).astype(np.float64) - rollout.astype(np.float32).astype(np.float64)
    w, keep, m = _run(old, rollout, mask, is_level=level, is_threshold=threshold, batch_normalize=batch_normalize)
    ref_w, ref_m = verl_is(lr, mask, level, threshold, batch_normalize)
    np.testing.assert_allclose(w[mask], ref_w[mask], rtol=2e-5, atol=1e-6, err_msg=f"seed {seed}")
    np.testing.assert_array_equal(w[~mask], 1.0)
    np.testing.assert_array_equal(keep, mask)   # IS never rejects: IcePop's zeros stay in the loss mask (verl)
    assert set(ref_m) <= set(m), set(ref_m) - set(m)
    for k, v in ref_m.items():
      np.testing.assert_allclose(m[k], v, rtol=2e-5, atol=1e-6, err_msg=f"{k} seed {seed}")
    if "_" in threshold:   # the cases really exercise IcePop's window
      assert 0 < ref_m["rollout_is_oob_ratio"] < 1, seed


@pytest.mark.parametrize("option", ["token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k3", "seq_mean_k1",
                                    "seq_mean_k2", "seq_max_k2", "seq_max_k3"])
def test_rejection_matches_verl_0_9_1(option):
  spec = {"token_k1": "0.7_1.8", "seq_sum_k1": "0.6_1.5", "seq_mean_k1": "0.85_1.1", "token_k2": "0.08",
          "token_k3": "0.1", "seq_sum_k3": "0.5", "seq_mean_k2": "0.08", "seq_max_k2": "0.1",
          "seq_max_k3": "0.1"}[option]
  lower, upper = (float(spec.split("_")[0]), float(spec.split("_")[1])) if "_" in spec else (0.0, float(spec))
  fractions = []
  for seed in range(3):
    old, rollout, _, mask = _case(seed, scale=0.4)
    lr = old.astype(np.float32).astype(np.float64) - rollout.astype(np.float32).astype(np.float64)
    _, keep, m = _run(old, rollout, mask, rs=((option, lower, upper),))
    ref_keep, ref_m = verl_rejection(lr, mask, option, lower, upper)
    np.testing.assert_array_equal(keep[mask], ref_keep[mask], err_msg=f"seed {seed}")
    for k, v in ref_m.items():
      np.testing.assert_allclose(m[k], v, rtol=2e-5, atol=1e-6, err_msg=f"{k} seed {seed}")
    assert m["rollout_rs_masked_fraction"] == pytest.approx(ref_m[f"rollout_rs_{option}_masked_fraction"])
    fractions.append(ref_m[f"rollout_rs_{option}_masked_fraction"])
  assert any(0 < f < 1 for f in fractions), fractions   # the bounds bite on some case


@pytest.mark.parametrize("option", ["token_k1", "seq_sum_k1", "seq_mean_k1"])
def test_k1_conventions_agree_when_lower_is_one_over_upper_and_differ_otherwise(option):
  old, rollout, lr, mask = _case(7, n=16, r=8, scale=0.3)
  for spec in ((1 / 1.3, 1.3), (0.5, 2.0)):   # symmetric: lower = 1/upper
    verl = _run(old, rollout, mask, rs=((option, *spec),), k1_bounds="verl")[1]
    ratio = _run(old, rollout, mask, rs=((option, *spec),), k1_bounds="ratio")[1]
    np.testing.assert_array_equal(verl, ratio)
    assert 0 < (mask & ~verl).sum() or spec == (0.5, 2.0)
  lower, upper = 0.9, 2.5   # asymmetric: verl keeps 1/r in [0.9, 2.5], i.e. r in [0.4, 1.11]; ratio r in [0.9, 2.5]
  verl = _run(old, rollout, mask, rs=((option, lower, upper),), k1_bounds="verl")[1]
  ratio = _run(old, rollout, mask, rs=((option, lower, upper),), k1_bounds="ratio")[1]
  m = mask.astype(np.float64)
  stat = {"token_k1": lr, "seq_sum_k1": np.broadcast_to((lr * m).sum(-1, keepdims=True), lr.shape),
          "seq_mean_k1": np.broadcast_to(_masked_mean(lr, m, -1)[:, None], lr.shape)}[option]   # log r
  np.testing.assert_array_equal(verl, mask & (-stat >= math.log(lower)) & (-stat <= math.log(upper)))
  np.testing.assert_array_equal(ratio, mask & (stat >= math.log(lower)) & (stat <= math.log(upper)))
  assert (verl != ratio).any()


# The small case of test_correction.py: row sums of lr 1.3 | -0.7; token ratios [1.65, 0.82, 2.72 | 0.37, 1.35].
LR = np.array([[0.5, -0.2, 1.0], [-1.0, 0.3, 7.0]])
ROLLOUT = np.array([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]])
MASK = np.array([[True, True, True], [True, True, False]])


def _batch(old, rollout, mask):
  n, r = mask.shape
  return TrainBatch(tokens=jnp.zeros((n, r + 2), jnp.int32), attention_mask=jnp.ones((n, r + 2), bool),
                    loss_mask=jnp.asarray(mask), old_logp=jnp.asarray(old, jnp.float32),
                    rollout_logp=jnp.asarray(rollout, jnp.float32), advantages=jnp.zeros((n, r)),
                    token_weights=jnp.ones((n, r)), group_ids=jnp.arange(n, dtype=jnp.int32),
                    row_source=jnp.full((n,), ROW_SOURCE["policy"], jnp.int32))


def _apply(name="rollout_correction", **fields):
  c = correction_defaults()
  c.name = name
  for k, v in fields.items():
    c[k] = v
  out = CORRECTIONS.get(name).apply(_batch(ROLLOUT + LR, ROLLOUT, MASK), c, {})
  return out._replace(weights=np.asarray(out.weights), keep=np.asarray(out.keep))


def test_sequence_icepop_zeroes_whole_rows_outside_the_window_and_keeps_them_in_the_mask():
  out = _apply(rollout_is="sequence", rollout_is_threshold="0.5_5.0")
  # e^1.3 = 3.67 is inside [0.5, 5]: the row keeps its untruncated weight; e^-0.7 = 0.497 < 0.5: the row weighs 0.
  np.testing.assert_allclose(out.weights, [[E(1.3)] * 3, [0.0, 0.0, 1.0]], rtol=1e-6)
  np.testing.assert_array_equal(out.keep, MASK)
  m = out.metrics
  assert m[P + "rollout_rs_masked_fraction"] == 0.0   # zero weight is not a rejection (verl)
  assert m[P + "rollout_is_oob_ratio"] == pytest.approx(2 / 5)   # token-weighted
  assert m[P + "rollout_is_ratio_fraction_low"] == pytest.approx(0.5)   # rows
  assert m[P + "rollout_is_ratio_fraction_high"] == 0.0
  assert m[P + "rollout_is_mean"] == pytest.approx(3 * E(1.3) / 5, rel=1e-6)
  assert m[P + "rollout_is_max"] == pytest.approx(E(1.3), rel=1e-6)
  assert m[P + "rollout_is_min"] == pytest.approx(E(-0.7), rel=1e-6)   # from the raw row sums, as verl
  # A tighter window drops both rows; the TIS threshold "5.0" truncates nothing and zeroes nothing.
  np.testing.assert_array_equal(_apply(rollout_is="sequence", rollout_is_threshold="0.5_3.0").weights[MASK], 0.0)
  np.testing.assert_allclose(_apply(rollout_is="sequence", rollout_is_threshold="5.0").weights[1, :2], E(-0.7),
                             rtol=1e-6)


def test_icepop_batch_normalisation_divides_by_the_mean_with_the_zeros():
  raw = E(LR)[MASK]   # 1.65, 0.82, 2.72, 0.37, 1.35
  kept = np.where((raw >= 0.5) & (raw <= 2.0), raw, 0.0)
  out = _apply(rollout_is="token", rollout_is_threshold="0.5_2.0", rollout_is_batch_normalize=True)
  np.testing.assert_allclose(out.weights[MASK], kept / kept.mean(), rtol=1e-5)
  assert out.metrics[P + "rollout_is_batch_norm_factor"] == pytest.approx(kept.mean(), rel=1e-6)
  # Sequence level: row weights e^1.3 | 0, their mean over the 2 rows.
  out = _apply(rollout_is="sequence", rollout_is_threshold="0.5_5.0", rollout_is_batch_normalize=True)
  np.testing.assert_allclose(out.weights, [[2.0] * 3, [0.0, 0.0, 1.0]], rtol=1e-6)
  assert out.metrics[P + "rollout_is_batch_norm_factor"] == pytest.approx(E(1.3) / 2, rel=1e-6)
  # Every weight zeroed: the mean is 0 <= 1e-8, so nothing is divided (factor 1, verl), and the ESS is 0.
  out = _apply(rollout_is="token", rollout_is_threshold="10_20", rollout_is_batch_normalize=True)
  np.testing.assert_array_equal(out.weights[MASK], 0.0)
  assert out.metrics[P + "rollout_is_batch_norm_factor"] == 1.0 and out.metrics[P + "rollout_is_eff_sample_size"] == 0


def test_token_icepop_has_icepops_weights_and_verls_mask():
  """verl's IcePop (rollout_correction, "lower_upper") and rlkit's `icepop` weigh the same tokens the same; verl's
  keeps the zeroed tokens in the loss mask (and its denominator), `icepop` rejects them."""
  verl = _apply(rollout_is="token", rollout_is_threshold="0.5_2.0")
  ours = _apply("icepop", icepop_low=0.5, icepop_high=2.0)
  np.testing.assert_allclose(verl.weights, ours.weights, rtol=1e-6)
  np.testing.assert_array_equal(verl.keep, MASK)
  np.testing.assert_array_equal(ours.keep, [[True, True, False], [False, True, False]])
  for k in ("rollout_is_mean", "rollout_is_max", "rollout_is_min", "rollout_is_ratio_fraction_high",
            "rollout_is_ratio_fraction_low"):
    assert verl.metrics[P + k] == pytest.approx(ours.metrics[P + k], rel=1e-6), k
  assert verl.metrics[P + "rollout_rs_masked_fraction"] == 0
  assert ours.metrics[P + "rollout_rs_masked_fraction"] == pytest.approx(0.4)
