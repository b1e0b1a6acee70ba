"""MiMo-V2.6's graders (rlkit/rewards/graders.py) and the `gar` estimator (rlkit/train/gar.py): GAR keeps the
passing set's advantage mass before the cap and a zero group mean after it, is the identity at quality 1 and
falls back where the grader is unusable; the length penalty's anchor is a quantile of the passing lengths;
segment flags mask or amplify with each row's mass conserved; the estimator wires the reward's pieces."""
import types

import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlkit.core.labels import SEGMENT_KINDS
from rlkit.rewards.graders import flag_weights, gar_advantages, grs_rewards, length_penalties
from rlkit.train import gar
from rlkit.train.phases.advantages import RewardArrays, TOKEN_ESTIMATORS


def _mixed_group():
  rewards = np.array([1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 1.0, 0.0])
  quality = np.array([1.0, 0.5, 0.2, 0.9, 0.9, 0.9, 0.8, 0.9])
  return rewards, rewards > 0.5, quality


def test_grs_is_the_product():
  np.testing.assert_allclose(grs_rewards([1.0, 0.5], [0.5, 1.0], [1.0, 0.5]), [0.5, 0.25])


def test_gar_keeps_the_passing_mass_before_the_cap_and_recentres_after():
  r, p, f = _mixed_group()
  a = r - r.mean()
  uncapped = np.asarray(gar_advantages(r, p, f, 8, lam_cap=100.0))
  np.testing.assert_allclose(uncapped[p].sum(), a[p].sum(), rtol=1e-6)
  lam = a[p].sum() / (f[p] * a[p]).sum()
  want = np.where(p, lam * f * a, a)
  np.testing.assert_allclose(uncapped, want - want.mean(), atol=1e-6)
  capped = np.asarray(gar_advantages(r, p, f, 8, lam_cap=1.2))
  assert lam > 1.2 and abs(capped.mean()) < 1e-6
  shaped = np.where(p, 1.2 * f * a, a)
  np.testing.assert_allclose(capped, shaped - shaped.mean(), atol=1e-6)
  assert capped[0] > capped[1] > capped[2] > 0 > capped[3]   # quality orders the passing rows


def test_gar_is_centred_rewards_at_quality_one_and_falls_back_where_it_cannot_apply():
  r, p, f = _mixed_group()
  np.testing.assert_allclose(gar_advantages(r, p, np.ones(8), 8, 2.0), r - r.mean(), atol=1e-6)
  bad = f.copy()
  bad[1] = 0.0                                                # unusable grader output on a passing row
  np.testing.assert_allclose(gar_advantages(r, p, bad, 8, 2.0), r - r.mean(), atol=1e-6)
  everyone = np.ones(8)
  np.testing.assert_allclose(gar_advantages(everyone, everyone > 0, f, 8, 2.0), np.zeros(8))
  two_groups = gar_advantages(np.concatenate([r, r]), np.concatenate([p, p]), np.concatenate([f, f]), 8, 2.0)
  np.testing.assert_allclose(two_groups[:8], two_groups[8:], atol=1e-6)   # groups are independent


def test_gar_leaves_padding_rows_out():
  r, p, f = _mixed_group()
  valid = np.array([True] * 6 + [False] * 2)
  out = np.asarray(gar_advantages(r, p, f, 8, 100.0, valid=jnp.asarray(valid)))
  assert np.all(out[~valid] == 0) and abs(out[valid].mean()) < 1e-6
  np.testing.assert_allclose(out[:6], np.asarray(gar_advantages(r[:6], p[:6], f[:6], 6, 100.0)), atol=1e-6)


def test_length_penalty_anchors_on_a_quantile_of_passing_lengths():
  lengths = np.array([10, 20, 30, 40, 100, 5, 5, 5])
  passed = np.array([True] * 5 + [False] * 3)
  out = np.asarray(length_penalties(lengths, passed, 8, pass_rate_min=0.5, anchor_quantile=0.3, coef=0.1))
  anchor = np.quantile(lengths[:5], 0.3)
  want = np.where(passed, -0.1 * np.maximum(lengths - anchor, 0) / anchor, 0.0)
  np.testing.assert_allclose(out, want, rtol=1e-6)
  assert out[0] == 0 and out[4] < out[3] < 0
  assert np.all(np.asarray(length_penalties(lengths, passed, 8, 0.7, 0.3, 0.1)) == 0)   # pass rate 5/8 < 0.7


def test_flags_mask_positive_rows_amplify_negative_rows_and_conserve_mass():
  adv = np.array([[1.0] * 6, [-1.0] * 6, [1.0] * 6])
  flagged = np.array([[0, 0, 1, 1, 0, 0], [0, 0, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1]], bool)
  mask = np.ones((3, 6), bool)
  out = np.asarray(flag_weights(adv, flagged, mask, amplify=3.0))
  np.testing.assert_allclose(out.sum(1)[:2], adv.sum(1)[:2], rtol=1e-6)
  assert np.all(out[0, 2:4] == 0) and np.all(out[0, [0, 1, 4, 5]] == pytest.approx(1.5))
  assert out[1, 2] == pytest.approx(3 * out[1, 0]) and out[1, 0] < 0
  assert np.all(out[2] == 0)                                   # a positive row flagged everywhere: no signal


def _section(**fields):
  g = gar.gar_defaults()
  g.update(fields)
  return ml_collections.ConfigDict({"gar": g, "adv_eps": 1e-6})


def test_the_estimator_wires_correct_quality_lengths_and_flags():
  r, p, f = _mixed_group()
  segments = np.full((8, 4), SEGMENT_KINDS["summary"])
  segments[:, :2] = SEGMENT_KINDS["tool_call"]
  batch = types.SimpleNamespace(loss_mask=jnp.ones((8, 4), bool), segment_ids=jnp.asarray(segments))
  flag = np.zeros(8)
  flag[[0, 3]] = 1.0
  arrays = RewardArrays(jnp.asarray(r, jnp.float32), jnp.asarray(p), {"quality": jnp.asarray(f, jnp.float32),
                        "flag_tool_call": jnp.asarray(flag, jnp.float32)}, None)
  fn = TOKEN_ESTIMATORS.get("gar").fn
  tokens, _ = fn(arrays, batch, _section(flag_kinds="tool_call"), 8, None)
  rows = np.asarray(gar_advantages(r, p, f, 8, 2.0))
  np.testing.assert_allclose(np.asarray(tokens).sum(1), rows * 4, rtol=1e-5)     # mass conserved per row
  assert np.all(np.asarray(tokens)[0, :2] == 0) and np.asarray(tokens)[3, 0] < np.asarray(tokens)[3, 3] < 0
  np.testing.assert_allclose(np.asarray(tokens)[1], rows[1], rtol=1e-6)           # unflagged rows untouched
  with pytest.raises(ValueError, match="component 'missing'"):
    fn(arrays, batch, _section(quality="missing"), 8, None)
  with pytest.raises(ValueError, match="needs the reward's `correct`"):
    fn(arrays._replace(correct=None), batch, _section(), 8, None)


@pytest.mark.parametrize("fields,match", [({"flag_kinds": "tool"}, "not a segment kind"),
                                          ({"lam_cap": 0.0}, "lam_cap=0.0 is out of range"),
                                          ({"anchor_quantile": 1.5}, "anchor_quantile=1.5"),
                                          ({"amplify": 0.5}, "amplify=0.5")])
def test_the_checks_name_the_key(fields, match):
  with pytest.raises(ValueError, match=match):
    gar.check(_section(**fields), "rl")


def test_every_gar_field_acts():
  r, p, f = _mixed_group()
  mask = np.zeros((8, 6), bool)
  for i, n in enumerate([6, 3, 5, 4, 6, 2, 4, 5]):
    mask[i, :n] = True
  segments = np.full((8, 6), SEGMENT_KINDS["summary"])
  segments[:, :2] = SEGMENT_KINDS["tool_call"]
  batch = types.SimpleNamespace(loss_mask=jnp.asarray(mask), segment_ids=jnp.asarray(segments))
  flag = np.zeros(8)
  flag[[0, 3]] = 1.0
  arrays = RewardArrays(jnp.asarray(r, jnp.float32), jnp.asarray(p), {"quality": jnp.asarray(f, jnp.float32),
                        "flag_tool_call": jnp.asarray(flag, jnp.float32)}, None)
  fn = TOKEN_ESTIMATORS.get("gar").fn
  base_fields = dict(length_coef=0.1, flag_kinds="tool_call", pass_rate_min=0.5)
  base = np.asarray(fn(arrays, batch, _section(**base_fields), 8, None)[0])
  flips = {"quality": "", "lam_cap": 1.05, "scale": True, "length_coef": 0.5, "pass_rate_min": 0.9,
           "anchor_quantile": 0.9, "flag_kinds": "", "amplify": 4.0}
  for key, value in flips.items():
    flipped = np.asarray(fn(arrays, batch, _section(**{**base_fields, key: value}), 8, None)[0])
    assert not np.allclose(flipped, base), key
