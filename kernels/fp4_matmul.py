"""FP4 weight-only matmul: y = x · W with W stored block-scaled FP4 (rlkit/quant/fp4.py), dequantized inside the
kernel (TRACE's rollout path, methods/systems.md §1).

  x: [M, K] bfloat16 or float32       W: BlockFP4, blocks of B (32 MXFP4, 16 NVFP4) along K:
                                          codes  uint8 [K/2, N] (two E2M1 codes per byte, even k low nibble)
                                          scales uint8 E8M0 or float8_e4m3fn [K/B, N]; tensor scale t (f32)
  y = (x · (decode(codes) * scale_b)) * t      float32 [M, N], float32 accumulation

Each grid step (i, j, s) owns a [bm, bn] tile of y and the s-th of `split_k` stretches of K: a loop over its
bk-wide pieces loads the [bk/2, bn] bytes and [bk/B, bn] scales of W's piece, decodes the low and high nibbles
from their bits (no table: a gather does not lower everywhere) into two [bk/2, bn] halves (the even and odd rows
of W), multiplies them by their block scales and accumulates x_even · W_even + x_odd · W_odd in float32 (x's
even and odd columns are split once outside the kernel: Triton cannot interleave the halves along a leading
axis). The grid has no sequential axis, as the GPU (Triton) backend runs every grid step in parallel: each
split writes its own partial sum, and the splits are added outside (split_k > 1 fills the GPU at decode shapes,
where M / bm x N / bn steps are fewer than its multiprocessors). Each decoded half is cast to x's dtype before
the dot: every E2M1 value times an E8M0 or E4M3 scale has at most 6 significant bits, so the cast to bf16 is
exact (barring scales outside bf16's range). The tensor scale t multiplies the sum at the end, where its
arbitrary float32 mantissa cannot round the weights.

Why dequantize in the kernel: at decode shapes (M <= 16) the matmul is memory-bound, and W's bytes dominate;
FP4 moves half a byte per weight (plus 1 byte per block) against bf16's 2, the ~3.6x ceiling the benchmark
(benchmarks/fp4_matmul.py) compares with.

`fp4_matmul_reference` is the spec: the same product through `rlkit.quant.fp4.dequantize_blocks` and one
`jnp.dot`. On CPU the kernel runs with `interpret=True` (tests check it against the reference over odd
shapes); compiled, it runs on the GPU (Triton) backend, where it equals the reference (an H200; speed in
benchmarks/README.md). Shapes that do not divide into the tiles are padded with zeros (zero codes decode to 0)
and cropped.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pl_triton

from rlkit.quant.fp4 import BlockFP4, dequantize_blocks

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class FP4MatmulBlocks:
  """Tile sizes: bm rows of x, bn columns of W, bk of the contraction per loop step (a multiple of the format's
  block), and split_k parallel stretches of K per output tile (module docstring); powers of two, as Triton
  requires."""
  bm: int = 16
  bn: int = 64
  bk: int = 256
  split_k: int = 4
  num_warps: int = 4     # Triton's compiler parameters (GPU only)
  num_stages: int = 3

  def __post_init__(self):
    for name in ("bm", "bn", "bk", "split_k", "num_warps"):
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
  """float32 E2M1 values of 4-bit codes (int32), assembled as float32 bits (no table: a gather does not lower
  everywhere): exponent field e, mantissa bit m; |v| = m / 2 (exponent 126) if e == 0, else (1 + m / 2) *
  2^(e - 1) (exponent e + 126, mantissa bit m); the sign bit from bit 3. On an H200 this took the kernel from
  0.098 to 0.062 ms at M = 1 (K = N = 8192) against computing the magnitude in float32 (benchmarks/HISTORY.md)."""
  e, m = (codes >> 1) & 3, codes & 1
  mag = jnp.where(e == 0, m * (126 << 23), ((e + 126) << 23) | (m << 22))
  return jax.lax.bitcast_convert_type(mag | ((codes & 8) << 28), jnp.float32)


def _scale_values(scales: Array) -> Array:
  if scales.dtype == jnp.uint8:                                     # E8M0: 2^(s - 127); 255 is NaN
    s = jnp.exp2(scales.astype(jnp.float32) - 127.0)
    return jnp.where(scales == 255, jnp.nan, s)
  return scales.astype(jnp.float32)


def _expand_scales(scales: Array, block: int) -> Array:
  """[bk/B, bn] block scales repeated over the B/2 rows of a nibble half that each covers."""
  per, bn = scales.shape
  return jnp.broadcast_to(scales[:, None, :], (per, block // 2, bn)).reshape((per * block // 2, bn))


def _kernel(xe_ref, xo_ref, c_ref, s_ref, o_ref, *, block: int, bk: int):
  half, per = bk // 2, bk // block                                 # rows of codes and of scales per step

  def step(t, acc):
    packed = c_ref[pl.ds(t * half, half), :].astype(jnp.int32)     # [bk/2, bn]: rows 2r (low) and 2r+1 (high)
    scales = _expand_scales(_scale_values(s_ref[pl.ds(t * per, per), :]), block)   # [bk/B, bn] -> [bk/2, bn]
    xe, xo = xe_ref[:, pl.ds(t * half, half)], xo_ref[:, pl.ds(t * half, half)]
    even = (_decode_tile(packed & 15) * scales).astype(xe.dtype)
    odd = (_decode_tile(packed >> 4) * scales).astype(xe.dtype)
    return (acc + jnp.dot(xe, even, preferred_element_type=jnp.float32)
            + jnp.dot(xo, odd, preferred_element_type=jnp.float32))

  steps = c_ref.shape[0] // half
  o_ref[...] = jax.lax.fori_loop(0, steps, step, jnp.zeros(o_ref.shape, jnp.float32))


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
  split = min(blocks.split_k, -(-k // bk))                         # no split without a piece of K
  xp = _pad_to(_pad_to(x, 0, bm), 1, bk * split)
  xe, xo = xp[:, 0::2], xp[:, 1::2]
  codes = _pad_to(_pad_to(w.codes, 0, xp.shape[1] // 2), 1, bn)
  scales = _pad_to(_pad_to(w.scales, 0, xp.shape[1] // block), 1, bn)
  half_k, scale_k = xe.shape[1] // split, scales.shape[0] // split  # each split's stretch of K
  grid = (xp.shape[0] // bm, codes.shape[1] // bn, split)
  out = pl.pallas_call(
      functools.partial(_kernel, block=block, bk=bk),
      out_shape=jax.ShapeDtypeStruct((split, xp.shape[0], codes.shape[1]), jnp.float32),
      grid=grid,
      in_specs=[pl.BlockSpec((bm, half_k), lambda i, j, s: (i, s)),
                pl.BlockSpec((bm, half_k), lambda i, j, s: (i, s)),
                pl.BlockSpec((half_k, bn), lambda i, j, s: (s, j)),
                pl.BlockSpec((scale_k, bn), lambda i, j, s: (s, j))],
      out_specs=pl.BlockSpec((pl.squeezed, bm, bn), lambda i, j, s: (s, i, j)),
      compiler_params=pl_triton.CompilerParams(num_warps=blocks.num_warps, num_stages=blocks.num_stages),
      interpret=interpret,
  )(xe, xo, codes, scales)
  return out.sum(axis=0)[:m, :n] * w.tensor_scale


def _pow2_at_least(n: int) -> int:
  return 1 << max(n - 1, 0).bit_length()
