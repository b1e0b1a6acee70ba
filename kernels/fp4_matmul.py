"""FP4 weight-only matmul: y = x · W with W stored block-scaled FP4 (rlkit/quant/fp4.py), dequantized inside the
kernel (TRACE's rollout path, methods/systems.md §1).

  x: [M, K] bfloat16 or float32       W: BlockFP4, blocks of B (32 MXFP4, 16 NVFP4) along K:
                                          codes  uint8 [K/2, N] (two E2M1 codes per byte, even k low nibble)
                                          scales uint8 E8M0 or float8_e4m3fn [K/B, N]; tensor scale t (f32)
  y = (x · (decode(codes) * scale_b)) * t      float32 [M, N], float32 accumulation

Each grid step (i, j, k) loads a [bm, bk] tile of x, the [bk/2, bn] bytes and [bk/B, bn] scales of W's tile,
unpacks the nibbles, decodes E2M1 arithmetically (no table: a gather does not lower everywhere), multiplies by
the block scales and accumulates x_tile · W_tile into the resident [bm, bn] output in float32. The decoded tile
is cast to x's dtype before the dot: every E2M1 value times an E8M0 or E4M3 scale has at most 6 significant
bits, so the cast to bf16 is exact (barring scales outside bf16's range). The tensor scale t multiplies the
accumulator at the end, where its arbitrary float32 mantissa cannot round the weights.

Why dequantize in the kernel: at decode shapes (M <= 16) the matmul is memory-bound, and W's bytes dominate;
FP4 moves half a byte per weight (plus 1 byte per block) against bf16's 2, the ~3.6x ceiling the benchmark
(benchmarks/fp4_matmul.py) compares with.

`fp4_matmul_reference` is the spec: the same product through `rlkit.quant.fp4.dequantize_blocks` and one
`jnp.dot`. On CPU the kernel runs with `interpret=True` (tests check it against the reference over odd
shapes); compiled, it is written for the GPU (Triton) backend, where it has not yet run (no session has had a
GPU). Shapes that do not divide into the tiles are padded with zeros (zero codes decode to 0) and cropped.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from rlkit.quant.fp4 import BlockFP4, dequantize_blocks

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class FP4MatmulBlocks:
  """Tile sizes: bm rows of x, bn columns of W, bk of the contraction per grid step (bk a multiple of the
  format's block and even; powers of two, as Triton requires)."""
  bm: int = 16
  bn: int = 128
  bk: int = 256

  def __post_init__(self):
    for name in ("bm", "bn", "bk"):
      size = getattr(self, name)
      if size < 1 or size & (size - 1):
        raise ValueError(f"FP4MatmulBlocks.{name}={size} must be a positive power of two.")


def fp4_matmul_reference(x: Array, w: BlockFP4) -> Array:
  """x · W in float32 through the dequantized W (module docstring); x [M, K], W covering K rows."""
  k = x.shape[-1]
  dense = dequantize_blocks(w, k)
  return jnp.dot(x.astype(jnp.float32), dense, preferred_element_type=jnp.float32,
                 precision=jax.lax.Precision.HIGHEST)


def _decode_tile(codes: Array) -> Array:
  """float32 E2M1 values of 4-bit codes (int32), arithmetically: exponent field e, mantissa bit m,
  |v| = m / 2 if e == 0 else (1 + m / 2) * 2^(e - 1)."""
  e, m = (codes >> 1) & 3, (codes & 1).astype(jnp.float32)
  pow2 = (jnp.left_shift(1, e) >> 1).astype(jnp.float32)           # 2^(e-1) for e >= 1, 0 for e == 0
  mag = jnp.where(e == 0, 0.5 * m, (1.0 + 0.5 * m) * pow2)
  return jnp.where((codes & 8) != 0, -mag, mag)


def _scale_values(scales: Array) -> Array:
  if scales.dtype == jnp.uint8:                                     # E8M0: 2^(s - 127); 255 is NaN
    s = jnp.exp2(scales.astype(jnp.float32) - 127.0)
    return jnp.where(scales == 255, jnp.nan, s)
  return scales.astype(jnp.float32)


def _kernel(x_ref, c_ref, s_ref, o_ref, *, block: int):
  @pl.when(pl.program_id(2) == 0)
  def _():
    o_ref[...] = jnp.zeros(o_ref.shape, jnp.float32)

  packed = c_ref[...].astype(jnp.int32)                             # [bk/2, bn]
  codes = jnp.stack([packed & 15, packed >> 4], axis=1).reshape((-1, packed.shape[1]))   # [bk, bn]
  vals = _decode_tile(codes)
  scales = _scale_values(s_ref[...])                               # [bk/B, bn]
  w = (vals.reshape((scales.shape[0], block, vals.shape[1])) * scales[:, None, :]).reshape(vals.shape)
  x = x_ref[...]
  o_ref[...] += jnp.dot(x, w.astype(x.dtype), preferred_element_type=jnp.float32)


def _pad_to(a: Array, axis: int, multiple: int) -> Array:
  pad = -a.shape[axis] % multiple
  if not pad:
    return a
  widths = [(0, 0)] * a.ndim
  widths[axis] = (0, pad)
  return jnp.pad(a, widths)


@functools.partial(jax.jit, static_argnames=("blocks", "interpret"))
def fp4_matmul(x: Array, w: BlockFP4, *, blocks: FP4MatmulBlocks = FP4MatmulBlocks(),
               interpret: bool = False) -> Array:
  """x [M, K] (bf16 or f32) times block-scaled FP4 W [K, N] -> float32 [M, N] (module docstring)."""
  m, k = x.shape
  kw, n = 2 * w.codes.shape[0], w.codes.shape[1]
  block = kw // w.scales.shape[0]
  if kw < k or k <= kw - block:
    raise ValueError(f"fp4_matmul: x has K={k} but W covers {kw} rows (blocks of {block}); quantize a "
                     f"[{k}, N] kernel with rlkit.quant.fp4.quantize_blocks.")
  if blocks.bk % block or blocks.bk < block:
    raise ValueError(f"FP4MatmulBlocks.bk={blocks.bk} must be a multiple of the format's block {block}.")
  # bm and bn stay as given (x and W are padded up to them): Triton's dot needs tiles of at least 16.
  bm, bn, bk = blocks.bm, blocks.bn, min(blocks.bk, max(block, _pow2_at_least(k)))   # bk: still a multiple
  xp = _pad_to(_pad_to(x, 0, bm), 1, bk)
  codes = _pad_to(_pad_to(w.codes, 0, bk // 2), 1, bn)
  scales = _pad_to(_pad_to(w.scales, 0, bk // block), 1, bn)
  grid = (xp.shape[0] // bm, codes.shape[1] // bn, codes.shape[0] * 2 // bk)
  out = pl.pallas_call(
      functools.partial(_kernel, block=block),
      out_shape=jax.ShapeDtypeStruct((xp.shape[0], codes.shape[1]), jnp.float32),
      grid=grid,
      in_specs=[pl.BlockSpec((bm, bk), lambda i, j, kk: (i, kk)),
                pl.BlockSpec((bk // 2, bn), lambda i, j, kk: (kk, j)),
                pl.BlockSpec((bk // block, bn), lambda i, j, kk: (kk, j))],
      out_specs=pl.BlockSpec((bm, bn), lambda i, j, kk: (i, j)),
      interpret=interpret,
  )(xp, codes, scales)
  return out[:m, :n] * w.tensor_scale


def _pow2_at_least(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()
