"""Log-probabilities of the chosen tokens under softmax(logits / T), with a one-pass backward.

  logp_t = z_t[y_t] / T - logsumexp(z_t / T)
  d logp_t / d z_t = (onehot(y_t) - softmax(z_t / T)) / T

Autodiff of `take_along_axis(log_softmax(z / T), y)` writes the `[..., V]` log-softmax, scatters the
gather's gradient into a zero `[..., V]` array and then runs the log-softmax backward over it: several
vocabulary-sized passes per step. Here the forward keeps only the `[...]` row max and log-normaliser, and
the backward recomputes softmax from them in one fused pass that also forms the one-hot.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def token_logprobs(logits: Array, tokens: Array, temperature: float = 1.0) -> Array:
  """`[..., V]` logits, `[...]` int token ids -> `[...]` float32 log-probabilities at `temperature`."""
  return _logprobs_and_stats(logits, tokens, temperature)[0]


def _logprobs_and_stats(logits, tokens, temperature):
  """The log-probabilities and the per-row statistics (max, log-normaliser) the backward pass reuses.

  The row max is subtracted before `exp` (float32 stays exact for large logits); the chosen logits are
  gathered unshifted and shifted afterwards, and the backward pass reuses the max instead of computing a
  second vocabulary-sized reduction.
  """
  z = logits.astype(jnp.float32) / temperature
  z_max = jnp.max(z, axis=-1)
  log_norm = jnp.log(jnp.sum(jnp.exp(z - z_max[..., None]), axis=-1))      # logsumexp(z) - max(z)
  z_tok = jnp.take_along_axis(z, tokens[..., None], axis=-1)[..., 0]
  return (z_tok - z_max) - log_norm, (z_max, log_norm)


def _fwd(logits, tokens, temperature):
  logp, stats = _logprobs_and_stats(logits, tokens, temperature)
  return logp, (logits, tokens, stats)


def _bwd(temperature, res, g):
  logits, tokens, (z_max, log_norm) = res
  z = logits.astype(jnp.float32) / temperature
  onehot = jax.lax.broadcasted_iota(jnp.int32, z.shape, z.ndim - 1) == tokens[..., None]
  probs = jnp.exp((z - z_max[..., None]) - log_norm[..., None])
  dz = g[..., None] * (onehot.astype(jnp.float32) - probs) / temperature
  return dz.astype(logits.dtype), None


token_logprobs.defvjp(_fwd, _bwd)
