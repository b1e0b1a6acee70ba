"""Loss aggregation: mode values, empty rows, and micro-batching with global normalisation."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.objectives import AGGREGATIONS
from rlkit.objectives import aggregate
from rlkit.objectives import loss_normalizers
from rlkit.objectives import ppo_clip_loss

MODES = AGGREGATIONS.names()
MAX_LEN = 10
# Jitted: one compile per call signature beats eager per-op compiles on a shared 2-core machine.
_aggregate = jax.jit(aggregate, static_argnames=("mode", "max_len"))


def _randn(seed, shape, scale=1.0):
  return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def test_mode_values_by_hand():
  per_token = jnp.array([[1., 2., 3., 9.], [4., 9., 9., 9.], [9., 9., 9., 9.]])
  mask = jnp.array([[1, 1, 1, 0], [1, 0, 0, 0], [0, 0, 0, 0]], bool)  # third row empty: skipped
  expect = {"token-mean": 10 / 4, "seq-mean-token-mean": (2 + 4) / 2, "seq-mean-token-sum": (6 + 4) / 2,
            "seq-mean-token-sum-norm": 10 / (2 * MAX_LEN), "token-sum": 10}
  for mode, value in expect.items():
    np.testing.assert_allclose(_aggregate(per_token, mask, mode, max_len=MAX_LEN), value, rtol=1e-6)
    # Dropping the empty row changes nothing.
    np.testing.assert_allclose(_aggregate(per_token[:2], mask[:2], mode, max_len=MAX_LEN), value, rtol=1e-6)


def test_token_mean_equals_seq_mean_token_mean_iff_lengths_equal():
  per_token = _randn(0, (4, 6))
  equal = np.arange(6)[None, :] < np.array([4, 4, 4, 4])[:, None]
  unequal = np.arange(6)[None, :] < np.array([6, 1, 3, 4])[:, None]
  np.testing.assert_allclose(_aggregate(per_token, equal, "token-mean"),
                             _aggregate(per_token, equal, "seq-mean-token-mean"), rtol=1e-6)
  assert not np.isclose(_aggregate(per_token, unequal, "token-mean"),
                        _aggregate(per_token, unequal, "seq-mean-token-mean"), rtol=1e-3)


def test_masked_nan_ignored_and_empty_batch_is_zero():
  per_token = jnp.array([[1.0, jnp.nan]])
  mask = jnp.array([[True, False]])
  for mode in MODES:
    assert np.isfinite(aggregate(per_token, mask, mode, max_len=MAX_LEN))
    assert aggregate(per_token, jnp.zeros_like(mask), mode, max_len=MAX_LEN) == 0.0


def test_sum_norm_needs_max_len():
  with pytest.raises(ValueError, match="max_len"):
    aggregate(jnp.ones((1, 2)), jnp.ones((1, 2), bool), "seq-mean-token-sum-norm")


def _batch():
  n, t = 8, 5
  lengths = np.array([5, 2, 0, 4, 1, 5, 3, 0])  # unequal, with two empty rows
  mask = np.arange(t)[None, :] < lengths[:, None]
  old_logp = _randn(1, (n, t)) - 2.0
  logp = old_logp + _randn(2, (n, t), 0.3)
  adv = _randn(3, (n,))
  return tuple(jnp.asarray(x) for x in (logp, old_logp, adv, mask))


@pytest.mark.parametrize("mode", MODES)
def test_micro_batching_with_global_normalisation_matches_full_batch(mode):
  logp, old_logp, adv, mask = _batch()
  normalizers = loss_normalizers(mask)

  def loss(lp, olp, a, m, normalizers):
    per_token, _ = ppo_clip_loss(lp, olp, a, m, eps_high=0.28)
    return aggregate(per_token, m, mode, max_len=MAX_LEN, **normalizers)

  def split_loss(lp, num_micro, normalizers):
    # Row-contiguous micro-batches [num_micro, 8 // num_micro, ...], each reduced on its own, then summed.
    micro = [x.reshape(num_micro, -1, *x.shape[1:]) for x in (lp, old_logp, adv, mask)]
    return jax.vmap(lambda *xs: loss(*xs, normalizers))(*micro).sum()

  @jax.jit  # one compile for all splits: eager dispatch or one jit per split shape is several times slower
  def values_and_grads(lp):
    full = jax.value_and_grad(split_loss)(lp, 1, {})  # no global counts: the plain full-batch loss
    splits = [jax.value_and_grad(split_loss)(lp, k, normalizers) for k in (1, 2, 4, 8)]
    # Local normalisation (the bug global counts prevent): each micro-batch uses its own counts.
    local = split_loss(lp, 4, {}) / 4
    return full, splits, local

  (full_value, full_grad), splits, local = values_and_grads(logp)
  assert np.abs(np.asarray(full_grad)).max() > 1e-3
  for value, grad in splits:
    np.testing.assert_allclose(value, full_value, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad, full_grad, rtol=1e-6, atol=1e-7)
  assert not np.isclose(local, full_value, rtol=1e-3)


def test_token_sum_is_additive_over_micro_batches_without_global_counts():
  logp, old_logp, adv, mask = _batch()

  def loss(lp, olp, a, m):
    per_token, _ = ppo_clip_loss(lp, olp, a, m, eps_high=0.28)
    return aggregate(per_token, m, "token-sum")

  @jax.jit
  def values_and_grads(lp):
    full = jax.value_and_grad(loss)(lp, old_logp, adv, mask)
    def split(lp, k):
      micro = [x.reshape(k, -1, *x.shape[1:]) for x in (lp, old_logp, adv, mask)]
      return jax.vmap(loss)(*micro).sum()
    return full, [jax.value_and_grad(split)(lp, k) for k in (2, 4, 8)]

  (full_value, full_grad), splits = values_and_grads(logp)
  per_token, _ = ppo_clip_loss(logp, old_logp, adv, mask, eps_high=0.28)
  np.testing.assert_allclose(full_value, np.where(mask, per_token, 0.0).sum(), rtol=1e-6)
  # A plain sum: the gradient on a token is the per-token gradient itself, with no normaliser.
  g_token = jax.grad(lambda lp: ppo_clip_loss(lp, old_logp, adv, mask, eps_high=0.28)[0].sum())(logp)
  np.testing.assert_allclose(full_grad, g_token, rtol=1e-6, atol=1e-7)
  for value, grad in splits:
    np.testing.assert_allclose(value, full_value, rtol=1e-6, atol=1e-7)
    np.testing.assert_allclose(grad, full_grad, rtol=1e-6, atol=1e-7)
