"""token_logprobs: value and gradient equal log_softmax + gather under autodiff, at any temperature."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.objectives import token_logprobs


def _plain(logits, tokens, temperature):
  logp = jax.nn.log_softmax(logits.astype(jnp.float32) / temperature, axis=-1)
  return jnp.take_along_axis(logp, tokens[..., None], axis=-1)[..., 0]


@pytest.mark.parametrize("temperature", [1.0, 0.7])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_token_logprobs_value_and_gradient_equal_autodiff(temperature, dtype):
  logits = (jax.random.normal(jax.random.key(0), (3, 5, 11)) * 4.0).astype(dtype)
  tokens = jax.random.randint(jax.random.key(1), (3, 5), 0, 11)
  cot = jax.random.normal(jax.random.key(2), (3, 5))
  for offset in (0.0, 1e3):   # a large common offset: the row max must be subtracted before exp
    ours = token_logprobs(logits + offset, tokens, temperature)
    assert ours.dtype == jnp.float32
    np.testing.assert_allclose(ours, _plain(logits + offset, tokens, temperature), rtol=1e-5, atol=1e-5)
  g = jax.grad(lambda z: jnp.sum(token_logprobs(z, tokens, temperature) * cot))(logits)
  g_ref = jax.grad(lambda z: jnp.sum(_plain(z, tokens, temperature) * cot))(logits)
  assert g.dtype == dtype
  tol = 1e-6 if dtype == jnp.float32 else 1e-2
  np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(g_ref, np.float32), atol=tol)


def test_masked_vocabulary_entries_get_zero_gradient():
  logits = jnp.array([[0.5, -jnp.inf, 1.0, 2.0]])
  g = jax.grad(lambda z: token_logprobs(z, jnp.array([2]))[0])(logits)
  assert np.all(np.isfinite(g)) and g[0, 1] == 0.0
  np.testing.assert_allclose(jnp.sum(g), 0.0, atol=1e-6)   # onehot - softmax sums to zero
