"""Off-policy rollout corrections (rlkit/objectives/correction.py, rollout_correction.py, calibrated_is.py):
hand-computed weights, masks, metrics and state, against verl 0.9.1's semantics where verl has the mode (a numpy
transliteration of verl 0.9.1's formulas is in test_rollout_correction.py) and the published calibrated-IS
rule's (kzhao5/CIS-RL's operator, transcribed below as `_cis_reference`)."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.core.types import ROW_SOURCE, TrainBatch
from rlkit.objectives import calibrated_is
from rlkit.objectives.correction import CORRECTIONS, calibrated_correction, check, cis_correction, correction_defaults
from rlkit.objectives.correction import icepop_weights, parse_rollout_is_threshold, parse_rollout_rs
from rlkit.objectives.correction import rollout_correction_weights

P = "rollout_corr/"
E = np.exp

# The small case: 2 policy rows x 3 tokens; row 1's last token is off the loss mask (its values are garbage).
LR = np.array([[0.5, -0.2, 1.0], [-1.0, 0.3, 7.0]])
ROLLOUT = np.array([[-1.0, -0.5, -2.0], [-0.3, -1.2, 0.0]])
MASK = np.array([[True, True, True], [True, True, False]])
RHO = E(LR)   # on the mask: 1.6487 0.8187 2.7183 | 0.3679 1.3499


def _batch(old, rollout, mask, row_source=None):
  n, r = np.shape(old)
  source = np.zeros(n, np.int32) if row_source is None else np.asarray(row_source, np.int32)
  return TrainBatch(tokens=jnp.zeros((n, r + 2), jnp.int32), attention_mask=jnp.ones((n, r + 2), bool),
                    loss_mask=jnp.asarray(mask), old_logp=jnp.asarray(old, jnp.float32),
                    rollout_logp=jnp.asarray(rollout, jnp.float32), advantages=jnp.zeros((n, r)),
                    token_weights=jnp.ones((n, r)), group_ids=jnp.arange(n, dtype=jnp.int32),
                    row_source=jnp.asarray(source))


def _cfg(name, **fields):
  c = correction_defaults()
  c.name = name
  for k, v in fields.items():
    c[k] = v
  return c


def _apply(cfg, batch, state=None):
  spec = CORRECTIONS.get(cfg.name)
  return spec.apply(batch, cfg, spec.init(cfg) if state is None else state)


def _small(**fields):
  return _apply(_cfg("rollout_correction", **fields), _batch(ROLLOUT + LR, ROLLOUT, MASK))


CONFIGS = [
    _cfg("none"),
    _cfg("rollout_correction"),
    _cfg("rollout_correction", rollout_is="token", rollout_is_batch_normalize=True, rollout_rs="token_k1,seq_sum_k2",
         rollout_rs_threshold="0.999_1.001,1e-6", rollout_token_veto_threshold=0.999),
    _cfg("rollout_correction", rollout_is="sequence", rollout_is_batch_normalize=True,
         rollout_rs="geometric,seq_max_k3,seq_mean_k2", rollout_rs_threshold="1.0001,1e-9,1e-9"),
    _cfg("rollout_correction", rollout_is="token", rollout_is_threshold="0.5_5.0", rollout_rs="token_k1",
         rollout_rs_threshold="0.9_1.2", rollout_rs_k1_bounds="ratio"),
    _cfg("rollout_correction", rollout_is="sequence", rollout_is_threshold="0.5_5.0", rollout_is_batch_normalize=True),
    _cfg("icepop"),
    _cfg("calibrated"),
    _cfg("cis"),
]


@pytest.mark.parametrize("cfg", CONFIGS, ids=lambda c: f"{c.name}-{c.rollout_is}-{c.rollout_rs}")
def test_every_correction_is_the_identity_without_mismatch(cfg):
  rng = np.random.default_rng(0)
  logp = -rng.uniform(0.01, 5.0, (6, 7))
  mask = rng.random((6, 7)) > 0.3
  source = [ROW_SOURCE["policy"]] * 4 + [ROW_SOURCE["teacher"], ROW_SOURCE["padding"]]
  out = _apply(cfg, _batch(logp, logp, mask, source))
  np.testing.assert_array_equal(np.asarray(out.weights), 1.0)
  np.testing.assert_array_equal(np.asarray(out.keep), mask)
  if cfg.name != "none":
    assert out.metrics[P + "rollout_rs_masked_fraction"] == 0.0
    assert out.metrics[P + "log_ratio_abs_max"] == 0.0
    np.testing.assert_allclose(out.metrics[P + "rollout_is_eff_sample_size"], 1.0, rtol=1e-6)
    assert all(np.isfinite(v) for v in out.metrics.values())


def test_none_returns_ones_the_loss_mask_and_no_metrics():
  out = _apply(_cfg("none"), _batch(ROLLOUT + LR, ROLLOUT, MASK))
  np.testing.assert_array_equal(np.asarray(out.weights), np.ones((2, 3)))
  np.testing.assert_array_equal(np.asarray(out.keep), MASK)
  assert out.metrics == {} and out.state == {}


def _cores():
  m, s = jnp.asarray(MASK), jnp.zeros(2, jnp.int32)
  rollout = jnp.asarray(ROLLOUT, jnp.float32)
  rs = parse_rollout_rs("token_k1", "0.5_2.0")
  yield lambda o: rollout_correction_weights(o, rollout, m, s, is_level="token", batch_normalize=True, rs=rs)[0]
  yield lambda o: rollout_correction_weights(o, rollout, m, s, is_level="sequence", is_threshold=100.0)[0]
  yield lambda o: rollout_correction_weights(o, rollout, m, s, is_level="sequence", is_threshold="0.3_3.0",
                                             batch_normalize=True)[0]
  yield lambda o: icepop_weights(o, rollout, m, s)[0]
  yield lambda o: calibrated_correction(o, rollout, m, s, calibrated_is.init_state(), sigma_init=1.0)[0]
  yield lambda o: cis_correction(o, rollout, m, s)[0]     # its cap depends on old_logp too: still no gradient


@pytest.mark.parametrize("core", list(_cores()),
                         ids=["token_is", "sequence_is", "sequence_icepop", "icepop", "calibrated", "cis"])
def test_weights_carry_no_gradient(core):
  old = jnp.asarray(ROLLOUT + LR, jnp.float32)
  assert float(jnp.abs(jax.grad(lambda o: core(o).sum())(old)).max()) == 0.0
  # A loss sum(w * old_logp) differentiates to exactly w: nothing flows through w itself.
  np.testing.assert_allclose(np.asarray(jax.grad(lambda o: (core(o) * o).sum())(old)), np.asarray(core(old)))
  assert float(jnp.abs(core(old) - 1.0).max()) > 0.01   # the case really has non-trivial weights


@pytest.mark.parametrize("cfg", CONFIGS[1:], ids=lambda c: f"{c.name}-{c.rollout_is}-{c.rollout_rs}")
def test_non_policy_rows_are_untouched_and_left_out_of_the_metrics(cfg):
  rng = np.random.default_rng(1)
  rollout = -rng.uniform(0.1, 3.0, (6, 5))
  old = rollout + rng.normal(0.0, 0.3, (6, 5))
  mask = rng.random((6, 5)) > 0.2
  source = [ROW_SOURCE["policy"]] * 3 + [ROW_SOURCE["teacher"], ROW_SOURCE["peer"], ROW_SOURCE["padding"]]
  wild = old.copy()
  wild[3:] = rollout[3:] + 15.0 * rng.choice([-1.0, 1.0], (3, 5))   # huge mismatch on the other rows
  full = _apply(cfg, _batch(wild, rollout, mask, source))
  alone = _apply(cfg, _batch(old[:3], rollout[:3], mask[:3]))
  np.testing.assert_array_equal(np.asarray(full.weights[3:]), 1.0)
  np.testing.assert_array_equal(np.asarray(full.keep[3:]), mask[3:])
  np.testing.assert_allclose(np.asarray(full.weights[:3]), np.asarray(alone.weights), rtol=1e-6)
  assert full.metrics.keys() == alone.metrics.keys()
  for k in full.metrics:
    np.testing.assert_allclose(full.metrics[k], alone.metrics[k], rtol=1e-5, atol=1e-7, err_msg=k)


def test_sequence_level_weights_of_4096_token_rows_stay_finite_and_exact():
  r = 4096
  lr = np.zeros((4, r), np.float32)
  lr[0, : r // 2], lr[0, r // 2:] = 0.01, -0.0099   # sum 0.2048
  lr[1] = 0.01                                       # sum 40.96: clamped to 20
  lr[2], lr[3] = -0.05, 0.03                          # naive products underflow to 0 / overflow to inf
  with np.errstate(over="ignore", under="ignore"):
    assert np.prod(np.exp(lr[3])) == np.inf and np.prod(np.exp(lr[2])) < 1e-38   # e^-204.8: not a float32
  batch = _batch(lr, np.zeros((4, r)), np.ones((4, r), bool))
  out = _apply(_cfg("rollout_correction", rollout_is="sequence", rollout_is_threshold="1e9"), batch)
  w = np.asarray(out.weights)
  np.testing.assert_allclose(w[:, 0], [E(0.2048), E(20.0), E(-20.0), E(20.0)], rtol=1e-3)
  assert np.all(w == w[:, :1]) and all(np.isfinite(v) for v in out.metrics.values())
  np.testing.assert_allclose(out.metrics[P + "chi2_seq"], (E(0.4096) + 2 * E(40.0) + E(-40.0)) / 4 - 1, rtol=1e-3)
  # Geometric rejection (seq_mean_k1) on the same rows: ratios r = exp(mean lr) = e^5e-5, e^0.01, e^-0.05, e^0.03.
  # verl 0.9.1 bounds 1/r = e^-0.01 = 0.990 >= 0.99 (kept), e^0.05 = 1.051, e^-0.03 = 0.970 (both rejected); bounding
  # r (the "ratio" convention, these expectations before 0.9.1) rejects e^0.01 = 1.01005 > 1.01 as well.
  out = _apply(_cfg("rollout_correction", rollout_rs="seq_mean_k1", rollout_rs_threshold="0.99_1.01"), batch)
  np.testing.assert_array_equal(np.asarray(out.keep)[:, 0], [True, True, False, False])
  np.testing.assert_allclose(out.metrics[P + "rollout_rs_seq_masked_fraction"], 0.5)
  out = _apply(_cfg("rollout_correction", rollout_rs="seq_mean_k1", rollout_rs_threshold="0.99_1.01",
                    rollout_rs_k1_bounds="ratio"), batch)
  np.testing.assert_array_equal(np.asarray(out.keep)[:, 0], [True, False, False, False])


def test_token_is_truncates_and_logs_verls_metrics():
  out = _small(rollout_is="token")
  w = np.asarray(out.weights)
  np.testing.assert_allclose(w, [[E(0.5), E(-0.2), 2.0], [E(-1.0), E(0.3), 1.0]], rtol=1e-6)
  m = out.metrics
  # verl 0.9.1 takes mean / max / min from the truncated weights (the old snapshot b178a3cd, which these
  # expectations followed before, from the raw ratios: mean RHO[MASK].mean(), max e^1).
  tw = w[MASK]
  np.testing.assert_allclose(m[P + "rollout_is_mean"], tw.mean(), rtol=1e-6)
  np.testing.assert_allclose(m[P + "rollout_is_max"], 2.0, rtol=1e-6)
  np.testing.assert_allclose(m[P + "rollout_is_min"], E(-1.0), rtol=1e-6)
  assert m[P + "rollout_is_ratio_fraction_high"] == pytest.approx(0.2)   # raw e^1 > 2
  assert m[P + "rollout_is_ratio_fraction_low"] == pytest.approx(0.2)    # raw e^-1 < 1/2
  # std and ESS of clip(w, 0, 2) = w (0.9.1; the old snapshot clipped to [1/2, 2], lifting e^-1 to 0.5).
  np.testing.assert_allclose(m[P + "rollout_is_eff_sample_size"], tw.mean() ** 2 / (tw ** 2).mean(), rtol=1e-5)
  np.testing.assert_allclose(m[P + "rollout_is_std"], tw.std(), rtol=1e-5)
  assert P + "rollout_is_oob_ratio" not in m   # IcePop's only
  np.testing.assert_allclose(m[P + "weight_mean"], w[MASK].mean(), rtol=1e-6)


def test_sequence_is_uses_the_row_sum_of_log_ratios():
  out = _small(rollout_is="sequence")
  # Row sums 1.3 -> e^1.3 = 3.67 truncated to 2; -0.7 -> e^-0.7 = 0.4966.
  np.testing.assert_allclose(np.asarray(out.weights), [[2.0, 2.0, 2.0], [E(-0.7), E(-0.7), 1.0]], rtol=1e-6)
  assert out.metrics[P + "rollout_is_ratio_fraction_high"] == pytest.approx(0.5)   # rows, not tokens
  assert out.metrics[P + "rollout_is_ratio_fraction_low"] == pytest.approx(0.5)    # -0.7 < log(1/2)
  np.testing.assert_allclose(out.metrics[P + "rollout_is_max"], E(1.3), rtol=1e-6)


def test_batch_normalisation_means_tokens_for_token_is_and_sequences_for_sequence_is():
  out = _small(rollout_is="token", rollout_is_batch_normalize=True)
  w = np.array([E(0.5), E(-0.2), 2.0, E(-1.0), E(0.3)])
  np.testing.assert_allclose(np.asarray(out.weights)[MASK], w / w.mean(), rtol=1e-5)
  np.testing.assert_allclose(out.metrics[P + "rollout_is_batch_norm_factor"], w.mean(), rtol=1e-6)
  out = _small(rollout_is="sequence", rollout_is_batch_normalize=True)
  factor = (2.0 + E(-0.7)) / 2   # over the 2 sequences; the token-weighted mean would be (3 * 2 + 2 e^-0.7) / 5
  np.testing.assert_allclose(out.metrics[P + "rollout_is_batch_norm_factor"], factor, rtol=1e-6)
  np.testing.assert_allclose(np.asarray(out.weights)[0], 2.0 / factor, rtol=1e-6)
  assert np.asarray(out.weights)[1, 2] == 1.0   # off the mask: untouched


# Token ratios on the mask: [1.65, 0.82, 2.72 | 0.37, 1.35]; k2 = lr^2/2: [.125, .02, .5 | .5, .045];
# k3 = e^lr - 1 - lr: [.149, .019, .718 | .368, .050]; rows: sum lr 1.3 | -0.7, mean .433 | -.35.
# k1 bounds follow verl 0.9.1 (the default rollout_rs_k1_bounds="verl"): they bound 1/r = e^k1. Before 0.9.1
# these cases bounded r; "0.8_3.0" then kept [[1, 1, 1], [0, 1, 0]] (now under rollout_rs_k1_bounds="ratio").
REJECTION_CASES = [
    ("token_k1", "0.5_2.0", [[1, 1, 0], [0, 1, 0]]),
    ("token_k1", "2.0", [[1, 1, 0], [0, 1, 0]]),          # lower = 1/upper
    ("token", "2.0", [[1, 1, 0], [0, 1, 0]]),             # old verl name of token_k1
    ("token_k1", "0.8_3.0", [[0, 1, 0], [1, 0, 0]]),      # 1/r in [0.8, 3]: r in [1/3, 1.25]
    ("seq_sum_k1", "0.45_3.0", [[0, 0, 0], [1, 1, 0]]),   # 1/r: e^-1.3 = 0.27 < 0.45; e^0.7 = 2.01 <= 3
    ("geometric", "0.7_1.5", [[0, 0, 0], [1, 1, 0]]),     # 1/r: e^-0.433 = 0.65 < 0.7; e^0.35 = 1.42 <= 1.5
    ("token_k2", "0.1", [[0, 1, 0], [0, 1, 0]]),
    ("token_k3", "0.1", [[0, 1, 0], [0, 1, 0]]),
    ("seq_sum_k2", "0.6", [[0, 0, 0], [1, 1, 0]]),        # 0.645 | 0.545
    ("seq_mean_k3", "0.25", [[0, 0, 0], [1, 1, 0]]),      # 0.295 | 0.209
    ("seq_max_k3", "0.5", [[0, 0, 0], [1, 1, 0]]),        # 0.718 | 0.368
    ("token_k1,seq_max_k3", "0.5_2.0,0.5", [[0, 0, 0], [0, 1, 0]]),   # both must pass
]


@pytest.mark.parametrize("rs,threshold,keep", REJECTION_CASES, ids=[f"{c[0]}:{c[1]}" for c in REJECTION_CASES])
def test_each_rejection_option_matches_the_hand_computed_mask(rs, threshold, keep):
  out = _small(rollout_rs=rs, rollout_rs_threshold=threshold)
  keep = np.asarray(keep, bool)
  np.testing.assert_array_equal(np.asarray(out.keep), keep)
  np.testing.assert_array_equal(np.asarray(out.weights), np.where(MASK & ~keep, 0.0, 1.0))   # IS off: weight 1
  assert out.metrics[P + "rollout_rs_masked_fraction"] == pytest.approx((MASK & ~keep).sum() / 5)
  assert out.metrics[P + "rollout_rs_seq_masked_fraction"] == pytest.approx((MASK & ~keep).any(-1).mean())


def test_rejection_option_metrics_and_composition_with_is():
  out = _small(rollout_is="token", rollout_rs="token_k1", rollout_rs_threshold="0.5_2.0")
  np.testing.assert_allclose(np.asarray(out.weights), [[E(0.5), E(-0.2), 0.0], [0.0, E(0.3), 1.0]], rtol=1e-6)
  m = out.metrics
  assert m[P + "rollout_rs_token_k1_masked_fraction"] == pytest.approx(0.4)
  assert m[P + "rollout_rs_token_k1_seq_masked_fraction"] == pytest.approx(1.0)
  assert m[P + "rollout_rs_token_k1_mean"] == pytest.approx(-0.6 / 5)   # k1 = -lr
  assert m[P + "rollout_rs_token_k1_max"] == pytest.approx(1.0) and m[P + "rollout_rs_token_k1_min"] == -1.0
  m = _small(rollout_rs="seq_sum_k2", rollout_rs_threshold="0.6").metrics
  assert m[P + "rollout_rs_seq_sum_k2_max"] == pytest.approx(0.645, abs=1e-6)
  assert m[P + "rollout_rs_seq_sum_k2_mean"] == pytest.approx((3 * 0.645 + 2 * 0.545) / 5, abs=1e-6)


def test_token_veto_rejects_the_whole_sequence():
  out = _small(rollout_token_veto_threshold=0.5)   # row 1 has ratio e^-1 = 0.37 < 0.5
  np.testing.assert_array_equal(np.asarray(out.keep), [[True, True, True], [False, False, False]])
  assert out.metrics[P + "rollout_is_veto_fraction"] == pytest.approx(0.5)
  assert out.metrics[P + "rollout_is_catastrophic_token_fraction"] == pytest.approx(0.2)
  assert _small(rollout_token_veto_threshold=0.3).metrics[P + "rollout_rs_masked_fraction"] == 0.0


def test_icepop_masks_outside_the_window_and_keeps_the_raw_ratio_inside():
  batch = _batch(ROLLOUT + LR, ROLLOUT, MASK, [ROW_SOURCE["policy"], ROW_SOURCE["policy"]])
  out = _apply(_cfg("icepop", icepop_low=0.5, icepop_high=2.0), batch)
  np.testing.assert_allclose(np.asarray(out.weights), [[E(0.5), E(-0.2), 0.0], [0.0, E(0.3), 1.0]], rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(out.keep), [[True, True, False], [False, True, False]])
  assert out.metrics[P + "rollout_is_ratio_fraction_high"] == pytest.approx(0.2)
  assert out.metrics[P + "rollout_is_ratio_fraction_low"] == pytest.approx(0.2)
  w = np.array([E(0.5), E(-0.2), E(0.3)])
  np.testing.assert_allclose(out.metrics[P + "rollout_is_eff_sample_size"], w.sum() ** 2 / (3 * (w ** 2).sum()),
                             rtol=1e-5)   # the generic ESS, over the kept tokens
  # verl 0.9.1's rollout_is_mean / _max / _min: of the applied weights over T, 0 on the two rejected tokens (they
  # were of the raw ratios before: mean RHO[MASK].mean(), max e^1, min e^-1).
  assert out.metrics[P + "rollout_is_mean"] == pytest.approx(w.sum() / 5, rel=1e-6)
  assert out.metrics[P + "rollout_is_max"] == pytest.approx(E(0.5), rel=1e-6) and out.metrics[P + "rollout_is_min"] == 0
  out = _apply(_cfg("icepop"), batch)   # defaults [0.5, 5]: only e^-1 leaves; e^1 = 2.72 keeps its weight
  np.testing.assert_allclose(np.asarray(out.weights), [[E(0.5), E(-0.2), E(1.0)], [0.0, E(0.3), 1.0]], rtol=1e-6)


def test_icepop_rejecting_everything_leaves_no_kept_policy_token_and_no_nan():
  source = [ROW_SOURCE["policy"], ROW_SOURCE["policy"], ROW_SOURCE["teacher"]]
  mask = np.vstack([MASK, [True, False, True]])
  out = _apply(_cfg("icepop", icepop_low=10.0, icepop_high=20.0),
               _batch(np.vstack([ROLLOUT + LR, LR[:1]]), np.vstack([ROLLOUT, ROLLOUT[:1]]), mask, source))
  np.testing.assert_array_equal(np.asarray(out.keep), [[False] * 3, [False] * 3, [True, False, True]])
  np.testing.assert_array_equal(np.asarray(out.weights), [[0, 0, 0], [0, 0, 1], [1, 1, 1]])
  assert all(np.isfinite(v) for v in out.metrics.values())
  assert out.metrics[P + "rollout_rs_masked_fraction"] == 1.0 and out.metrics[P + "rollout_is_eff_sample_size"] == 0


# Calibrated case (sigma_init 0.1, eps 0.02, tau_hi 3, tau_lo 6): s = 0.1 (1 - p) + 0.02.
CAL_P = np.array([[0.9, 0.5, 0.1, 0.5, 0.5], [0.5, 0.5, 0.5, 0.5, 0.5]])
CAL_LR = np.array([[0.3, 0.2, -0.7, -0.1, 0.0], [-0.5, 0.1, 0.0, 0.05, 9.0]])
CAL_MASK = np.array([[True] * 5, [True] * 4 + [False]])


def _calibrated(lr=CAL_LR, state=None, **fields):
  rollout = np.log(CAL_P)
  return _apply(_cfg("calibrated", **fields), _batch(rollout + lr, rollout, CAL_MASK), state)


def test_calibrated_truncation_rejection_and_sequence_rule():
  out = _calibrated()
  # Row 0: s = [.03, .07, .11, .07, .07]; token 0: 0.3 > 3 * .03 -> truncated to e^0.09; token 1: 0.2 < 0.21 stays;
  # token 2: -0.7 < -6 * .11 = -0.66 -> rejected; 1/5 rejected is not > 0.2 -> the row stays.
  # Row 1: s = .07; token 0: -0.5 < -0.42 -> rejected; 1/4 > 0.2 -> the whole row is rejected.
  np.testing.assert_allclose(np.asarray(out.weights), [[E(0.09), E(0.2), 0.0, E(-0.1), 1.0], [0, 0, 0, 0, 1.0]],
                             rtol=1e-5)
  np.testing.assert_array_equal(np.asarray(out.keep), [[1, 1, 0, 1, 1], [0, 0, 0, 0, 0]])
  m = out.metrics
  assert m[P + "sigma"] == pytest.approx(0.1)
  assert m[P + "rollout_is_ratio_fraction_high"] == pytest.approx(1 / 9)   # truncated
  assert m[P + "rollout_is_ratio_fraction_low"] == pytest.approx(2 / 9)    # token-rejected
  assert m[P + "rollout_rs_masked_fraction"] == pytest.approx(5 / 9)
  assert m[P + "calibrated_seq_rejected_fraction"] == pytest.approx(0.5)
  assert m[P + "calibrated_weight_bias"] == pytest.approx((E(0.3) - E(0.09)) / 4, rel=1e-5)
  # A looser sequence rule keeps row 1 except its rejected token.
  out = _calibrated(calibrated_max_masked_frac=0.25)
  np.testing.assert_array_equal(np.asarray(out.keep)[1], [0, 1, 1, 1, 0])


def test_calibrated_sigma_is_a_debiased_ema_of_the_batch_median_applied_from_the_next_batch():
  out = _calibrated()
  # |lr| / (1 - p + eps) on the 9 tokens: 2.5, .3846, .7609, .1923, 0 | .9615, .1923, 0, .0962 -> median .1923.
  median = 0.1 / 0.52
  assert out.metrics[P + "sigma_batch"] == pytest.approx(median, rel=1e-5)
  assert set(out.state) == set(calibrated_is.init_state()) and all(v.dtype == np.float32 for v in out.state.values())
  assert out.state["sigma_ema"] == pytest.approx(0.01 * median, rel=1e-5) and out.state["sigma_updates"] == 1
  second = _calibrated(lr=2 * CAL_LR, state=out.state)
  assert second.metrics[P + "sigma"] == pytest.approx(median, rel=1e-5)   # the first batch's median, debiased
  ema = 0.99 * 0.01 * median + 0.01 * (2 * median)
  assert second.state["sigma_ema"] == pytest.approx(ema, rel=1e-5)
  third = _calibrated(state=second.state)
  assert third.metrics[P + "sigma"] == pytest.approx(ema / (1 - 0.99 ** 2), rel=1e-5)
  # The sigma a batch uses moves its rejection bound: row 0's tail token 2 (p = 0.1) is rejected in the second
  # batch (lr -1.4 < -6 (.192 * .9 + .02) = -1.16) and kept in the third (-0.7 > -6 (.289 * .9 + .02) = -1.68).
  assert bool(np.asarray(second.keep)[0, 2]) is False and bool(np.asarray(third.keep)[0, 2]) is True


def test_calibrated_state_is_unchanged_by_a_batch_without_policy_tokens():
  rollout = np.log(CAL_P)
  state = {"sigma_ema": np.float32(0.003), "sigma_updates": np.float32(2.0)}
  out = _apply(_cfg("calibrated"), _batch(rollout + CAL_LR, rollout, CAL_MASK, [ROW_SOURCE["teacher"]] * 2), state)
  assert out.state["sigma_ema"] == np.float32(0.003) and out.state["sigma_updates"] == 2.0
  np.testing.assert_array_equal(np.asarray(out.weights), 1.0)
  assert all(np.isfinite(v) for v in out.metrics.values())


def _cis_reference(train_logp, infer_logp, lam=2.3, kappa=5e-3):
  """kzhao5/CIS-RL's `cis_weight` (cis/operator.py), transcribed to numpy: min(k, 1 + lam max(1 - p, kappa)),
  weight 1 where the log ratio is not finite."""
  with np.errstate(invalid="ignore"):
    log_k = np.asarray(train_logp, np.float64) - np.asarray(infer_logp, np.float64)
  log_k = np.where(np.isfinite(log_k), log_k, 0.0)
  phi = np.maximum(1.0 - np.exp(np.asarray(train_logp, np.float64)), kappa)
  return np.minimum(np.exp(log_k), 1.0 + lam * phi)


def _cis_logps(n=4000, seed=0):
  """Trainer and sampler log-probs of confident and unconfident tokens (the public tests' recipe) with a
  mismatch of either sign, [n // 8, 8]."""
  rng = np.random.default_rng(seed)
  train = -rng.random(n) ** 4 * 8.0
  infer = np.minimum(train - rng.normal(0.0, 0.3, n), 0.0)
  return train.reshape(-1, 8), infer.reshape(-1, 8)


def test_cis_equals_the_published_formula_elementwise():
  train, infer = _cis_logps()
  mask = np.ones(train.shape, bool)
  mask[:3, 5:] = False
  for lam, kappa in ((2.3, 5e-3), (0.7, 0.1), (5.0, 0.0)):
    out = _apply(_cfg("cis", cis_lambda=lam, cis_kappa=kappa), _batch(train, infer, mask))
    ref = _cis_reference(train, infer, lam, kappa)
    np.testing.assert_allclose(np.asarray(out.weights)[mask], ref[mask], rtol=2e-6)
    np.testing.assert_array_equal(np.asarray(out.weights)[~mask], 1.0)
    np.testing.assert_array_equal(np.asarray(out.keep), mask)          # truncation only: nothing rejected
    capped = (np.exp(train - infer) > 1.0 + lam * np.maximum(1.0 - np.exp(train), kappa))[mask]
    assert out.metrics[P + "rollout_is_ratio_fraction_high"] == pytest.approx(capped.mean(), abs=1e-6)
    assert 0.05 < capped.mean() < 0.6 and out.metrics[P + "rollout_rs_masked_fraction"] == 0.0
  # The small case by hand: p = e^old, cap = 1 + 2.3 max(1 - p, 0.005); row 0 token 2 (k = e^1 = 2.72, p = e^-1)
  # is capped at 1 + 2.3 (1 - e^-1) = 2.454, and row 1's second token (k = e^0.3 = 1.35, p = e^-0.9) is not.
  out = _apply(_cfg("cis"), _batch(ROLLOUT + LR, ROLLOUT, MASK))
  np.testing.assert_allclose(np.asarray(out.weights), [[E(0.5), E(-0.2), 1 + 2.3 * (1 - E(-1.0))],
                                                       [E(-1.0), E(0.3), 1.0]], rtol=1e-6)
  # Confident tokens meet the kappa floor: at p = 1 the cap is 1 + 2.3 * 0.005 whatever the ratio; a ratio
  # that is not finite weighs 1 (the public operator's rule).
  out = _apply(_cfg("cis"), _batch([[0.0, -np.inf, -1.0]], [[-0.5, -np.inf, -1.0]], [[True, True, True]]))
  np.testing.assert_allclose(np.asarray(out.weights), [[1.0115, 1.0, 1.0]], rtol=1e-6)


def test_cis_with_lambda_zero_is_tis_capped_at_one():
  train, infer = _cis_logps(seed=1)
  out = _apply(_cfg("cis", cis_lambda=0.0), _batch(train, infer, np.ones(train.shape, bool)))
  np.testing.assert_allclose(np.asarray(out.weights), np.minimum(np.exp(train - infer), 1.0), rtol=2e-6)


@pytest.mark.parametrize("lam, kappa", [(2.3, 5e-3), (1.0, 1.0), (0.5, 0.0)])
def test_cis_never_exceeds_token_tis_when_its_cap_is_at_least_one_plus_lambda(lam, kappa):
  train, infer = _cis_logps(seed=2)
  batch = _batch(train, infer, np.ones(train.shape, bool))
  cis = np.asarray(_apply(_cfg("cis", cis_lambda=lam, cis_kappa=kappa), batch).weights)
  for c in (1.0 + lam, 2.0 * (1.0 + lam), 100.0):
    tis = np.asarray(_apply(_cfg("rollout_correction", rollout_is="token", rollout_is_threshold=str(c)), batch).weights)
    assert np.all(cis <= tis * (1 + 1e-6)), c
  assert np.any(cis < 0.99 * tis)    # ... and truly below it on confident tokens


def test_cis_gradient_flows_through_the_policy_log_prob_only():
  """In the trainer's loss -(w A) logp, d/d logp is -(w A) exactly, and nothing reaches old_logp through w (its
  cap reads the trainer's p, so a missing stop-gradient would show here)."""
  train, infer = _cis_logps(n=64, seed=3)
  old, rollout = jnp.asarray(train, jnp.float32), jnp.asarray(infer, jnp.float32)
  m, s = jnp.ones(old.shape, bool), jnp.zeros(old.shape[0], jnp.int32)
  adv = jnp.asarray(np.random.default_rng(4).normal(size=old.shape), jnp.float32)

  def loss(logp, old_logp):
    w = cis_correction(old_logp, rollout, m, s)[0]
    return -(w * adv * logp).sum()

  d_logp, d_old = jax.grad(loss, argnums=(0, 1))(old, old)
  w = cis_correction(old, rollout, m, s)[0]
  np.testing.assert_allclose(np.asarray(d_logp), -np.asarray(w * adv), rtol=1e-6)
  assert float(jnp.abs(d_old).max()) == 0.0


def test_mismatch_metrics_match_the_hand_computed_small_case():
  m = _small(rollout_is="token").metrics
  lr = LR[MASK]
  assert m[P + "kl"] == pytest.approx(-0.12, abs=1e-6)
  assert m[P + "k3_kl"] == pytest.approx((E(lr) - 1 - lr).mean(), rel=1e-5)
  assert m[P + "chi2_token"] == pytest.approx((E(1.0) + E(-0.4) + E(2.0) + E(-2.0) + E(0.6)) / 5 - 1, rel=1e-5)
  assert m[P + "chi2_seq"] == pytest.approx((E(2.6) + E(-1.4)) / 2 - 1, rel=1e-5)
  assert m[P + "training_log_ppl"] == pytest.approx((2.2 / 3 + 1.1) / 2, rel=1e-5)
  assert m[P + "rollout_log_ppl"] == pytest.approx((3.5 / 3 + 0.75) / 2, rel=1e-5)
  assert m[P + "log_ppl_diff"] == pytest.approx((-1.3 / 3 + 0.35) / 2, abs=1e-6)
  assert m[P + "log_ppl_abs_diff"] == pytest.approx((1.3 / 3 + 0.35) / 2, rel=1e-5)
  assert m[P + "log_ratio_abs_mean"] == pytest.approx(0.6, rel=1e-5)
  assert m[P + "log_ratio_abs_max"] == pytest.approx(1.0, rel=1e-6)
  assert all(isinstance(v, float) and k.startswith(P) for k, v in m.items())


def test_check_accepts_the_defaults_and_valid_specs():
  check(correction_defaults())
  for name in ("none", "rollout_correction", "icepop", "calibrated", "cis"):
    check(_cfg(name, rollout_is="sequence", rollout_rs="token_k1,seq_max_k2, seq_mean_k3",
               rollout_rs_threshold="0.4_1.8,3.0,0.01", rollout_token_veto_threshold=1e-4))
  for spec in ("2", " 1.5 ", "0.5_5.0", "1.0_1.0"):   # verl 0.9.1 allows lower == upper
    check(_cfg("rollout_correction", rollout_is="token", rollout_is_threshold=spec, rollout_rs_k1_bounds="ratio"))
  assert parse_rollout_rs("token_k1,token,seq_sum_k3", "1.5") == (("token_k1", 1 / 1.5, 1.5), ("seq_sum_k3", 0.0, 1.5))
  assert parse_rollout_rs("token_k1", "2.0_2.0") == (("token_k1", 2.0, 2.0),)
  assert parse_rollout_is_threshold("0.5_5.0") == (5.0, 0.5) and parse_rollout_is_threshold(3.0) == (3.0, None)
  with pytest.raises(ValueError, match="boolean"):   # bool is an int; verl refuses it too
    parse_rollout_is_threshold(True)


@pytest.mark.parametrize("fields,words", [
    (dict(name="tis"), ["correction.name", "rollout_correction"]),
    (dict(rollout_is="tok"), ["correction.rollout_is", "token"]),
    (dict(rollout_is_threshold="0.0"), ["correction.rollout_is_threshold", "> 0"]),
    (dict(rollout_is_threshold="0_2"), ["correction.rollout_is_threshold", "> 0"]),
    (dict(rollout_is_threshold="two"), ["correction.rollout_is_threshold", "not a number", "0.5_5.0"]),
    (dict(rollout_is_threshold="5.0_0.5"), ["correction.rollout_is_threshold", "lower bound", "must not exceed"]),
    (dict(rollout_is_threshold=""), ["correction.rollout_is_threshold", "2.0"]),
    (dict(rollout_rs_k1_bounds="inverse"), ["correction.rollout_rs_k1_bounds", "verl", "ratio"]),
    (dict(rollout_rs="token_k4", rollout_rs_threshold="2.0"), ["correction.rollout_rs", "token_k4", "seq_max_k3"]),
    (dict(rollout_rs="token_k1"), ["correction.rollout_rs_threshold", "0.5_2.0"]),
    (dict(rollout_rs="token_k1", rollout_rs_threshold="2.0_0.5"), ["rollout_rs_threshold", "lower", "not exceed"]),
    (dict(rollout_rs="token_k1", rollout_rs_threshold="-2"), ["rollout_rs_threshold", "> 0"]),
    (dict(rollout_rs="token_k1", rollout_rs_threshold="abc"), ["rollout_rs_threshold", "not a number"]),
    (dict(rollout_rs="seq_mean_k3", rollout_rs_threshold="0.1_0.2"), ["seq_mean_k3", "single upper bound"]),
    (dict(rollout_rs="token_k1,token_k2", rollout_rs_threshold="2,3,4"), ["one per option"]),
    (dict(rollout_token_veto_threshold=-1.0), ["correction.rollout_token_veto_threshold", "0 to turn"]),
    (dict(icepop_low=0.0), ["correction.icepop_low"]),
    (dict(icepop_low=2.0, icepop_high=1.0), ["correction.icepop_high", "icepop_low"]),
    (dict(calibrated_tau_lo=-1.0), ["correction.calibrated_tau_lo", "> 0"]),
    (dict(calibrated_max_masked_frac=1.5), ["correction.calibrated_max_masked_frac", "[0, 1]"]),
    (dict(calibrated_sigma_decay=1.0), ["correction.calibrated_sigma_decay", "[0, 1)"]),
    (dict(name="cis", cis_lambda=-0.1), ["correction.cis_lambda", ">= 0", "2.3"]),
    (dict(name="cis", cis_kappa=1.5), ["correction.cis_kappa", "[0, 1]", "5e-3"]),
])
def test_check_rejects_bad_values_naming_the_key(fields, words):
  fields = dict(fields)
  with pytest.raises(ValueError) as e:
    check(_cfg(fields.pop("name", "rollout_correction"), **fields))
  for word in words:
    assert word in str(e.value), (word, str(e.value))


def test_registry_and_every_config_field_documented():
  from rlkit.train.config_docs import field_comments
  assert CORRECTIONS.names() == ["calibrated", "cis", "icepop", "none", "rollout_correction"]
  comments = field_comments(correction_defaults)
  assert set(comments) == set(correction_defaults().keys())
  assert "verl" in comments["rollout_rs_threshold"] and "0.5_2.0" in comments["rollout_rs_threshold"]
  assert "0.9.1" in comments["rollout_is_threshold"] and "lower_upper" in comments["rollout_is_threshold"]
  assert "1/r" in comments["rollout_rs_k1_bounds"] and "ratio" in comments["rollout_rs_k1_bounds"]
