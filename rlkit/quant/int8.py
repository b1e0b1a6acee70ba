"""Per-channel scaled kernels and the int8 weight-only format of the sampler copy (`rl.sync.quantizer = "int8"`;
ours, with the weight layout of JAX's TPU Pallas quantized matmul: int8 weights, one float32 scale per output
channel; methods/systems.md §1).

A kernel W whose leading `k` axes are its inputs (contracted) and whose other axes are output channels o is
stored as int8 codes c and one float32 scale per output channel, symmetric, round to nearest even:

  s_o = max_i |W_io| / 127   (1 for an all-zero channel),   c_io = clip(RNE(W_io / s_o), -127, 127)

so |W - c·s| <= s/2 elementwise (a relative error of at most 1/254 of the channel's largest weight). The
sampler's weight matmul (the hook of rlkit/models/matmul.py) computes

  y = (x·c)·s

The scale is constant along the contraction, so it factors out of the sum, and c is exact in bf16
(|c| <= 127 < 2^8): the only roundings are x's cast, the float32 accumulation and the scaling. This is what a weight-only
int8 kernel does (upcast the int8 tile in registers, scale the accumulator at the end).

Layout: the scale keeps the kernel's rank with size 1 on the contracted axes, so it broadcasts against the
codes, a transpose applies to both, and the reshapes the model makes of a kernel (merging its input axes
together, or its output axes together: `reshape(D, -1)` of qkv, `reshape(-1, D)` of o) carry over to it
(`_carried_scale_shape`); a reshape that mixes the two kinds in one axis returns the dequantized array.
"""
from __future__ import annotations

import math
from typing import Optional

import flax.struct
import jax
import jax.numpy as jnp

from rlkit.models.matmul import QuantizedWeight

Array = jax.Array
INT8_MAX = 127          # symmetric: -128 is never used, so negation and the scale's range stay symmetric


def _axes(args) -> tuple:
  """numpy's convention: `f(a, b)` and `f((a, b))` mean the same."""
  return tuple(args[0]) if len(args) == 1 and isinstance(args[0], (tuple, list)) else tuple(args)


def _carried_scale_shape(shape: tuple, scale: tuple, new: tuple) -> Optional[tuple]:
  """The scale's shape after the codes go from `shape` to `new` (-1 allowed), or None when a new axis would
  merge contracted axes (scale 1) with channel axes (scale = the axis' size)."""
  new = list(new)
  if -1 in new:
    new[new.index(-1)] = math.prod(shape) // max(math.prod(d for d in new if d != -1), 1)
  out, i, j = [], 0, 0
  while i < len(shape) or j < len(new):
    # The next run of old axes and run of new axes with equal products: a reshape merges or splits runs.
    old_run, new_run, a, b = [], [], 1, 1
    while not (old_run or new_run) or a != b:
      if (a <= b or j == len(new)) and i < len(shape):
        old_run.append(i)
        a *= shape[i]
        i += 1
      elif j < len(new):
        new_run.append(j)
        b *= new[j]
        j += 1
      else:
        raise ValueError(f"cannot reshape {shape} to {tuple(new)}")
    kinds = {scale[k] == 1 for k in old_run if shape[k] != 1}
    if len(kinds) > 1:
      return None
    out.extend(new[k] if kinds == {False} else 1 for k in new_run)
  return tuple(out)


@flax.struct.dataclass
class ChannelScaledWeight(QuantizedWeight):
  """codes · scale, the scale broadcast over the contracted axes (module docstring)."""
  codes: Array             # the kernel's shape, int8 (or float8_e4m3fn: rlkit/quant/fp8.py)
  scale: Array             # float32, the kernel's rank: 1 on contracted axes, the channel's size elsewhere
  compute: str = flax.struct.field(pytree_node=False, default="float32")   # the dtype it presents

  @property
  def shape(self) -> tuple:
    return tuple(self.codes.shape)

  @property
  def dtype(self):
    return jnp.dtype(self.compute)

  def astype(self, dtype) -> "ChannelScaledWeight":
    return self.replace(compute=jnp.dtype(dtype).name)

  def dequantize(self) -> Array:
    return (self.codes.astype(jnp.float32) * self.scale.astype(jnp.float32)).astype(self.dtype)

  def transpose(self, *axes) -> "ChannelScaledWeight":
    axes = _axes(axes) or tuple(reversed(range(self.ndim)))
    return self.replace(codes=self.codes.transpose(axes), scale=self.scale.transpose(axes))

  def reshape(self, *shape):
    shape = _axes(shape)
    scale = _carried_scale_shape(self.shape, tuple(self.scale.shape), shape)
    if scale is None:
      return self.dequantize().reshape(shape)
    return self.replace(codes=self.codes.reshape(shape), scale=self.scale.reshape(scale))

  def matmul(self, eq: str, x: Array) -> Array:
    (_, ws), ys = eq.split("->")[0].split(","), eq.split("->")[1]
    if any(c not in ys and d != 1 for c, d in zip(ws, self.scale.shape)):
      return super().matmul(eq, x)          # contracts a channel axis: the scale does not factor out
    y = jnp.einsum(eq, x, self.codes.astype(x.dtype), preferred_element_type=jnp.float32)
    channels = "".join(c for c in ws if c in ys)
    s = self.scale.astype(jnp.float32).reshape([d for c, d in zip(ws, self.scale.shape) if c in ys])
    in_y_order = "".join(c for c in ys if c in channels)
    s = jnp.einsum(f"{channels}->{in_y_order}", s)
    return y * s.reshape([y.shape[k] if c in channels else 1 for k, c in enumerate(ys)])


def channel_scale(w32: Array, in_axes: int, code_max: float) -> Array:
  """Per-output-channel scale `max_i |W_io| / code_max` (1 for an all-zero channel), float32, with W's rank
  (size 1 on the `in_axes` contracted axes): a channel's largest weight maps to the code `code_max`."""
  amax = jnp.max(jnp.abs(w32), axis=tuple(range(in_axes)), keepdims=True)
  return jnp.where(amax > 0, amax / code_max, 1.0).astype(jnp.float32)


def quantize_int8(w: Array, in_axes: int, dtype: str = "") -> ChannelScaledWeight:
  """W (its leading `in_axes` axes contracted) as int8 codes and per-channel scales (module docstring),
  presenting `dtype` ('' : W's own)."""
  w32 = w.astype(jnp.float32)
  scale = channel_scale(w32, in_axes, INT8_MAX)
  codes = jnp.clip(jnp.round(w32 / scale), -INT8_MAX, INT8_MAX).astype(jnp.int8)
  return ChannelScaledWeight(codes, scale, jnp.dtype(dtype or w.dtype).name)
