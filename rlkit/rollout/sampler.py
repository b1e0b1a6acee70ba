"""KV-cache sampler: batched generation that returns exactly what RL needs, as a `Rollout`.

One jitted function: prefill the (left-padded) prompts into a KV cache and sample each row's first token,
then a `lax.while_loop` that runs the model on the last sampled token against the cache and samples the
next. Shapes are static (cache length = prompt length + max_new_tokens), the loop exits early once every
row has emitted a stop token, and each decode step costs one token's forward pass: the prefix is never
recomputed. On CPU the call first makes features-major copies of the dense weights (`decode_layout.decode_params`,
the decode layout): XLA:CPU's matmuls of a few rows by a weight run twice as fast per layer that way, at the
cost of one more copy of those weights while sampling runs.

The log-probability returned for each sampled token is taken under the distribution it was actually drawn
from: `log_softmax(processed logits)` after temperature, top-k and top-p (the nucleus is renormalised).
Greedy decoding is a point mass, so for it we report the model's own log-probability at temperature 1.
`rlkit.rollout.scoring` re-scores sequences with the same processing, which is what the trainer/sampler
mismatch metric compares.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import jax
import jax.numpy as jnp

from rlkit.core.types import Rollout
from rlkit.models.decode_layout import decode_params
from rlkit.models.transformer import Transformer, as_dtype, init_cache, positions_from_mask, rope_tables

Array = jax.Array

# fold_in data of the `perturb` hook's key stream. The uniforms use threefry counters 0 .. R*B - 1 of `key`, and
# fold_in(key, c) is the block at counter c, so a c this large cannot coincide with key bits they use.
NOISE_STREAM = 0x6D69736D


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
  """How to sample. Hashable: it is a static argument of the jitted generate function."""
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


def generate(model: Transformer, params: Any, prompt: Array, prompt_mask: Array, key: Array,
             cfg: SamplingConfig, group_ids: Optional[Array] = None,
             perturb: Optional[Callable[[Array, Array], Array]] = None) -> Rollout:
  """Samples `cfg.max_new_tokens` tokens (at most) for each left-padded prompt row.

  Args:
    model: the `Transformer` module (static).
    params: its parameters (may be sharded; the batch is sharded by the caller).
    prompt: [B, P] int32, left-padded so the last column is each row's last prompt token.
    prompt_mask: [B, P] bool, True on real prompt tokens.
    key: PRNG key; the uniforms of all steps are `uniform(key, (max_new_tokens, B))`, drawn before the
      decode loop (inside it XLA:CPU ran the generator as a nested loop, ~6% of an S decode step).
    cfg: a `SamplingConfig`.
    group_ids: optional [B] int32 stored in the Rollout (default arange(B)).
    perturb: optional hashable (static) `perturb(logits [B, V] float32, key_i) -> logits` applied to the raw
      logits of every step i before `processed_logits` (`rlkit.rollout.mismatch` simulates an inference
      engine with it). Tokens are drawn from, and `Rollout.logprobs` are taken under, the perturbed
      distribution. key_i = fold_in(fold_in(key, NOISE_STREAM), i): the uniforms above are those of the
      unperturbed run, and None leaves the decode loop as it is.
  Returns:
    A `Rollout`; for MoE models `extras["routed_experts"]` is [B, P+R, L_moe, k].
  """
  if prompt.ndim != 2 or prompt.shape != prompt_mask.shape:
    raise ValueError(f"prompt {prompt.shape} and prompt_mask {prompt_mask.shape} must both be [B, P].")
  if group_ids is None:
    group_ids = jnp.arange(prompt.shape[0], dtype=jnp.int32)
  return _generate(model, cfg, params, jnp.asarray(prompt, jnp.int32), jnp.asarray(prompt_mask, bool), key,
                   jnp.asarray(group_ids, jnp.int32), perturb)


@functools.partial(jax.jit, static_argnums=(0, 1, 7))
def _generate(model: Transformer, cfg: SamplingConfig, params, prompt, prompt_mask, key, group_ids,
              perturb=None):
  b, p = prompt.shape
  r = cfg.max_new_tokens
  mcfg = model.cfg
  if jax.default_backend() == "cpu":
    # Features-major copies of the dense weights for the decode matmuls (rlkit/models/decode_layout.py),
    # made once per call; they hold one more copy of those weights while sampling runs.
    params = decode_params(params, mcfg)
  variables = {"params": params}
  cache = init_cache(mcfg, b, p + r)
  positions = positions_from_mask(prompt_mask)
  out = model.apply(variables, prompt, positions, prompt_mask, cache, logits="last",
                    method=Transformer.forward)
  moe = out.routed_experts is not None
  routed = None
  if moe:
    routed = jnp.zeros((b, p + r) + out.routed_experts.shape[2:], jnp.int32)
    routed = jax.lax.dynamic_update_slice(routed, out.routed_experts, (0, 0, 0, 0))

  # Rotary tables of every decode step, computed once: inside the loop XLA:CPU would fuse sin/cos into
  # each layer's q/k consumers and evaluate them per head, every step.
  step_pos = positions[:, -1:] + 1 + jnp.arange(r)[None, :]                        # [B, R]
  cos_all, sin_all = rope_tables(step_pos, mcfg.head_dim, mcfg.rope_theta, as_dtype(mcfg.dtype))

  uniforms = None if cfg.greedy else jax.random.uniform(key, (r, b), jnp.float32)
  # A stream of its own (fold_in leaves `key` and so the uniforms untouched): see `NOISE_STREAM`.
  noise_key = None if perturb is None else jax.random.fold_in(key, NOISE_STREAM)

  def draw(c, logits):
    """Samples token i of every row from `logits` [B, V] and records it: the loop's last half-step."""
    i = c["i"]
    if perturb is not None:
      logits = perturb(logits.astype(jnp.float32), jax.random.fold_in(noise_key, i))
    # Only the drawn token's log-probability is kept, so no [B, V] log-softmax is formed: one exp pass gives
    # the sampling weights and the normaliser (as `processed_logprobs` computes it: x - max - log sum exp).
    x = processed_logits(logits, cfg)
    x_max = jnp.max(x, axis=-1)
    w = jnp.exp(x - x_max[:, None])
    if cfg.greedy:
      tok = jnp.argmax(x, axis=-1).astype(jnp.int32)
    else:
      tok = sample_categorical(uniforms[i], w)
    tok_logp = jnp.take_along_axis(x, tok[:, None], axis=-1)[:, 0] - x_max - jnp.log(jnp.sum(w, axis=-1))
    live = ~c["done"]
    tok = jnp.where(live, tok, cfg.pad_id)
    stopped = jnp.zeros_like(live)
    for s in cfg.stop_ids:
      stopped = stopped | (tok == s)
    nxt = dict(c, tok=tok, live=live, i=i + 1)
    nxt["response"] = jax.lax.dynamic_update_slice(c["response"], tok[:, None], (0, i))
    nxt["logprobs"] = jax.lax.dynamic_update_slice(
        c["logprobs"], jnp.where(live, tok_logp, 0.0)[:, None], (0, i))
    nxt["mask"] = jax.lax.dynamic_update_slice(c["mask"], live[:, None], (0, i))
    nxt["done"] = c["done"] | (live & stopped)
    return nxt

  def cond(c):
    return (c["i"] < r) & ~jnp.all(c["done"])

  def feed(c):
    """Runs the model on the token drawn last (step i - 1) against the cache; returns (carry, logits)."""
    j = c["i"] - 1
    pos, cos, sin = (jax.lax.dynamic_slice_in_dim(t, j, 1, axis=1) for t in (step_pos, cos_all, sin_all))
    # Finished rows keep running (static shapes); their pad token is masked out of the cache.
    o = model.apply(variables, c["tok"][:, None], pos, c["live"][:, None], c["cache"], rope_cs=(cos, sin),
                    method=Transformer.forward)
    c = dict(c, cache=o.cache)
    if moe:
      c["routed"] = jax.lax.dynamic_update_slice(c["routed"], o.routed_experts, (0, p + j, 0, 0))
    return c, o.logits[:, -1]

  # Each iteration feeds the token drawn last and draws the next. Drawing at the end of the body keeps the
  # [B, V] logits out of the loop carry (XLA:CPU copied them every step) and runs no forward pass after the
  # last token.
  def body(c):
    return draw(*feed(c))

  carry = dict(
      i=jnp.zeros((), jnp.int32), cache=out.cache, tok=jnp.zeros((b,), jnp.int32), live=jnp.zeros((b,), bool),
      response=jnp.full((b, r), cfg.pad_id, jnp.int32), logprobs=jnp.zeros((b, r), jnp.float32),
      mask=jnp.zeros((b, r), bool), done=jnp.zeros((b,), bool))
  if moe:
    carry["routed"] = routed
  c = jax.lax.while_loop(cond, body, draw(carry, out.logits[:, -1]))
  if moe:   # the routing of the last drawn token is part of the Rollout: one more pass, for MoE only
    c, _ = feed(c)
  extras = {"routed_experts": c["routed"]} if moe else {}
  return Rollout(prompt=prompt, prompt_mask=prompt_mask, response=c["response"], response_mask=c["mask"],
                 logprobs=c["logprobs"], lengths=jnp.sum(c["mask"], axis=1).astype(jnp.int32),
                 finished=c["done"], group_ids=group_ids, extras=extras)
