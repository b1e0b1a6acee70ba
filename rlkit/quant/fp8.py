"""The fp8 weight-only format of the sampler copy (`rl.sync.quantizer = "fp8"`; ours, the layout of a
per-channel FP8 (E4M3) weight-only kernel: fp8 weights, one float32 scale per output channel; methods/systems.md §1).

A kernel W whose leading `k` axes are contracted is stored as float8_e4m3fn codes c and one float32 scale per
output channel o (`int8.channel_scale` with E4M3's largest finite value, 448):

  s_o = max_i |W_io| / 448,   c_io = e4m3(clip(W_io / s_o, -448, 448))   (round to nearest even)

E4M3 keeps 3 mantissa bits, so a code is within half a step of W_io / s_o: at most 2^-4 |c| for |c| >= 2^-6,
at most 2^-10 below that (subnormals); the clip keeps a quotient that rounds past 448 from becoming NaN (E4M3FN
has no infinity). The codes are an `int8.ChannelScaledWeight`, so the sampler's weight matmul is the int8
format's: y = (x·c)·s, with c exact in bfloat16 (every E4M3 value is) and the scale applied to the float32
accumulator, as a W8A16 fp8 kernel upcasts its tile and scales at the end. The sampler still computes in
sync.dtype; norms, biases and the embedding stay in sync.dtype (rlkit/quant/quantizers.py).

Why per channel: unscaled E4M3 (sync.dtype = 'float8_e4m3fn') would also round the norms and the embedding and
put most small weights among the subnormals; serving stacks scale fp8 weights per tensor or per channel.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rlkit.quant.int8 import ChannelScaledWeight, channel_scale

Array = jax.Array
FP8 = jnp.float8_e4m3fn
FP8_MAX = float(jnp.finfo(FP8).max)      # 448


def quantize_fp8(w: Array, in_axes: int, dtype: str = "") -> ChannelScaledWeight:
  """W (its leading `in_axes` axes contracted) as float8_e4m3fn codes and per-channel scales (module docstring),
  presenting `dtype` ('' : W's own)."""
  w32 = w.astype(jnp.float32)
  scale = channel_scale(w32, in_axes, FP8_MAX)
  codes = jnp.clip(w32 / scale, -FP8_MAX, FP8_MAX).astype(FP8)
  return ChannelScaledWeight(codes, scale, jnp.dtype(dtype or w.dtype).name)
