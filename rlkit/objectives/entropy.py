"""Per-token entropy of the policy's next-token distribution, for entropy bonuses and collapse monitoring.

  H_t = -sum_v p_v log p_v,   log p = log_softmax(z)

Computed from `log_softmax` (stable for any logit scale). Logits of -inf (vocabulary masking) are allowed:
their `p log p` term is taken as 0, the limit, instead of 0 * -inf = NaN, in the value and the gradient.
Low-precision logits are upcast to float32 first, since the sum runs over the whole vocabulary.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rlkit.objectives.aggregation import aggregate


def token_entropy(logits: jax.Array) -> jax.Array:
  """`[..., V]` logits -> `[...]` entropy in nats (e.g. `[N, T, V] -> [N, T]`)."""
  logits = logits.astype(jnp.promote_types(logits.dtype, jnp.float32))
  logp = jax.nn.log_softmax(logits, axis=-1)
  p = jnp.exp(logp)
  # Zeroing logp where p == 0 (before the product) keeps the -inf out of both value and gradient.
  logp = jnp.where(p > 0, logp, 0.0)
  return -(p * logp).sum(axis=-1)


def mean_token_entropy(logits: jax.Array, mask: jax.Array) -> jax.Array:
  """Masked token mean of `token_entropy`: `[N, T, V]`, `[N, T]` -> scalar (0 if nothing is masked in)."""
  return aggregate(token_entropy(logits), mask, "token-mean")
