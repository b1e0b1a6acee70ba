"""Token entropy: matches the definition, stable for large logits, finite with -inf logits."""
import jax
import jax.numpy as jnp
import numpy as np

from rlkit.objectives import mean_token_entropy
from rlkit.objectives import token_entropy

_entropy = jax.jit(token_entropy)  # one compile instead of eager per-op compiles


def _randn(seed, shape, scale=1.0):
  return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def test_matches_definition_and_uniform_limit():
  logits = _randn(0, (2, 3, 11), 2.0)
  z = np.asarray(logits, np.float64)
  p = np.exp(z - z.max(-1, keepdims=True))
  p /= p.sum(-1, keepdims=True)
  np.testing.assert_allclose(token_entropy(logits), -(p * np.log(p)).sum(-1), rtol=1e-5)
  np.testing.assert_allclose(token_entropy(jnp.zeros((1, 1, 11))), [[np.log(11)]], rtol=1e-6)


def test_stable_for_large_and_masked_logits():
  logits = jnp.asarray(_randn(1, (1, 2, 5)))
  big = logits + 1e4  # exp would overflow without the max subtraction in log_softmax
  np.testing.assert_allclose(_entropy(big), _entropy(big - 1e4), rtol=1e-6)
  masked = logits.at[..., 3:].set(-jnp.inf)
  h, grad = jax.jit(jax.value_and_grad(lambda z: token_entropy(z).sum()))(masked)
  np.testing.assert_allclose(h, _entropy(logits[..., :3]).sum(), rtol=1e-6)
  assert np.all(np.isfinite(grad))
  np.testing.assert_allclose(token_entropy(jnp.array([0.0, -jnp.inf])), 0.0, atol=1e-7)


def test_masked_mean():
  logits = _randn(2, (2, 3, 4))
  mask = np.array([[True, False, False], [True, True, False]])
  h = np.asarray(token_entropy(logits))
  np.testing.assert_allclose(mean_token_entropy(logits, mask), h[mask].mean(), rtol=1e-6)
