"""Off-policy corrections: truncated IS weights, their metrics, and the identity `none`."""
import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.core.types import TrainBatch
from rlkit.objectives.corrections import CORRECTIONS, _truncated_is


def _batch(old, rollout, mask):
  n, r = old.shape
  z = jnp.zeros((n, r))
  return TrainBatch(tokens=jnp.zeros((n, r + 2), jnp.int32), attention_mask=jnp.ones((n, r + 2), bool),
                    loss_mask=jnp.asarray(mask), old_logp=jnp.asarray(old, jnp.float32),
                    rollout_logp=jnp.asarray(rollout, jnp.float32), advantages=z, token_weights=jnp.ones((n, r)),
                    group_ids=jnp.zeros(n, jnp.int32), row_source=jnp.zeros(n, jnp.int32))


def test_tis_weights_are_truncated_ratios_on_the_mask():
  rng = np.random.default_rng(0)
  old, rollout = -rng.uniform(0.1, 3, (4, 6)), -rng.uniform(0.1, 3, (4, 6))
  mask = rng.random((4, 6)) > 0.3
  cfg = ml_collections.ConfigDict({"correction_cap": 2.0})
  w, m = CORRECTIONS.get("tis")(_batch(old, rollout, mask), cfg)
  ratio = np.exp(old - rollout)
  np.testing.assert_allclose(np.asarray(w), np.where(mask, np.minimum(ratio, 2.0), 0.0), rtol=1e-5)
  np.testing.assert_allclose(m["correction/truncated_frac"], np.mean(ratio[mask] > 2.0), rtol=1e-6)
  np.testing.assert_allclose(m["correction/ratio_max"], ratio[mask].max(), rtol=1e-5)
  wm = np.minimum(ratio, 2.0)[mask]
  np.testing.assert_allclose(m["correction/ess_frac"], wm.sum() ** 2 / (wm.size * (wm ** 2).sum()), rtol=1e-5)


def test_tis_weights_carry_no_gradient_and_none_is_the_identity():
  old, rollout, mask = np.full((2, 3), -1.0), np.full((2, 3), -1.5), np.ones((2, 3), bool)
  cfg = ml_collections.ConfigDict({"correction_cap": 5.0})
  grad = jax.grad(lambda o: _truncated_is(o, jnp.asarray(rollout), jnp.asarray(mask), 5.0)[0].sum())(
      jnp.asarray(old))
  assert float(jnp.abs(grad).max()) == 0.0
  b = _batch(old, rollout, mask)
  w, m = CORRECTIONS.get("none")(b, cfg)
  assert w is b.token_weights and m == {}
