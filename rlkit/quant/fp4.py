"""FP4 (E2M1) numbers and the two block-scaled FP4 formats, MXFP4 and NVFP4 (methods/systems.md §1).

E2M1 code (4 bits, `ml_dtypes.float4_e2m1fn`'s): bit 3 the sign, bits 2-1 the exponent (bias 1), bit 0 the
mantissa. The eight magnitudes, by code 0..7:

  0, 0.5, 1, 1.5, 2, 3, 4, 6        (codes 8..15: the same, negative; 8 is -0)

No infinity, no NaN. `encode_e2m1` rounds to the nearest magnitude, ties to the even code (the one with
mantissa bit 0: 0.25 -> 0, 0.75 -> 1, 1.25 -> 1, 1.75 -> 2, 2.5 -> 2, 3.5 -> 4, 5 -> 4), saturates beyond 6
(+-inf -> +-6), and maps NaN as ml_dtypes 0.7 and XLA's convert do: a NaN becomes a zero of the opposite sign
to its sign bit (+NaN -> code 8, -NaN -> code 0). So no NaN survives quantization; check before quantizing
where one must be noticed. The rounding is written as threshold comparisons in float32 (exact for bf16 and f32
inputs), so it runs inside Pallas kernels and XLA programs alike, bit for bit `astype(float4_e2m1fn)`
(tests/quant/test_fp4.py sweeps every bf16 value).

Packing (`pack_nibbles`): two codes per byte along one axis, the even element in the low nibble and the odd one
in the high nibble (the order of `float4_e2m1fn_x2` and of the FP4 GEMM layouts of cuBLAS/CUTLASS).

Block-scaled formats. A tensor is split into blocks of B consecutive elements along one axis (the contraction
axis of a matmul kernel); each block shares a scale s_b, element x is stored as the code of x / s_b:

  MXFP4 (OCP Microscaling v1.0): B = 32, s_b = 2^e an E8M0 number (the byte e + 127; 255 is NaN). Rules:
    'ocp'  e = floor(log2 amax_b) - 2 (2 = E2M1's largest exponent), the spec's rule; the block's largest
           element lands in [4, 8) and values above 6 saturate (OCP's clamp), so up to 25% of amax is clipped.
    'ceil' e = ceil(log2(amax_b / 6)): the smallest power of two that brings amax_b within 6, never clipping
           (qwix's `mxfp4` rule; its scales equal ours, tests/quant/test_fp4.py). An all-zero block: e = -127 for
           'ocp', 0 for 'ceil' (qwix: a scale below sqrt(float32 tiny) becomes 1).
  NVFP4 (NVIDIA): B = 16, s_b an E4M3 number times one float32 tensor scale t:
    s_b = e4m3(amax_b / 6 / t) * t,   t = amax_tensor / (6 * 448) (`tensor_scale=True`) or 1 (qwix's `nvfp4`,
    which has no tensor scale). t lets the E4M3 scales use their whole range whatever the tensor's magnitude;
    without it a block whose amax_b / 6 falls below E4M3's smallest subnormal (2^-9) gets scale 0, stored
    here as all-zero codes (qwix divides by it).

Stochastic rounding (`encode_e2m1_stochastic`): x rounds to the upper of its two bracketing magnitudes with
probability (|x| - lo) / (hi - lo), unbiased inside [-6, 6]. `bracket` gives those two codes, which TRACE uses
(rlkit/quant/trace.py): one bit per value says which of them the rollout's rounding chose.
"""
from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array
E2M1_MAX = 6.0
E4M3_MAX = 448.0
MAGNITUDES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0)
_MIDPOINTS = tuple((a + b) / 2 for a, b in zip(MAGNITUDES, MAGNITUDES[1:]))
BLOCK = {"mxfp4": 32, "nvfp4": 16}


def e2m1_values() -> np.ndarray:
  """The 16 values by code (float32; code 8 is -0)."""
  mags = np.asarray(MAGNITUDES, np.float32)
  return np.concatenate([mags, -mags])


def _magnitude_code(a: Array) -> Array:
  """The E2M1 magnitude code (0..7, int32) of |x| = a >= 0, round to nearest, ties to even, saturating."""
  code = jnp.zeros(a.shape, jnp.int32)
  for i, mid in enumerate(_MIDPOINTS):
    # Past midpoint i the value rounds up to code i+1; at the midpoint it goes to the even code of i, i+1.
    crossed = (a > mid) | ((a == mid) & (i % 2 == 1))
    code = code + crossed.astype(jnp.int32)
  return code


def _sign_bit(x32: Array) -> Array:
  return (jax.lax.bitcast_convert_type(x32, jnp.uint32) >> 31).astype(jnp.int32)


def encode_e2m1(x: Array) -> Array:
  """E2M1 codes (uint8, 0..15) of x (module docstring: RNE, saturating, NaN as ml_dtypes)."""
  x32 = jnp.asarray(x).astype(jnp.float32)
  sign = _sign_bit(x32)
  nan = jnp.isnan(x32)
  mag = jnp.where(nan, 0, _magnitude_code(jnp.abs(x32)))
  sign = jnp.where(nan, 1 - sign, sign)
  return (mag | (sign << 3)).astype(jnp.uint8)


def decode_e2m1(codes: Array) -> Array:
  """float32 values of E2M1 codes (uint8 or int)."""
  return jnp.asarray(e2m1_values())[jnp.asarray(codes).astype(jnp.int32) & 15]


def bracket(x: Array) -> tuple[Array, Array]:
  """(lo, hi): the E2M1 codes of the magnitudes just below-or-at and just above |x|, with x's sign (|x| in
  [0, 6]; beyond 6 both are 6's code). Where |x| is a magnitude, lo is its code and hi the next one up."""
  x32 = jnp.asarray(x).astype(jnp.float32)
  a = jnp.abs(x32)
  lo = jnp.zeros(a.shape, jnp.int32)
  for m in MAGNITUDES[1:]:
    lo = lo + (a >= m).astype(jnp.int32)
  hi = jnp.minimum(lo + 1, 7)
  sign = _sign_bit(x32) << 3
  return (lo | sign).astype(jnp.uint8), (hi | sign).astype(jnp.uint8)


def encode_e2m1_stochastic(x: Array, key: Array) -> Array:
  """E2M1 codes of x, rounded up to the upper bracketing magnitude with probability proportional to the
  distance from the lower one (unbiased for |x| <= 6; beyond, saturated)."""
  x32 = jnp.asarray(x).astype(jnp.float32)
  lo, hi = bracket(x32)
  vlo, vhi = jnp.abs(decode_e2m1(lo)), jnp.abs(decode_e2m1(hi))
  p = jnp.where(vhi > vlo, (jnp.abs(x32) - vlo) / jnp.where(vhi > vlo, vhi - vlo, 1.0), 0.0)
  up = jax.random.uniform(key, x32.shape) < p
  return jnp.where(jnp.isnan(x32), encode_e2m1(x32), jnp.where(up, hi, lo)).astype(jnp.uint8)


def pack_nibbles(codes: Array, axis: int = 0) -> Array:
  """Two 4-bit codes per byte along `axis` (even element low nibble, odd high); its length must be even."""
  codes = jnp.moveaxis(jnp.asarray(codes).astype(jnp.uint8), axis, 0)
  if codes.shape[0] % 2:
    raise ValueError(f"pack_nibbles: axis {axis} has odd length {codes.shape[0]}; pad it to an even length.")
  packed = codes[0::2] | (codes[1::2] << 4)
  return jnp.moveaxis(packed, 0, axis)


def unpack_nibbles(packed: Array, axis: int = 0) -> Array:
  """The inverse of `pack_nibbles`."""
  packed = jnp.moveaxis(jnp.asarray(packed), axis, 0)
  both = jnp.stack([packed & 15, packed >> 4], axis=1)
  return jnp.moveaxis(both.reshape((-1,) + packed.shape[1:]), 0, axis)


class BlockFP4(NamedTuple):
  """A block-scaled FP4 tensor, blocks along axis 0 (module docstring).

  codes: uint8, packed two per byte along axis 0: [ceil(K / B) * B / 2, ...] (K padded with zeros to whole
         blocks). scales: [ceil(K / B), ...]: MXFP4 uint8 E8M0 bytes, NVFP4 float8_e4m3fn. tensor_scale:
         float32 scalar (1 for MXFP4)."""
  codes: Array
  scales: Array
  tensor_scale: Array


def block_amax(x32: Array, block: int) -> tuple[Array, Array]:
  """(x padded with zeros along axis 0 to whole blocks, reshaped [nblocks, B, ...]; |x|'s max per block)."""
  k = x32.shape[0]
  pad = -k % block
  xp = jnp.pad(x32, [(0, pad)] + [(0, 0)] * (x32.ndim - 1))
  xb = xp.reshape((xp.shape[0] // block, block) + xp.shape[1:])
  return xb, jnp.max(jnp.abs(xb), axis=1)


def e8m0_exponent(amax: Array, rule: str) -> Array:
  """The MXFP4 shared exponent e (int32, in [-127, 127]) of blocks with largest magnitude `amax`."""
  if rule == "ocp":
    mant, exp = jnp.frexp(amax)                          # amax = mant * 2^exp, mant in [0.5, 1)
    e = jnp.where(amax > 0, exp - 1 - 2, -127)          # floor(log2 amax) - emax(E2M1)
  elif rule == "ceil":
    s = amax / E2M1_MAX
    e = jnp.where(s < math.sqrt(float(jnp.finfo(jnp.float32).tiny)), 0, jnp.ceil(jnp.log2(s)).astype(jnp.int32))
  else:
    raise ValueError(f"MXFP4 scale rule {rule!r}: choose 'ocp' (the OCP spec's floor rule) or 'ceil' (qwix's).")
  return jnp.clip(e, -127, 127).astype(jnp.int32)


def block_scales(fp4: BlockFP4) -> Array:
  """The float32 scale of every block, [nblocks, ...] (tensor scale included)."""
  if fp4.scales.dtype == jnp.uint8:                      # E8M0
    s = jnp.exp2(fp4.scales.astype(jnp.float32) - 127.0)
    s = jnp.where(fp4.scales == 255, jnp.nan, s)
  else:
    s = fp4.scales.astype(jnp.float32)
  return s * fp4.tensor_scale


def quantize_blocks(x: Array, fmt: str, *, rule: str = "ocp", tensor_scale: bool = True,
                    key: Array | None = None) -> BlockFP4:
  """x (blocks along axis 0) in `fmt` ('mxfp4' with scale `rule`, or 'nvfp4' with or without a tensor
  scale); `key` set: stochastic rounding of the scaled values (module docstring)."""
  if fmt not in BLOCK:
    raise ValueError(f"FP4 format {fmt!r}: choose one of {sorted(BLOCK)}.")
  x32 = jnp.asarray(x).astype(jnp.float32)
  xb, amax = block_amax(x32, BLOCK[fmt])
  if fmt == "mxfp4":
    e = e8m0_exponent(amax, rule)
    scales, t = (e + 127).astype(jnp.uint8), jnp.float32(1.0)
    s = jnp.exp2(e.astype(jnp.float32))
  else:
    tmax = jnp.max(amax) if amax.size else jnp.float32(0.0)
    t = jnp.where(tmax > 0, tmax / (E2M1_MAX * E4M3_MAX), 1.0).astype(jnp.float32) if tensor_scale \
        else jnp.float32(1.0)
    scales = jnp.clip(amax / E2M1_MAX / t, -E4M3_MAX, E4M3_MAX).astype(jnp.float8_e4m3fn)
    s = scales.astype(jnp.float32) * t
  s = jnp.expand_dims(s, 1)
  q = jnp.where(s > 0, xb / jnp.where(s > 0, s, 1.0), 0.0)
  codes = encode_e2m1(q) if key is None else encode_e2m1_stochastic(q, key)
  codes = codes.reshape((-1,) + x32.shape[1:])
  return BlockFP4(pack_nibbles(codes, 0), scales, t)


def dequantize_blocks(fp4: BlockFP4, k: int | None = None) -> Array:
  """The float32 tensor `fp4` stands for (its first `k` rows along axis 0; default all, padding included)."""
  values = decode_e2m1(unpack_nibbles(fp4.codes, 0))
  nblocks = fp4.scales.shape[0]
  vb = values.reshape((nblocks, -1) + values.shape[1:])
  out = (vb * jnp.expand_dims(block_scales(fp4), 1)).reshape(values.shape)
  return out if k is None else out[:k]
