"""How a sparse weight delta is written for the wire, and how a receiver proves it got every bit
(NeMo-DCR, `methods/systems.md` §2; the schemes here are ours).

Gap-coded indices. A message carries one train shard's changed elements in ascending global flat index
order, idx_0 < idx_1 < ... < idx_{n-1}. It sends the gaps

    gap_j = idx_j - idx_{j-1},   idx_{-1} = start   (start = global flat index of the shard's first element,
                                                     minus 1; both sides know it from the sharding, so the
                                                     first gap is small too)

as two streams: `gaps` holds min(gap_j, ESCAPE) as uint16, and `escapes` holds, in order, the full uint32 gap
of every entry whose `gaps` word is ESCAPE (gap >= 65535). Splitting the escapes out (rather than inlining
them after the marker) lets the receiver decode with two prefix sums instead of a sequential parse:

    rank_j = #{k <= j : gaps_k == ESCAPE} - 1,   gap_j = escapes[rank_j] if gaps_k == ESCAPE else gaps_j,
    idx_j  = start + sum_{k <= j} gap_k.

Index bytes = 2 n + 4 n_escapes. At change rate s the escape fraction is about (1 - s)^65535 (nil above
s ~ 1e-4), so a bf16 delta costs (2 + 2) s N bytes against 2 N dense: 0.06 of dense at s = 3%, where int32
indices would cost 0.09.

Checksums. checksum(x) = sum_i fmix32(u32(bits_i) XOR (g_i * 0x9E3779B9)) mod 2^32 over the elements, g_i
their global flat index. Integer addition is associative, so the sum of the per-shard partial sums is the
same on any sharding: the sender checksums its export on the train mesh, each receiver its result on the
sampler mesh, and they compare. fmix32 (MurmurHash3's finaliser) and the XOR are bijections of uint32 for a
fixed position, so any single wrong or missing element changes its term and hence the sum: it is always
detected. Several errors cancel with probability about 2^-32; the position term catches swapped values.
"""
from __future__ import annotations

from typing import NamedTuple, Optional, Sequence

import jax
import jax.numpy as jnp
from jax import lax

from kernels.sparse_delta import bits_view

Array = jax.Array

ESCAPE = 0xFFFF            # a `gaps` word meaning "the gap is the next entry of `escapes`"
_GOLDEN = 0x9E3779B9       # odd: multiplying by it is a bijection of uint32 that spreads the position bits


class GapCode(NamedTuple):
  """One message's indices as sent. Only the first `count` words of `gaps` and `n_escapes` of `escapes`
  travel; the rest is padding to the message's fixed capacity."""
  gaps: Array        # uint16[cap]: min(gap_j, ESCAPE)
  escapes: Array     # uint32[cap]: the gaps >= ESCAPE, in order
  n_escapes: Array   # int32[]


def gap_encode(idx: Array, count: Array, start: Array) -> GapCode:
  """The gap code of ascending indices idx[:min(count, cap)] (int32[cap]) after `start` (see the module
  docstring). Entries past the count are ignored."""
  cap = idx.shape[0]
  valid = jnp.arange(cap) < jnp.minimum(count, cap)
  prev = jnp.concatenate([jnp.reshape(start, (1,)).astype(jnp.int32), idx[:-1]])
  gap = jnp.where(valid, idx - prev, 0).astype(jnp.uint32)
  escaped = valid & (gap >= ESCAPE)
  rank = jnp.cumsum(escaped.astype(jnp.int32)) - 1
  escapes = jnp.zeros((cap,), jnp.uint32).at[jnp.where(escaped, rank, cap)].set(gap, mode="drop")
  gaps = jnp.where(escaped, ESCAPE, gap).astype(jnp.uint16)
  return GapCode(gaps, escapes, jnp.sum(escaped, dtype=jnp.int32))


def gap_decode(code: GapCode, count: Array, start: Array) -> Array:
  """The indices of a gap code, int32[cap]: the first min(count, cap) decoded, -1 after them."""
  cap = code.gaps.shape[0]
  valid = jnp.arange(cap) < jnp.minimum(count, cap)
  escaped = valid & (code.gaps == ESCAPE)
  rank = jnp.maximum(jnp.cumsum(escaped.astype(jnp.int32)) - 1, 0)
  gap = jnp.where(escaped, code.escapes[rank], code.gaps.astype(jnp.uint32))
  idx = jnp.asarray(start, jnp.int32) + jnp.cumsum(jnp.where(valid, gap, 0).astype(jnp.int32))
  return jnp.where(valid, idx, -1)


def coded_index_bytes(count, n_escapes):
  """Bytes of a message's gap-coded indices: a uint16 per entry, plus a uint32 per escaped gap."""
  return 2 * count + 4 * n_escapes


# ---------------------------------------------------------------------------------------------------------
# Flat-index arithmetic with static shapes (int32: the tensors are < 2^31 elements)

def unravel(flat: Array, shape: Sequence[int]) -> list[Array]:
  """Row-major coordinates of flat indices in `shape` (garbage for negative indices: mask them)."""
  coords = []
  for size in reversed(shape):
    coords.append(flat % size)
    flat = flat // size
  return coords[::-1]


def ravel(coords: Sequence[Array], shape: Sequence[int]) -> Array:
  """Row-major flat index of coordinates in `shape` (0 for a 0-d shape)."""
  flat = jnp.int32(0)
  for c, size in zip(coords, shape):
    flat = flat * size + c
  return flat


# ---------------------------------------------------------------------------------------------------------
# Checksums

def fmix32(h: Array) -> Array:
  """MurmurHash3's 32-bit finaliser: a bijection of uint32 that mixes every input bit into every output."""
  h = h ^ (h >> 16)
  h = h * jnp.uint32(0x85EBCA6B)
  h = h ^ (h >> 13)
  h = h * jnp.uint32(0xC2B2AE35)
  return h ^ (h >> 16)


def checksum(x: Array, offsets: Optional[Array] = None, global_shape: Optional[Sequence[int]] = None) -> Array:
  """uint32 checksum of x's bits (module docstring). With `offsets` (int32[ndim]) and `global_shape`, x is
  the block of a larger tensor starting at `offsets`, and the result is that block's partial sum: the
  partial sums of a tensor's blocks add up (mod 2^32) to the checksum of the whole tensor."""
  x = jnp.asarray(x)
  bits = bits_view(x)
  if bits.dtype.itemsize > 4:
    raise ValueError(f"checksum: {x.dtype} is wider than 32 bits; sync such leaves as two 32-bit halves.")
  bits = bits.astype(jnp.uint32)
  global_shape = x.shape if global_shape is None else tuple(global_shape)
  pos = jnp.zeros(x.shape, jnp.uint32)
  for axis, size in enumerate(global_shape):    # g = sum_k (iota_k + o_k) * stride_k, row-major strides
    coord = lax.broadcasted_iota(jnp.uint32, x.shape, axis)
    if offsets is not None:
      coord = coord + offsets[axis].astype(jnp.uint32)
    pos = pos * jnp.uint32(size) + coord
  return jnp.sum(fmix32(bits ^ (pos * jnp.uint32(_GOLDEN))), dtype=jnp.uint32)
