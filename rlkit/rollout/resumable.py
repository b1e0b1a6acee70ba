"""Resumable KV-cache decoding: `prefill`, `decode_until`, `append` over a `DecodeState` the caller holds.

Multi-turn (agentic, tool-using) rollouts alternate sampling with observations that must enter the context
without being sampled. Three jitted pieces with static shapes do that on one live KV cache:

  state = prefill(model, params, prompt, prompt_mask, key, capacity)   # the prompt into the cache
  state = decode_until(model, params, state, cfg)                      # sample until stop set or budget
  state = append(model, params, state, obs, obs_mask)                  # k given tokens into the cache
  state = decode_until(model, params, state, cfg)                      # continues after the observation

Layout. Each row owns C = `capacity` columns after its P prompt slots; column c is cache slot P + c for
every row, so a step writes one column of the whole batch (one `dynamic_update_slice`, the cache's single
write index). A row that stops early leaves holes (mask False) in later columns, which the cache's slot mask
keeps out of attention. Positions count a row's real tokens only (a row's next token gets position = its
number of real tokens so far), so a hole changes nothing: the logits are those of one full forward pass
over [prompt | buffer] with attention mask [prompt_mask | mask], whose positions are cumsum(mask) - 1.

Invariant between calls: every token of the buffer is in the cache, and `logits` are the model's raw
logits for each live row's next token. `prefill` sets it up (one forward over the prompt). `decode_until`
draws the first token from `logits`, then each `lax.while_loop` step feeds the token drawn last (one
token's forward against the cache: the prefix is never recomputed) and draws the next; after the loop it
feeds the last drawn token, the one forward pass that a following `append` would otherwise run. `append`
runs one forward of its k tokens (left-padded, like prompts, so the last column is each row's last real
token) against the cache at the row's next positions.

Log-probs: a sampled token's `logprobs` entry is its log-probability under the distribution it was drawn
from (`rlkit.rollout.distribution`, after the `perturb` hook if any), 0 elsewhere. `mask` is True on every
attended token (sampled or appended), `appended` on appended ones; `sampled_mask = mask & ~appended` is what
a loss may train on (an observation is attended, never trained).

Randomness: the uniforms of one `decode_until` call are `uniform(state.key, (budget, B))`, drawn before its
loop, and the `perturb` noise of its step i uses fold_in(fold_in(state.key, NOISE_STREAM), i); the call
then moves the state to fold_in(state.key, NEXT_STREAM), so calls never reuse a draw, and a prefill +
decode_until is `rlkit.rollout.sampler.generate` with the same key, bit for bit.

On CPU each piece multiplies by the decode layout's features-major weight copies
(`rlkit.models.decode_layout`); pass `decode_layout_params(model, params)` to make them once for many
calls (each call otherwise makes its own). `decode_until` and `append` donate the state they are given.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Optional

import flax.struct
import jax
import jax.numpy as jnp

from rlkit.core.types import SEGMENT_KINDS, Rollout
from rlkit.models.decode_layout import NK, decode_params
from rlkit.models.transformer import KVCache, Transformer, as_dtype, init_cache, positions_from_mask, rope_tables
from rlkit.rollout.distribution import SamplingConfig, processed_logits, sample_categorical

Array = jax.Array

# fold_in data of the `perturb` hook's key stream. The uniforms use threefry counters 0 .. R*B - 1 of `key`, and
# fold_in(key, c) is the block at counter c, so a c this large cannot coincide with key bits they use.
NOISE_STREAM = 0x6D69736D
# fold_in data of the key the next `decode_until` call draws with (large, like NOISE_STREAM, and distinct).
NEXT_STREAM = 0x6E657874


@flax.struct.dataclass
class DecodeState:
  """A batch of rows mid-generation. Column c of the buffers is cache slot P + c (P = prompt length)."""
  cache: KVCache          # slots [0, P + C); cache.index = P + the columns used so far
  tokens: Array           # [B, C] int32 sampled or appended tokens; the pad id elsewhere
  logprobs: Array         # [B, C] float32 sampler log-prob of sampled tokens; 0 elsewhere
  mask: Array             # [B, C] bool, attended tokens (sampled or appended)
  appended: Array         # [B, C] bool, tokens given to `append` (attended, not sampled)
  logits: Array           # [B, V] float32 raw logits of each live row's next token
  positions: Array        # [B] int32 position of each row's next token (its number of real tokens)
  done: Array             # [B] bool, the row emitted a stop token (and nothing was appended since)
  key: Array              # PRNG key of the next decode_until call
  # MoE only: the routing of every cached token, {"routed_experts": [B, P + C, L_moe, k] int32,
  # "routed_weights": the same shape, float32 combine weights, and with expert_quant the TRACE hints
  # (rlkit/models/moe.py)}: the rollout's extras of those names.
  routed: Optional[dict] = None

  @property
  def capacity(self) -> int:
    return self.tokens.shape[1]

  @property
  def prompt_len(self) -> int:
    return self.cache.max_len - self.capacity

  @property
  def used(self) -> Array:
    """[] int32 columns written so far (by every row: finished rows hold holes)."""
    return self.cache.index - self.prompt_len

  @property
  def sampled_mask(self) -> Array:
    """[B, C] bool: the sampled tokens, which a loss may train on."""
    return self.mask & ~self.appended


def with_decode_layout(params: Any, cfg) -> Any:
  """`params` with the decode layout's weight copies on CPU (`decode_params`), unless they have them."""
  if jax.default_backend() != "cpu" or "lm_head" + NK in params:
    return params
  return decode_params(params, cfg)


def decode_layout_params(model: Transformer, params: Any) -> Any:
  """The params to hand the pieces for many calls: on CPU with the decode layout's features-major copies
  (one more copy of the dense weights, made once here instead of in every call), elsewhere `params`."""
  return jax.jit(with_decode_layout, static_argnums=1)(params, model.cfg)


def routing_of(out) -> dict:
  """The routing record of a model output (MoE): the extras names and their [B, T, L_moe, ...] arrays (the
  experts and combine weights, and with `expert_quant` the TRACE hints)."""
  return {"routed_experts": out.routed_experts, "routed_weights": out.routed_weights, **(out.trace or {})}


def record_routing(buffers: dict, out, column) -> dict:
  """`buffers` with the routing of `out`'s T tokens written at columns [column, column + T)."""
  return jax.tree.map(lambda buf, x: jax.lax.dynamic_update_slice(buf, x, (0, column) + (0,) * (x.ndim - 2)),
                      buffers, routing_of(out))


# ----------------------------------------------------------------------------------------------------------
# Building blocks, unjitted: `generate` fuses prefill_state and decode_steps into one jitted program, and a
# collector may fuse them into its own.
# ----------------------------------------------------------------------------------------------------------

def prefill_state(model: Transformer, variables, prompt: Array, prompt_mask: Array, key: Array, capacity: int,
                  pad_id: int = 0) -> DecodeState:
  """Runs the left-padded prompt [B, P] into a fresh cache of P + capacity slots."""
  b, p = prompt.shape
  cache = init_cache(model.cfg, b, p + capacity)
  positions = positions_from_mask(prompt_mask)
  out = model.apply(variables, prompt, positions, prompt_mask, cache, logits="last", method=Transformer.forward)
  routed = None
  if out.routed_experts is not None:
    routed = record_routing(jax.tree.map(lambda x: jnp.zeros((b, p + capacity) + x.shape[2:], x.dtype),
                                         routing_of(out)), out, 0)
  return DecodeState(
      cache=out.cache, tokens=jnp.full((b, capacity), pad_id, jnp.int32),
      logprobs=jnp.zeros((b, capacity), jnp.float32), mask=jnp.zeros((b, capacity), bool),
      appended=jnp.zeros((b, capacity), bool), logits=out.logits[:, -1], positions=positions[:, -1] + 1,
      done=jnp.zeros((b,), bool), key=key, routed=routed)


def decode_steps(model: Transformer, variables, s: DecodeState, cfg: SamplingConfig,
                 perturb: Optional[Callable[[Array, Array], Array]] = None, feed_last: bool = True,
                 stop_table: Optional[tuple[Array, Array]] = None) -> DecodeState:
  """Draws up to `cfg.max_new_tokens` tokens per row from column `s.used` on, until every row has emitted one
  of `cfg.stop_ids` (or completed a stop string of `stop_table`, `rlkit.rollout.stop_strings`: matched from
  this call's first token) or the budget or the buffer is used up. The first draw is unconditional: the
  caller guarantees a free column and a live row (`decode_until` checks). feed_last=False skips the forward
  pass of the last drawn token (`generate`, dense: nothing reads it); the state's cache and logits then lag."""
  b, cap = s.tokens.shape
  p, r, mcfg = s.prompt_len, cfg.max_new_tokens, model.cfg
  moe = s.routed is not None
  start = s.used

  # Rotary tables of every decode step, computed once: inside the loop XLA:CPU would fuse sin/cos into
  # each layer's q/k consumers and evaluate them per head, every step. A row's step j has position
  # positions + j while it is live; a finished row's (masked) steps may have any.
  step_pos = s.positions[:, None] + jnp.arange(r)[None, :]                           # [B, R]
  cos_all, sin_all = rope_tables(step_pos, mcfg.head_dim, mcfg.rope_theta, as_dtype(mcfg.dtype))

  # Drawn before the loop: inside it XLA:CPU ran the generator as a nested loop, ~6% of an S decode step.
  uniforms = None if cfg.greedy else jax.random.uniform(s.key, (r, b), jnp.float32)
  # A stream of its own (fold_in leaves `key` and so the uniforms untouched): see `NOISE_STREAM`.
  noise_key = None if perturb is None else jax.random.fold_in(s.key, NOISE_STREAM)

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
    for stop in cfg.stop_ids:
      stopped = stopped | (tok == stop)
    col = start + i
    nxt = dict(c, tok=tok, live=live, i=i + 1)
    if stop_table is not None:   # each string's automaton state, advanced by the drawn token
      table, accept = stop_table
      matched = table[jnp.arange(table.shape[0])[None, :], c["matched"], tok[:, None]]      # [B, S]
      stopped = stopped | jnp.any(matched >= accept[None, :], axis=1)
      nxt["matched"] = matched
    nxt["response"] = jax.lax.dynamic_update_slice(c["response"], tok[:, None], (0, col))
    nxt["logprobs"] = jax.lax.dynamic_update_slice(
        c["logprobs"], jnp.where(live, tok_logp, 0.0)[:, None], (0, col))
    nxt["mask"] = jax.lax.dynamic_update_slice(c["mask"], live[:, None], (0, col))
    nxt["done"] = c["done"] | (live & stopped)
    return nxt

  def cond(c):
    return (c["i"] < r) & (start + c["i"] < cap) & ~jnp.all(c["done"])

  def feed(c):
    """Runs the model on the token drawn last (step i - 1) against the cache; returns (carry, logits)."""
    j = c["i"] - 1
    pos, cos, sin = (jax.lax.dynamic_slice_in_dim(t, j, 1, axis=1) for t in (step_pos, cos_all, sin_all))
    # Finished rows keep running (static shapes); their pad token is masked out of the cache.
    o = model.apply(variables, c["tok"][:, None], pos, c["live"][:, None], c["cache"], rope_cs=(cos, sin),
                    method=Transformer.forward)
    c = dict(c, cache=o.cache)
    if moe:
      c["routed"] = record_routing(c["routed"], o, p + start + j)
    return c, o.logits[:, -1]

  # Each iteration feeds the token drawn last and draws the next. Drawing at the end of the body keeps the
  # [B, V] logits out of the loop carry (XLA:CPU copied them every step) and runs no forward pass after the
  # last token inside the loop.
  def body(c):
    return draw(*feed(c))

  carry = dict(i=jnp.zeros((), jnp.int32), cache=s.cache, tok=jnp.zeros((b,), jnp.int32),
               live=jnp.zeros((b,), bool), response=s.tokens, logprobs=s.logprobs, mask=s.mask, done=s.done)
  if moe:
    carry["routed"] = s.routed
  if stop_table is not None:
    carry["matched"] = jnp.zeros((b, stop_table[0].shape[0]), jnp.int32)
  c = jax.lax.while_loop(cond, body, draw(carry, s.logits))
  logits = s.logits
  if feed_last or moe:   # MoE: the routing of the last drawn token is part of the record
    c, logits = feed(c)
  # Live rows drew a run of consecutive tokens, all of them now in the cache (with feed_last).
  drawn = jnp.sum(c["mask"], axis=1, dtype=jnp.int32) - jnp.sum(s.mask, axis=1, dtype=jnp.int32)
  return s.replace(cache=c["cache"], tokens=c["response"], logprobs=c["logprobs"], mask=c["mask"],
                   logits=logits, positions=s.positions + drawn, done=c["done"],
                   key=jax.random.fold_in(s.key, NEXT_STREAM), routed=c.get("routed"))


def append_tokens(model: Transformer, variables, s: DecodeState, tokens: Array, mask: Array) -> DecodeState:
  """Feeds `tokens` [B, k] (left-padded: each row's real tokens, per `mask` [B, k], end at column k - 1) into
  the cache at columns [used, used + k), at each row's next positions. A row given at least one token is
  live again (its `done` is cleared) and its `logits` become those after its last appended token."""
  b, k = tokens.shape
  start = s.used
  positions = s.positions[:, None] + jnp.cumsum(mask, axis=1, dtype=jnp.int32) - 1
  out = model.apply(variables, tokens, positions, mask, s.cache, logits="last", method=Transformer.forward)
  got = jnp.any(mask, axis=1)
  put = lambda buf, x: jax.lax.dynamic_update_slice(buf, x, (0, start))   # noqa: E731
  # Holes keep the buffer's pad id (set by prefill), not whatever the caller padded with.
  old = jax.lax.dynamic_slice(s.tokens, (0, start), (b, k))
  routed = s.routed
  if routed is not None:
    routed = record_routing(routed, out, s.prompt_len + start)
  return s.replace(
      cache=out.cache, tokens=put(s.tokens, jnp.where(mask, tokens, old)),
      logprobs=put(s.logprobs, jnp.zeros((b, k), jnp.float32)), mask=put(s.mask, mask),
      appended=put(s.appended, mask), logits=jnp.where(got[:, None], out.logits[:, -1], s.logits),
      positions=s.positions + jnp.sum(mask, axis=1, dtype=jnp.int32), done=s.done & ~got, routed=routed)


def to_rollout(s: DecodeState, prompt: Array, prompt_mask: Array, group_ids: Array) -> Rollout:
  """The `Rollout` of a state: its buffer is the response region, attended where `s.mask`, trained where
  `s.sampled_mask` (appended tokens are `observation` segments with log-prob 0); MoE routing in extras.
  Turn ids and call counts are the collector's to set (the state does not know what a turn is)."""
  extras = dict(s.routed or {})
  segments = jnp.where(s.appended, SEGMENT_KINDS["observation"],
                       jnp.where(s.mask, SEGMENT_KINDS["policy"], SEGMENT_KINDS["pad"])).astype(jnp.int32)
  return Rollout(prompt=prompt, prompt_mask=prompt_mask, response=s.tokens, response_mask=s.mask,
                 logprobs=s.logprobs, lengths=jnp.sum(s.mask, axis=1).astype(jnp.int32), finished=s.done,
                 group_ids=group_ids, extras=extras, loss_mask=s.sampled_mask, segment_ids=segments)


# ----------------------------------------------------------------------------------------------------------
# The jitted pieces.
# ----------------------------------------------------------------------------------------------------------

@functools.partial(jax.jit, static_argnums=(0, 5, 6))
def _prefill(model, params, prompt, prompt_mask, key, capacity, pad_id):
  return prefill_state(model, {"params": with_decode_layout(params, model.cfg)}, prompt, prompt_mask, key,
                       capacity, pad_id)


def prefill(model: Transformer, params: Any, prompt: Array, prompt_mask: Array, key: Array, capacity: int,
            pad_id: int = 0) -> DecodeState:
  """A `DecodeState` holding the left-padded prompt [B, P] (mask [B, P]) in a cache with room for
  `capacity` more tokens per row (sampled and appended together); `key` seeds the first `decode_until`."""
  if prompt.ndim != 2 or prompt.shape != prompt_mask.shape:
    raise ValueError(f"prompt {prompt.shape} and prompt_mask {prompt_mask.shape} must both be [B, P].")
  if capacity < 1:
    raise ValueError(f"capacity={capacity} must be >= 1 (the tokens a row may add after its prompt).")
  return _prefill(model, params, jnp.asarray(prompt, jnp.int32), jnp.asarray(prompt_mask, bool), key,
                  int(capacity), int(pad_id))


@functools.partial(jax.jit, static_argnums=(0, 1, 2), donate_argnums=(4,))
def _decode_until(model, cfg, perturb, params, s, stop_table):
  variables = {"params": with_decode_layout(params, model.cfg)}
  go = (s.used < s.capacity) & ~jnp.all(s.done)
  s = jax.lax.cond(go, lambda s: decode_steps(model, variables, s, cfg, perturb, stop_table=stop_table),
                   lambda s: s.replace(key=jax.random.fold_in(s.key, NEXT_STREAM)), s)
  return s


def decode_until(model: Transformer, params: Any, state: DecodeState, cfg: SamplingConfig,
                 stop_ids: Optional[tuple[int, ...]] = None, budget: Optional[int] = None,
                 perturb: Optional[Callable[[Array, Array], Array]] = None,
                 stop_strings=None) -> DecodeState:
  """Samples with `cfg` until every row has emitted a token of `stop_ids` (default `cfg.stop_ids`) or, with
  `stop_strings` (a `rlkit.rollout.stop_strings.StopTable`), written one of its strings in this call, drawn
  `budget` tokens (default `cfg.max_new_tokens`) in this call, or filled its buffer; rows already `done`
  draw nothing. `perturb` is `rlkit.rollout.sampler.generate`'s hook. `state` is donated."""
  if budget is not None and budget < 1:
    raise ValueError(f"decode_until: budget={budget} must be >= 1 (the most tokens a row draws in this call).")
  cfg = dataclasses.replace(cfg, stop_ids=tuple(cfg.stop_ids if stop_ids is None else stop_ids),
                            max_new_tokens=int(cfg.max_new_tokens if budget is None else budget))
  table = None if stop_strings is None else (jnp.asarray(stop_strings.table), jnp.asarray(stop_strings.accept))
  return _decode_until(model, cfg, perturb, params, state, table)


@functools.partial(jax.jit, static_argnums=(0,), donate_argnums=(2,))
def _append(model, params, s, tokens, mask):
  return append_tokens(model, {"params": with_decode_layout(params, model.cfg)}, s, tokens, mask)


def append(model: Transformer, params: Any, state: DecodeState, tokens: Array, mask: Array) -> DecodeState:
  """Feeds `tokens` [B, k] into the live cache as attended, unsampled context (a tool observation), without
  recomputing the prefix: left-padded, `mask` [B, k] True on each row's real tokens. Rows given a token are
  live again. `state` is donated."""
  tokens, mask = jnp.asarray(tokens, jnp.int32), jnp.asarray(mask, bool)
  if tokens.ndim != 2 or tokens.shape != mask.shape or tokens.shape[0] != state.tokens.shape[0]:
    raise ValueError(f"tokens {tokens.shape} and mask {mask.shape} must both be [B, k] with "
                     f"B = {state.tokens.shape[0]}.")
  # dynamic_update_slice would silently move an overflowing write back over earlier columns. The check reads
  # the index from the device; outside of a trace the caller has synced anyway, to read the tokens it answers.
  if not isinstance(state.cache.index, jax.core.Tracer):
    free = state.capacity - int(state.used)
    if tokens.shape[1] > free:
      raise ValueError(f"append: {tokens.shape[1]} tokens do not fit, {free} of the state's capacity="
                       f"{state.capacity} columns are free; prefill with a larger capacity.")
  return _append(model, params, state, tokens, mask)
