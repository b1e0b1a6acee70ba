"""TRACE: rollout-guided FP4 rounding for quantization-aware RL training (arXiv 2610.07767; methods/systems.md §1).

The rollout computes in low precision and quantizes its MoE experts' activations to FP4; the trainer computes the
same activations in higher precision, so a value near an E2M1 rounding boundary can round the other way (2.51 ->
3, 2.49 -> 2): the trainer's forward then differs from the rollout's by a whole FP4 step, and in an MoE the gap
grows and flips routing. TRACE keeps the rollout's decisions: the rollout records, per quantized value, one bit
(the least significant bit of its E2M1 code) and the block scales; the trainer then rounds each value to whichever
of its two bracketing codes has that bit.

  rollout   s_r = block scales of x_roll,  q_r = RTN(x_roll / s_r),  hint = q_r & 1 (and s_r)
  trainer   z = clip(x_train / s_r, -6, 6),  {q-, q+} = the E2M1 codes bracketing z,
            q* = the one of q-, q+ whose LSB equals the hint (adjacent codes differ in their LSB)
            forward  s_r * decode(q*),   backward  straight through to x_train (STE)

so |q* - q_r| <= |RTN(z) - q_r|: guided rounding never widens the local gap, and removes it whenever the two
paths land in adjacent codes (the paper: >99% of mismatches). Without a hint (`rtn`): RTN with the trainer's own
scales and the same STE (plain QAT, the baseline).

Blocks run along the last axis (the features an expert's matmul contracts). Scales (ours, DESIGN): NVFP4 uses one
E4M3 scale per 16 features times a float32 scale per token (the token's amax / (6 * 448)), MXFP4 one E8M0 scale
per 32 features ('ocp' rule): per-token, not per-tensor, so a token's scales do not depend on which other tokens
share its batch (a decode step holds one token per row, the trainer's forward the whole sequence).

The record (`record`, `hint_from`): "bits" keeps the paper's payload, the LSBs packed 8 to a byte (`pack_bits`:
1/8 of a byte per value, plus the scales); "codes" keeps whole E2M1 codes, a byte each, so the trainer can also
measure the full-code mismatch, which counts the disagreements a one-bit hint cannot see (codes two or more
steps apart). Both guide the rounding identically.

Metrics (`mismatch`): the fraction of values whose trainer code's LSB differs from the hint: the adjacent-code
disagreements with the rollout (0 for guided rounding, except where a value saturates at 6 and both brackets
coincide).
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from rlkit.quant import fp4

Array = jax.Array


class Hint(NamedTuple):
  """The rollout's record of one quantization point: `bits` [..., D] uint8 (the LSB of each E2M1 code),
  `scales` [..., D / B] float32 (each block's full scale)."""
  bits: Array
  scales: Array


def block_scales(x: Array, fmt: str) -> Array:
  """float32 scale of every block of B features along x's last axis (module docstring), [..., D / B]."""
  block = fp4.BLOCK[fmt]
  x32 = x.astype(jnp.float32)
  if x32.shape[-1] % block:
    raise ValueError(f"TRACE {fmt}: the quantized axis has {x32.shape[-1]} features, not a multiple of {block}.")
  amax = jnp.max(jnp.abs(x32.reshape(x32.shape[:-1] + (-1, block))), axis=-1)
  if fmt == "mxfp4":
    return jnp.exp2(fp4.e8m0_exponent(amax, "ocp").astype(jnp.float32))
  token = jnp.max(amax, axis=-1, keepdims=True) / (fp4.E2M1_MAX * fp4.E4M3_MAX)
  token = jnp.where(token > 0, token, 1.0)
  e4m3 = jnp.clip(amax / fp4.E2M1_MAX / token, 0, fp4.E4M3_MAX).astype(jnp.float8_e4m3fn).astype(jnp.float32)
  return e4m3 * token


def _per_feature(scales: Array, d: int) -> Array:
  return jnp.repeat(scales, d // scales.shape[-1], axis=-1)


def _scaled(x: Array, scales: Array) -> Array:
  s = _per_feature(scales, x.shape[-1])
  return jnp.where(s > 0, x.astype(jnp.float32) / jnp.where(s > 0, s, 1.0), 0.0)


def rtn_codes(x: Array, fmt: str) -> tuple[Array, Array]:
  """(E2M1 codes [..., D] uint8, scales [..., D / B]) of x rounded to nearest with its own scales: what the
  rollout computes and records (its hint is `codes & 1` with these scales)."""
  scales = block_scales(x, fmt)
  return fp4.encode_e2m1(_scaled(x, scales)), scales


def guided_codes(x: Array, hint: Hint) -> Array:
  """The E2M1 codes TRACE picks for x under the rollout's `hint` (module docstring)."""
  z = jnp.clip(_scaled(x, hint.scales), -fp4.E2M1_MAX, fp4.E2M1_MAX)
  lo, hi = fp4.bracket(z)
  # On a grid point z is its own code (lo): the rollout's code is then lo or a neighbour on an unknown side,
  # and lo is never farther from it than the other bracket.
  on_grid = jnp.abs(fp4.decode_e2m1(lo)) == jnp.abs(z)
  return jnp.where(~on_grid & ((hi & 1) == hint.bits), hi, lo)


def _dequant(codes: Array, scales: Array) -> Array:
  return fp4.decode_e2m1(codes) * _per_feature(scales, codes.shape[-1])


def _straight_through(x: Array, x_hat: Array) -> Array:
  return x + jax.lax.stop_gradient(x_hat.astype(x.dtype) - x)


def fake_quant(x: Array, fmt: str, hint: Hint | None = None) -> tuple[Array, Array, Array]:
  """(x quantized and dequantized, in x's dtype, with a straight-through gradient; its codes [..., D] uint8;
  the scales [..., D / B]): guided by the rollout's `hint` (TRACE, its scales), or RTN with x's own scales (no
  hint: QAT's baseline, and the rollout's own quantization)."""
  if hint is None:
    codes, scales = rtn_codes(x, fmt)
  else:
    codes, scales = guided_codes(x, hint), hint.scales
  return _straight_through(x, _dequant(codes, scales)), codes, scales


def hint_of(codes: Array, scales: Array) -> Hint:
  """The hint the rollout records for its codes and scales."""
  return Hint((codes & 1).astype(jnp.uint8), scales.astype(jnp.float32))


def pack_bits(codes: Array) -> Array:
  """The hint's payload: each E2M1 code's least significant bit, 8 to a byte along the last axis (value 8i + j
  in bit j of byte i; D a multiple of 8, as every FP4 block size is), [..., D / 8] uint8."""
  bits = (codes & 1).astype(jnp.uint8).reshape(codes.shape[:-1] + (-1, 8))
  return jnp.sum(bits << jnp.arange(8, dtype=jnp.uint8), axis=-1, dtype=jnp.uint8)


def unpack_bits(packed: Array) -> Array:
  """`pack_bits`'s inverse: [..., D / 8] uint8 -> the bits [..., D] uint8."""
  bits = (packed[..., None] >> jnp.arange(8, dtype=jnp.uint8)) & 1
  return bits.reshape(packed.shape[:-1] + (-1,)).astype(jnp.uint8)


def record(codes: Array, scales: Array, kind: str) -> dict:
  """What the rollout keeps of one quantization point: {codes (whole E2M1 codes) or bits (`pack_bits`), scales}
  (`kind` "codes" or "bits"; the keys without the point's prefix)."""
  return {kind: codes if kind == "codes" else pack_bits(codes), "scales": scales}


def hint_from(rec: dict) -> Hint:
  """The hint of a `record` (either kind)."""
  if "bits" in rec:
    return Hint(unpack_bits(rec["bits"]), rec["scales"].astype(jnp.float32))
  return hint_of(rec["codes"], rec["scales"])


def mismatch(codes: Array, hint: Hint, mask: Array | None = None) -> Array:
  """The fraction of values whose code's LSB differs from the hint's (over `mask`'s True rows, broadcast
  over the feature axis)."""
  differ = ((codes & 1) != hint.bits).astype(jnp.float32)
  if mask is None:
    return differ.mean()
  m = jnp.broadcast_to(mask[..., None], differ.shape).astype(jnp.float32)
  return jnp.sum(differ * m) / jnp.maximum(m.sum(), 1.0)
