"""The distribution the sampler draws each token from, and the draw itself.

Given a row's raw logits l [V], the sampler draws from p = softmax(processed_logits(l)): l / temperature,
then every token below the k-th largest value (top-k) and outside the nucleus (top-p: the smallest set of
the largest tokens whose mass reaches top_p, ties kept) set to -inf, and renormalised. The log-probability
RL needs for a sampled token is log p(token) under exactly this distribution; greedy decoding is a point
mass, so for it we report the model's own log-probability at temperature 1 (`processed_logprobs`).
`rlkit.rollout.scoring` re-scores sequences with the same processing, which is what the trainer/sampler
mismatch metric compares.

Two pieces are written for XLA:CPU's decode step: the nucleus is found by bisection over float32 values
instead of a sort (`nucleus_threshold`), and a token is drawn by a two-level inverse CDF of one uniform
instead of V Gumbels (`sample_categorical`). `rlkit.rollout.sampler` (generate) and
`rlkit.rollout.resumable` (prefill / decode_until / append) draw with them.
"""
from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How to sample. Hashable: it is a static argument of the jitted sampler (`generate`, `decode_until`)."""
  max_new_tokens: int
  temperature: float = 1.0
  top_k: int = 0                      # 0 disables top-k
  top_p: float = 1.0                  # 1.0 disables nucleus sampling
  greedy: bool = False
  stop_ids: tuple[int, ...] = ()      # a row finishes after emitting any of these (the token is kept)
  pad_id: int = 0

  def __post_init__(self):
    if self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens={self.max_new_tokens} must be >= 1.")
    if not self.greedy and self.temperature <= 0:
      raise ValueError(f"temperature={self.temperature} must be > 0 (use greedy=True for argmax decoding).")
    if self.top_k < 0:
      raise ValueError(f"top_k={self.top_k} must be >= 0 (0 disables it).")
    if not 0 < self.top_p <= 1:
      raise ValueError(f"top_p={self.top_p} must be in (0, 1] (1 disables it).")


def processed_logits(logits: Array, cfg: SamplingConfig) -> Array:
  """Unnormalised log-probabilities of the distribution tokens are drawn from. logits: [..., V] -> [..., V].

  Temperature applied (greedy: the raw logits); tokens removed by top-k / top-p get -inf. Top-k keeps every
  token whose logit ties the k-th largest; top-p keeps the smallest prefix of the sorted distribution whose
  mass reaches `top_p` (always at least one token), again with ties at the boundary kept.
  """
  x = logits.astype(jnp.float32)
  if cfg.greedy:
    return x
  x = x / cfg.temperature
  neg_inf = jnp.asarray(-jnp.inf, x.dtype)
  if cfg.top_k and cfg.top_k < x.shape[-1]:
    kth = jax.lax.top_k(x, cfg.top_k)[0][..., -1:]
    x = jnp.where(x < kth, neg_inf, x)
  if cfg.top_p < 1.0:
    x = jnp.where(x < nucleus_threshold(x, cfg.top_p), neg_inf, x)
  return x


def _orderable(x: Array) -> Array:
  """float32 -> int32 keys ordered like the floats (negative floats get their 31 low bits flipped). An
  involution: applied to keys it gives back the float32 bit patterns."""
  bits = jax.lax.bitcast_convert_type(x, jnp.int32)
  return bits ^ ((bits >> 31) & 0x7FFFFFFF)


def _from_orderable(k: Array) -> Array:
  return jax.lax.bitcast_convert_type(k ^ ((k >> 31) & 0x7FFFFFFF), jnp.float32)


_VALUE_SPLITS = 8


def nucleus_threshold(x: Array, top_p: float) -> Array:
  """The smallest value kept by top-p: `x >= threshold` is the nucleus. x: [..., V] float32 -> [..., 1].

  The nucleus is the smallest prefix of the descending sort whose mass reaches `top_p`, ties at the boundary
  kept, so the threshold t is the smallest token value whose strictly-greater mass S(t) = sum_{x > t} p is
  still below `top_p`. S is non-increasing, so that is the smallest float32 t with S(t) < top_p, found without
  sorting by bisection over the float32 values in the order of their int32 keys (`_orderable`): 25-32
  passes, each one masked sum over the row (O(V), 1-2 ms at [16, 151936] on 2 CPU cores, where the sort
  took ~700 ms). Every float between two adjacent token values has the same S, so the bisection lands on a
  token value. The bracket starts at (key(min finite) - 1, key(max)]: S(max) = 0 < top_p, and below every
  token S is the whole mass. -inf tokens (top-k, masks) have no mass and are never kept; a row that is all
  -inf gets threshold -inf (nothing changes). No gradient flows through the threshold.
  """
  x = jax.lax.stop_gradient(x.astype(jnp.float32))
  m = jnp.max(x, axis=-1, keepdims=True)
  e = jnp.exp(x - m)                                                       # unnormalised p; 0 at -inf
  target = jnp.float32(top_p) * jnp.sum(e, axis=-1, keepdims=True)
  lo = _orderable(jnp.min(jnp.where(x == -jnp.inf, m, x), axis=-1, keepdims=True)) - 1   # S(lo) = all
  hi = _orderable(m)                                                       # S(hi) = 0 < target

  def cond(c):
    _, lo, hi = c
    return jnp.any(lo + 1 < hi)

  def body(c):
    i, lo, hi = c
    active = lo + 1 < hi
    mid = (lo & hi) + ((lo ^ hi) >> 1)                  # floor((lo + hi) / 2) without int32 overflow
    # A bracket around 0 spans ~2^31 keys, most of them tiny floats no logit has: the first few splits of
    # such a bracket take the value midpoint instead (~6 passes fewer on logits, the same answer). Capped
    # at _VALUE_SPLITS so a huge |logit| cannot make the search longer than 32 + _VALUE_SPLITS passes.
    halfway = _orderable(0.5 * _from_orderable(lo) + 0.5 * _from_orderable(hi))
    mid = jnp.where((i < _VALUE_SPLITS) & (lo < -1) & (hi > 0), jnp.clip(halfway, lo + 1, hi - 1), mid)
    s = jnp.sum((x > _from_orderable(mid)).astype(jnp.float32) * e, axis=-1, keepdims=True)
    below = s < target                                  # mid is at or above the threshold
    return i + 1, jnp.where(active & ~below, mid, lo), jnp.where(active & below, mid, hi)

  _, _, hi = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), lo, hi))
  return _from_orderable(hi)


def nucleus_reference(x: Array, top_p: float) -> Array:
  """The sort-based nucleus (`processed_logits` before `nucleus_threshold`): [..., V] logits with the tokens
  outside the top-p mass set to -inf. The reference the bisection is tested and benchmarked against."""
  sorted_x = jnp.sort(x, axis=-1)[..., ::-1]
  sorted_p = jax.nn.softmax(sorted_x, axis=-1)
  mass_before = jnp.cumsum(sorted_p, axis=-1) - sorted_p
  threshold = jnp.min(jnp.where(mass_before < top_p, sorted_x, jnp.inf), axis=-1, keepdims=True)
  return jnp.where(x < threshold, -jnp.inf, x)


def processed_logprobs(logits: Array, cfg: SamplingConfig) -> Array:
  """Log-probabilities of the distribution tokens are drawn from (`processed_logits`, renormalised).

  Greedy decoding is a point mass; for it this is the model's own log-softmax at temperature 1.
  """
  return jax.nn.log_softmax(processed_logits(logits, cfg), axis=-1)


def sample_categorical(u: Array, weights: Array, block: int = 64) -> Array:
  """One exact draw per row from `weights` [B, V] (>= 0, unnormalised) by inverse CDF of `u` [B] in [0, 1).

  Why not `jax.random.categorical`: its Gumbel trick needs V random numbers per row, and on CPU drawing them
  dominated the decode step (6.1 ms vs 0.45 ms per step at B=64, V=4096). Two-level search: pick the block
  of `block` tokens whose cumulative mass first reaches (1 - u) x total, then the token inside it. That
  target lies in (0, total] and is clipped into the chosen block's own mass, so a zero-weight token (masked
  by top-k/top-p) can never be returned, whatever the float rounding.
  """
  b, v = weights.shape
  nb = -(-v // block)
  p = jnp.pad(weights.astype(jnp.float32), ((0, 0), (0, nb * block - v))).reshape(b, nb, block)
  block_cdf = jnp.cumsum(p.sum(-1), axis=-1)                                  # [B, nb]
  u = (1.0 - u.astype(jnp.float32)) * block_cdf[:, -1]                       # in (0, total]
  j = jnp.minimum(jnp.sum(block_cdf < u[:, None], axis=-1), nb - 1)
  prev = jnp.where(j > 0, jnp.take_along_axis(block_cdf, jnp.maximum(j - 1, 0)[:, None], -1)[:, 0], 0.0)
  inner = jnp.cumsum(jnp.take_along_axis(p, j[:, None, None], axis=1)[:, 0], axis=-1)   # [B, block]
  u_in = jnp.clip(u - prev, jnp.finfo(jnp.float32).tiny, inner[:, -1])
  i = jnp.minimum(jnp.sum(inner < u_in[:, None], axis=-1), block - 1)
  return (j * block + i).astype(jnp.int32)

