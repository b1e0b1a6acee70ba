"""Masked softmax attention over grouped query heads, with causal blocks and a hand-written backward pass.

`attend(q, k, v, allowed, group, blocks)` is `softmax(mask(q k^T / sqrt(hd))) v` with float32 scores. With
blocks=1 its value is exactly that of the plain composition of `einsum`, `where` and `jax.nn.softmax`
(`masked_probs`, which the decode path shares). The queries come block-major, from `query_blocks`
(`merge_blocks` turns the output into the output projection's input). What makes the training step faster:

- Causal blocks (self-attention over one whole sequence, as in training and scoring): the queries are split
  into `blocks` blocks, and block i attends only to the keys up to its last query. The score blocks above the
  diagonal, which the causal mask would zero, are never computed: at 4 blocks, 10/16 of the dense work.
- The backward pass is written out, with FlashAttention's identity for the softmax gradient (o = p v, so
  sum_s p_s dp_s = do . o):

    dv = p^T do      dp = do v^T      ds = p * (dp - rowsum(do * o)) / sqrt(hd)      dq = ds k      dk = ds^T q

  Autodiff of the softmax instead reduces `p * dp` over the key axis, a pass over the whole score tensor that
  XLA:CPU ran as its own op (8.6 ms per M layer at 8 x 256 tokens, longer than either attention matmul),
  and adds the backward of the mask's `where`. `rowsum(do * o)` reduces the S / hd times smaller output.

M train step (8 x 256 tokens), interleaved A/Bs: against the plain composition 1.04x (16 rounds), with the
attention ops of a layer's backward going from 31 to 20 ms in the profile; computing dv and dk transposed
(see `_attend_bwd`) then 1.01x and 1.03x (12 and 20 rounds), and 20 to 11 ms in the profile.
"""
from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

Array = jax.Array


def _mask5(allowed: Array) -> Array:
  return allowed[:, None, :, None, :]                # [B, T, S] -> broadcast over [B, KV, T, G, S]


def masked_probs(scores: Array, allowed: Array, group: int, head_dim: int) -> Array:
  """Softmax over the keys of raw q.k^T `scores` [B, KV, T*G, S] (query rows ordered (t, g)), float32.

  allowed: [B, T, S], True where query t may attend to key slot s. Disallowed scores get float32's
  minimum, so a row with no allowed key (a padding query) is uniform rather than NaN.
  """
  b, kvh, tg, s = scores.shape
  x = scores.reshape(b, kvh, tg // group, group, s) * (1.0 / math.sqrt(head_dim))
  x = jnp.where(_mask5(allowed), x, jnp.finfo(jnp.float32).min)
  return jax.nn.softmax(x, axis=-1).reshape(b, kvh, tg, s)


def _einsum(eq: str, a: Array, b: Array) -> Array:
  return jnp.einsum(eq, a, b, preferred_element_type=jnp.float32)


def causal_blocks(t: int, min_block: int = 64, max_blocks: int = 4) -> int:
  """How many causal query blocks `attend` splits T queries into: the most (up to `max_blocks`) that
  divide T into blocks of at least `min_block` queries; 1 (dense) for short sequences."""
  return next(n for n in range(max_blocks, 0, -1) if n == 1 or (t % n == 0 and t // n >= min_block))


def query_blocks(q: Array, blocks: int) -> Array:
  """Queries [B, T, KV, G, hd] -> `attend`'s layout [blocks, B, KV, (T / blocks) * G, hd]: block i holds
  the queries of positions [i T/blocks, (i+1) T/blocks), rows ordered (t, g). One transpose, after which
  each block is a contiguous major-axis slice; slicing each block out of [B, KV, T*G, hd] instead, the M
  train step was 1.008x-1.019x slower (three interleaved A/Bs, 14-20 rounds)."""
  b, t, kvh, g, hd = q.shape
  _spans(t, blocks)
  return q.reshape(b, blocks, t // blocks, kvh, g, hd).transpose(1, 0, 3, 2, 4, 5).reshape(
      blocks, b, kvh, t // blocks * g, hd)


def merge_blocks(o: Array, group: int) -> Array:
  """`attend`'s output [blocks, B, KV, Tb*G, hd] -> [B, T, KV*G*hd], the output projection's input."""
  nb, b, kvh, tbg, hd = o.shape
  tb = tbg // group
  return o.reshape(nb, b, kvh, tb, group * hd).transpose(1, 0, 3, 2, 4).reshape(b, nb * tb, kvh * group * hd)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5))
def attend(q: Array, k: Array, v: Array, allowed: Array, group: int, blocks: int = 1) -> Array:
  """Attention output [blocks, B, KV, Tb*G, hd] (float32) of queries q [blocks, B, KV, Tb*G, hd] (from
  `query_blocks`; Tb = T / blocks) over keys and values k, v [B, KV, S, hd], all three in the compute dtype;
  `allowed` [B, T, S] as in `masked_probs`.

  blocks > 1 (see `causal_blocks`) is for causal self-attention over one whole sequence (S == T, query t
  at slot t): block i attends only to the keys up to its last query, skipping the score blocks the causal
  mask would zero (at 4 blocks, 10/16 of the work). Real queries get the same values; a query with no
  allowed key (padding) is uniform over its block's keys instead of all S.
  """
  return _attend_fwd(q, k, v, allowed, group, blocks)[0]


def _spans(t: int, blocks: int) -> list[tuple[int, int]]:
  if blocks < 1 or t % blocks:
    raise ValueError(f"attend: {t} queries do not split into {blocks} causal blocks; use causal_blocks(t).")
  size = t // blocks
  return [(i * size, (i + 1) * size) for i in range(blocks)]


def _attend_fwd(q, k, v, allowed, group, blocks):
  t = allowed.shape[1]
  if blocks > 1 and k.shape[2] != t:
    raise ValueError(f"attend: causal blocks need keys of the queries' own sequence (S == T), got S = "
                     f"{k.shape[2]}, T = {t}; pass blocks=1.")
  if q.ndim != 5 or q.shape[0] != blocks:
    raise ValueError(f"attend: queries of shape {q.shape} are not in {blocks} blocks "
                     f"[blocks, B, KV, Tb*G, hd]; use query_blocks(q, {blocks}).")
  ps, outs = [], []
  for i, (a, b) in enumerate(_spans(t, blocks)):
    end = b if blocks > 1 else k.shape[2]          # the keys up to the block's last query; dense: all S
    p = masked_probs(_einsum("bkqh,bksh->bkqs", q[i], k[:, :, :end]), allowed[:, a:b, :end], group,
                     q.shape[-1])
    ps.append(p)
    outs.append(_einsum("bkqs,bksh->bkqh", p.astype(v.dtype), v[:, :, :end]))
  o = jnp.stack(outs)
  return o, (q, k, v, allowed, tuple(ps), o)


def _attend_bwd(group, blocks, res, do):
  q, k, v, allowed, ps, o = res
  dt, t, s, hd = v.dtype, allowed.shape[1], k.shape[2], q.shape[-1]
  row = jnp.sum(do * o, axis=-1, keepdims=True)      # = sum_s p dp, over hd instead of S
  # dv = p^T do and dk = ds^T q contract the query axis, which is major in both operands. XLA:CPU's
  # matmul kernels want the left operand's contracting axis minor; left to itself XLA ran these two as
  # generic dots at a third of the speed of the others. So the transposes dv^T = do^T p and dk^T = q^T ds
  # are computed, with the small do and q transposed explicitly (the barrier keeps XLA from folding the
  # transposes back into the dots) and dv^T, dk^T transposed once at the end.
  do_t, q_t = jax.lax.optimization_barrier((jnp.swapaxes(do.astype(dt), 3, 4), jnp.swapaxes(q, 3, 4)))
  # Each block adds its keys' gradient into its prefix of dk^T and dv^T in place. Padding each block's
  # gradient to S and summing the padded copies wrote and read 4 full-size arrays per layer instead (the
  # profile's pad-add fusions: 18.8 ms per M train step, 6 ms after; the step 1.014x-1.018x, two A/Bs).
  dqs = []
  dk_t = jnp.zeros(q_t.shape[1:4] + (s,), jnp.float32)
  dv_t = jnp.zeros(q_t.shape[1:4] + (s,), jnp.float32)
  for i, ((a, b), p) in enumerate(zip(_spans(t, blocks), ps)):
    end = p.shape[-1]
    dp = _einsum("bkqh,bksh->bkqs", do[i].astype(dt), v[:, :, :end])
    nb, kvh, tg, _ = p.shape
    ds = (p * (dp - row[i])).reshape(nb, kvh, tg // group, group, end)
    # Disallowed slots have p = 0 except in a fully masked row, whose uniform p must not pass gradient
    # (autodiff's `where` stops it there).
    ds = jnp.where(_mask5(allowed[:, a:b, :end]), ds * (1.0 / math.sqrt(hd)), 0.0)
    ds = ds.reshape(nb, kvh, tg, end).astype(dt)
    dqs.append(_einsum("bkqs,bksh->bkqh", ds, k[:, :, :end]))
    dk_t = dk_t.at[..., :end].add(_einsum("bkhq,bkqs->bkhs", q_t[i], ds))
    dv_t = dv_t.at[..., :end].add(_einsum("bkhq,bkqs->bkhs", do_t[i], p.astype(dt)))
  dq = jnp.stack(dqs)
  return dq.astype(q.dtype), jnp.swapaxes(dk_t, 2, 3).astype(k.dtype), jnp.swapaxes(dv_t, 2, 3).astype(dt), None


attend.defvjp(_attend_fwd, _attend_bwd)
