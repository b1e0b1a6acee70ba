"""Sparse weight-delta kernels for trainer -> sampler sync (NeMo-DCR, `methods/systems.md` §2).

Two hot paths of a sparse sync, each a Pallas kernel beside its plain-jnp reference (the spec):

`compact_changes(new, base, capacity)`: the fused compare + stream compaction of the sender. With u = the
equal-width unsigned view of an array's bits (bf16 -> uint16, float32 -> uint32, ...),

    C     = {i : u(new)_i != u(base)_i}             (flat, row-major indices; -0.0 vs 0.0 and NaN payloads
                                                     differ in bits, so they count as changes)
    idx   = C in ascending order, then -1           int32[capacity]
    val   = u(new)[idx], then 0                     uint[capacity]
    count = |C|                                     int32; count > capacity means overflow: only the first
                                                    `capacity` entries are in idx/val, and the caller must
                                                    send the tensor densely instead (nothing is hidden)

`scatter_apply(dst, idx, val)`: the receiver's overwrite, dst.flat[idx_j] = val_j (as bits) for every
valid entry (0 <= idx_j < dst.size), padding (-1) ignored. Valid indices must be unique (a compacted patch's
are), so the result does not depend on the order of the writes. Overwriting (not XOR) makes a replayed
patch harmless and keeps the receiver bit-identical to the sender's export.

The compaction is two kernels over blocks of `SparseDeltaBlocks.compare` elements: the first counts each
block's changes; an exclusive prefix sum of the counts (jnp) gives every block its output offset; the second
recomputes the block's mask (re-reading new/base is cheaper than writing the mask out and reading it back)
and writes entry j of the block to offset + rank_j, rank = inclusive cumsum(mask) - 1, with a masked scatter
that drops entries past `capacity`. The scatter kernel writes `SparseDeltaBlocks.apply` entries per step.

Backends: the kernels use Triton-style masked gathers/scatters (`jax.experimental.pallas.triton.store` on
array indices), written for the GPU (Triton) backend, where they compile and equal the references bit
for bit (an H200, benchmarks/HISTORY.md: encode 4.6x the jnp reference at 2^27 elements). On CPU (and TPU,
which these scatters do not target) they run with `interpret=True`, which is how the tests check them
against the references. Interpreted, the compaction is slow and grows faster than the size (every grid step
carries the whole capacity-sized output through a scatter): a tool for tests, not a CPU fast path; use the
references there. Flat indices are int32: tensors of 2**31 elements or more are refused (split them first).
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

Array = jax.Array

_UINT_OF_WIDTH = {1: jnp.uint8, 2: jnp.uint16, 4: jnp.uint32, 8: jnp.uint64}
_MAX_ELEMENTS = 2 ** 31 - 1


@dataclasses.dataclass(frozen=True)
class SparseDeltaBlocks:
  """Block sizes of the kernels (powers of two, as Triton requires)."""
  compare: int = 1024   # elements per grid step of the compare and compaction kernels
  apply: int = 1024     # patch entries per grid step of the scatter kernel

  def __post_init__(self):
    for name in ("compare", "apply"):
      size = getattr(self, name)
      if size < 1 or size & (size - 1):
        raise ValueError(f"SparseDeltaBlocks.{name}={size} must be a positive power of two.")


def bits_dtype(dtype) -> jnp.dtype:
  """The unsigned integer dtype of the same width as `dtype` (bool: uint8)."""
  dtype = jnp.dtype(dtype)
  if dtype == jnp.bool_:
    return jnp.dtype(jnp.uint8)
  try:
    return jnp.dtype(_UINT_OF_WIDTH[dtype.itemsize])
  except KeyError:
    raise ValueError(f"No unsigned view for dtype {dtype} ({dtype.itemsize} bytes); "
                     f"supported widths: {sorted(_UINT_OF_WIDTH)} bytes.") from None


def bits_view(x: Array) -> Array:
  """x's bits as the equal-width unsigned dtype (a free bitcast; bool becomes 0/1 uint8)."""
  x = jnp.asarray(x)
  u = bits_dtype(x.dtype)
  if x.dtype == u:
    return x
  if x.dtype == jnp.bool_:
    return x.astype(u)
  return lax.bitcast_convert_type(x, u)


def _check_size(n: int, what: str) -> None:
  if n > _MAX_ELEMENTS:
    raise ValueError(f"{what} has {n} elements; int32 flat indices allow at most {_MAX_ELEMENTS}. "
                     f"Split the tensor into smaller pieces before syncing it sparsely.")


def _flat_bits(new: Array, base: Array) -> tuple[Array, Array]:
  new, base = jnp.asarray(new), jnp.asarray(base)
  if new.shape != base.shape or bits_dtype(new.dtype) != bits_dtype(base.dtype):
    raise ValueError(f"compact_changes: new {new.shape} {new.dtype} and base {base.shape} {base.dtype} must "
                     f"have the same shape and element width.")
  _check_size(new.size, "compact_changes input")
  return bits_view(new).reshape(-1), bits_view(base).reshape(-1)


# ---------------------------------------------------------------------------------------------------------
# Compare + compaction

def compact_changes_reference(new: Array, base: Array, *, capacity: int) -> tuple[Array, Array, Array]:
  """The spec of `compact_changes` in plain jnp: (idx int32[capacity], val uint[capacity], count int32)."""
  if capacity < 1:
    raise ValueError(f"capacity={capacity} must be >= 1.")
  nb, bb = _flat_bits(new, base)
  changed = nb != bb
  idx = jnp.nonzero(changed, size=capacity, fill_value=-1)[0].astype(jnp.int32)
  val = jnp.where(idx >= 0, nb[jnp.maximum(idx, 0)], 0).astype(nb.dtype)
  return idx, val, jnp.sum(changed, dtype=jnp.int32)


def _block_changes(n: int, block: int, new_ref, base_ref):
  """(flat positions, changed mask) of this grid step's block; positions >= n (the last block's tail,
  whose contents are undefined) never count."""
  pos = pl.program_id(0) * block + jnp.arange(block, dtype=jnp.int32)
  new = new_ref[...]
  return pos, new, (new != base_ref[...]) & (pos < n)


def _count_kernel(n, block, new_ref, base_ref, count_ref):
  _, _, changed = _block_changes(n, block, new_ref, base_ref)
  count_ref[...] = jnp.full((1,), jnp.sum(changed.astype(jnp.int32)), jnp.int32)


def _compact_kernel(n, block, capacity, offset_ref, new_ref, base_ref, idx_in_ref, val_in_ref, idx_ref,
                    val_ref):
  del idx_in_ref, val_in_ref   # aliased to idx_ref / val_ref: the -1 / 0 padding every unwritten slot keeps
  pos, new, changed = _block_changes(n, block, new_ref, base_ref)
  dest = offset_ref[0] + jnp.cumsum(changed.astype(jnp.int32)) - 1
  keep = changed & (dest < capacity)
  # Unkept entries point one past the end and are masked: dropped, and never written over a kept slot.
  dest = jnp.where(keep, dest, capacity)
  pl_triton.store(idx_ref.at[dest], pos, mask=keep)
  pl_triton.store(val_ref.at[dest], new, mask=keep)


@functools.partial(jax.jit, static_argnames=("capacity", "blocks", "interpret"))
def compact_changes(new: Array, base: Array, *, capacity: int, blocks: SparseDeltaBlocks = SparseDeltaBlocks(),
                    interpret: bool = False) -> tuple[Array, Array, Array]:
  """The changed flat indices of `new` against `base` (bit comparison) and their new bits, compacted into
  `capacity` slots, and the number of changes; see the module docstring. Equal to
  `compact_changes_reference` bit for bit. interpret: run the Pallas kernels interpreted (CPU)."""
  if capacity < 1:
    raise ValueError(f"capacity={capacity} must be >= 1.")
  nb, bb = _flat_bits(new, base)
  n, block = nb.size, blocks.compare
  idx0, val0 = jnp.full((capacity,), -1, jnp.int32), jnp.zeros((capacity,), nb.dtype)
  if n == 0:
    return idx0, val0, jnp.int32(0)
  grid = (pl.cdiv(n, block),)
  data_spec = pl.BlockSpec((block,), lambda i: (i,))
  one_spec = pl.BlockSpec((1,), lambda i: (i,))
  counts = pl.pallas_call(
      functools.partial(_count_kernel, n, block), grid=grid, in_specs=[data_spec, data_spec],
      out_specs=one_spec, out_shape=jax.ShapeDtypeStruct(grid, jnp.int32), interpret=interpret)(nb, bb)
  offsets = jnp.cumsum(counts) - counts                       # exclusive prefix sum: each block's first slot
  whole = pl.BlockSpec(memory_space=pl.ANY)                   # scattered into at computed offsets
  idx, val = pl.pallas_call(
      functools.partial(_compact_kernel, n, block, capacity), grid=grid,
      in_specs=[one_spec, data_spec, data_spec, whole, whole], out_specs=[whole, whole],
      out_shape=[jax.ShapeDtypeStruct(idx0.shape, idx0.dtype), jax.ShapeDtypeStruct(val0.shape, val0.dtype)],
      input_output_aliases={3: 0, 4: 1}, interpret=interpret)(offsets, nb, bb, idx0, val0)
  return idx, val, jnp.sum(counts)


# ---------------------------------------------------------------------------------------------------------
# Scatter-apply

def _patch_operands(dst: Array, idx: Array, val: Array) -> tuple[Array, Array, Array]:
  dst, idx, val = jnp.asarray(dst), jnp.asarray(idx), jnp.asarray(val)
  u = bits_dtype(dst.dtype)
  if idx.ndim != 1 or val.shape != idx.shape:
    raise ValueError(f"scatter_apply: idx {idx.shape} and val {val.shape} must be equal 1-d shapes.")
  if bits_dtype(val.dtype) != u:
    raise ValueError(f"scatter_apply: val {val.dtype} must be {dst.dtype} or its bits ({u}).")
  _check_size(dst.size, "scatter_apply destination")
  return bits_view(dst).reshape(-1), idx.astype(jnp.int32), bits_view(val)


def _from_bits(flat: Array, like: Array) -> Array:
  like = jnp.asarray(like)
  if like.dtype == jnp.bool_:
    return flat.reshape(like.shape) != 0
  return lax.bitcast_convert_type(flat, like.dtype).reshape(like.shape)


def scatter_apply_reference(dst: Array, idx: Array, val: Array) -> Array:
  """The spec of `scatter_apply`: dst with dst.flat[idx_j] = val_j (bits) where 0 <= idx_j < dst.size."""
  flat, idx, val = _patch_operands(dst, idx, val)
  out = flat.at[jnp.where(idx >= 0, idx, flat.size)].set(val, mode="drop")
  return _from_bits(out, dst)


def _scatter_kernel(n, m, block, idx_ref, val_ref, dst_in_ref, dst_ref):
  del dst_in_ref                 # aliased to dst_ref: elements the patch does not name keep their bits
  pos = pl.program_id(0) * block + jnp.arange(block, dtype=jnp.int32)
  idx = idx_ref[...]
  ok = (pos < m) & (idx >= 0) & (idx < n)
  pl_triton.store(dst_ref.at[jnp.where(ok, idx, n)], val_ref[...], mask=ok)


@functools.partial(jax.jit, static_argnames=("blocks", "interpret"))
def scatter_apply(dst: Array, idx: Array, val: Array, *, blocks: SparseDeltaBlocks = SparseDeltaBlocks(),
                  interpret: bool = False) -> Array:
  """dst overwritten at the patch's valid entries (see the module docstring); equal to
  `scatter_apply_reference` bit for bit. val: dst's dtype or its unsigned bits. The kernel writes into its
  output in place (an alias of dst); without donation XLA copies dst first."""
  flat, idx, val = _patch_operands(dst, idx, val)
  n, m, block = flat.size, idx.size, blocks.apply
  if n == 0 or m == 0:
    return jnp.asarray(dst)
  spec = pl.BlockSpec((block,), lambda i: (i,))
  whole = pl.BlockSpec(memory_space=pl.ANY)
  out = pl.pallas_call(
      functools.partial(_scatter_kernel, n, m, block), grid=(pl.cdiv(m, block),),
      in_specs=[spec, spec, whole], out_specs=whole, out_shape=jax.ShapeDtypeStruct(flat.shape, flat.dtype),
      input_output_aliases={2: 0}, interpret=interpret)(idx, val, flat)
  return _from_bits(out, dst)
