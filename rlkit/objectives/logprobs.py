"""Log-probabilities of the chosen tokens under softmax(logits / T), with a one-pass backward.

  logp_t = z_t[y_t] / T - logsumexp(z_t / T)
  d logp_t / d z_t = (onehot(y_t) - softmax(z_t / T)) / T

Autodiff of `take_along_axis(log_softmax(z / T), y)` writes the `[..., V]` log-softmax, scatters the
gather's gradient into a zero `[..., V]` array and then runs the log-softmax backward over it: several
vocabulary-sized passes per step. Here the forward keeps only the `[...]` log-normaliser, and the backward
recomputes softmax from it in one fused pass (with the row max) that also forms the one-hot.
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp

Array = jax.Array


@functools.partial(jax.custom_vjp, nondiff_argnums=(2,))
def token_logprobs(logits: Array, tokens: Array, temperature: float = 1.0) -> Array:
  """`[..., V]` logits, `[...]` int token ids -> `[...]` float32 log-probabilities at `temperature`."""
  return _logprobs_and_shift(logits, tokens, temperature)[0]


def _shifted(logits, temperature):
  """z - max(z) with z = logits / T: subtracting the row max first keeps float32 exact for large logits."""
  z = logits.astype(jnp.float32) / temperature
  return z - jnp.max(z, axis=-1, keepdims=True)


def _logprobs_and_shift(logits, tokens, temperature):
  zs = _shifted(logits, temperature)
  log_norm = jnp.log(jnp.sum(jnp.exp(zs), axis=-1))                 # logsumexp(z) - max(z)
  return jnp.take_along_axis(zs, tokens[..., None], axis=-1)[..., 0] - log_norm, log_norm


def _fwd(logits, tokens, temperature):
  logp, log_norm = _logprobs_and_shift(logits, tokens, temperature)
  return logp, (logits, tokens, log_norm)


def _bwd(temperature, res, g):
  logits, tokens, log_norm = res
  zs = _shifted(logits, temperature)
  onehot = jax.lax.broadcasted_iota(jnp.int32, zs.shape, zs.ndim - 1) == tokens[..., None]
  dz = g[..., None] * (onehot.astype(jnp.float32) - jnp.exp(zs - log_norm[..., None])) / temperature
  return dz.astype(logits.dtype), None


token_logprobs.defvjp(_fwd, _bwd)
