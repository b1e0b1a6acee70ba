"""The decoder's building blocks (`rlkit.models.transformer` assembles them): dtypes, positions, the projection
hook, RMSNorm, RoPE, the parameter initialiser and the fused SwiGLU with its hand-written backward pass.

`project` is where weights meet activations: the weight matmul (`rlkit.models.matmul`, float32 accumulation),
or the decode layout's features-major copy (`rlkit.models.decode_layout`), plus the low-rank term of LoRA
adapters and LoGRA sketches (`rlkit.models.lora.low_rank_term`).
"""
from __future__ import annotations

import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from rlkit.models.decode_layout import NK, dot_nk
from rlkit.models.lora import low_rank_term
from rlkit.models.matmul import QuantizedWeight, weight_matmul

Array = jax.Array

_DTYPES = {"float32": jnp.float32, "bfloat16": jnp.bfloat16, "float16": jnp.float16}


def as_dtype(name_or_dtype: Any) -> Any:
  if isinstance(name_or_dtype, str):
    if name_or_dtype not in _DTYPES:
      raise ValueError(f"Unknown dtype {name_or_dtype!r}; use one of {sorted(_DTYPES)}.")
    return _DTYPES[name_or_dtype]
  return name_or_dtype


def positions_from_mask(mask: Array) -> Array:
  """Position ids for left-padded rows: real tokens count 0, 1, 2, ...; pads get 0."""
  return jnp.maximum(jnp.cumsum(mask.astype(jnp.int32), axis=-1) - 1, 0)


def compute_dot(eq: str, x: Array, w: Array, dtype) -> Array:
  """Matmul in the compute dtype with float32 accumulation, result in the compute dtype."""
  return weight_matmul(eq, x.astype(dtype), w.astype(dtype)).astype(dtype)


def kernel_param(module: nn.Module, name: str, init, shape: tuple, dtype) -> Any:
  """`module.param(name, init, shape, dtype)` for a matmul kernel, which the sampler's copy may hold as a
  QuantizedWeight (rlkit/quant): flax checks a param's shape on its first pytree leaf, which for a packed
  format (FP4: two codes per byte) is not the kernel's shape, so such a weight is checked here by the shape it
  presents."""
  if module.has_variable("params", name):
    value = module.get_variable("params", name)
    if isinstance(value, QuantizedWeight):
      if tuple(value.shape) != tuple(shape):
        raise ValueError(f"quantized kernel {name!r} presents shape {tuple(value.shape)}, the model expects "
                         f"{tuple(shape)}: the sampler copy was exported from another model config.")
      return value
  return module.param(name, init, shape, dtype)


# Decode layout (rlkit/models/decode_layout.py): `project` reads a weight's features-major copy when the
# params carry one.
def project(module: nn.Module, name: str, eq: str, eq_nk: str, x: Array, w: Array, dtype) -> Array:
  """`x` times weight `name` (`w`, contracted by `eq`), or, when the params hold its features-major copy
  (`decode_params`), that copy times `x` by `eq_nk` (weight first)."""
  if module.has_variable("params", name + NK):
    y = dot_nk(eq_nk, module.get_variable("params", name + NK), x, dtype)
  else:
    y = compute_dot(eq, x, w, dtype)
  return low_rank_term(module, name, x, y, dtype)     # LoRA adapters, LoGRA's sketch path (models/lora.py)


class NormScale(nn.Module):
  """The `scale` parameter of an RMSNorm whose normalisation runs elsewhere (in the CPU attention kernel):
  the same name, shape and initial value as `RMSNorm`'s, so both paths share parameters."""
  param_dtype: Any

  @nn.compact
  def __call__(self, features: int) -> Array:
    return self.param("scale", nn.initializers.ones, (features,), self.param_dtype)


class RMSNorm(nn.Module):
  eps: float
  dtype: Any
  param_dtype: Any

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
    x32 = x.astype(jnp.float32)
    y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + self.eps)
    # HF order: cast the normalised value to the input dtype, then scale.
    return scale.astype(self.dtype) * y.astype(self.dtype)


def rope_tables(positions: Array, head_dim: int, theta: float, dtype) -> tuple[Array, Array]:
  """cos and sin of the rotary angles, each [B, T, hd] (rotate-half layout, as HF Qwen/Llama).

  Computed once per forward and shared by every layer. XLA:CPU would otherwise fuse the sin/cos into each
  layer's q and k consumers and evaluate them there, once per head (0.2 ms per layer per M decode step).
  The sampler computes them for all decode steps before its loop. Inside one forward pass they are computed
  in a loop over the frequencies, which writes each frequency's two columns into [B, T, hd] tables: a loop
  is a fusion boundary (an optimisation barrier is not; XLA removes it before fusing), and the tables it
  carries keep their row-major layout. Built as `[hd/2, B, T]` by `lax.map` and moved to the last axis, the
  tables stayed hd-major in memory and every rope fusion transposed them: the key gradient's rope fusions
  took 32.7 ms per M train step in the profile, 18.8 ms with this layout (the step 1.022x; the sampler
  unchanged within noise). The batch and sequence axes, so their sharding, are left untouched.
  """
  inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
  angles = positions.astype(jnp.float32)
  half = head_dim // 2

  def column(i, tables):
    a = angles * inv_freq[i]
    out = []
    for table, value in zip(tables, (jnp.cos(a), jnp.sin(a))):
      value = value[..., None].astype(dtype)
      table = jax.lax.dynamic_update_slice_in_dim(table, value, i, axis=-1)
      out.append(jax.lax.dynamic_update_slice_in_dim(table, value, i + half, axis=-1))
    return tuple(out)

  zeros = jnp.zeros(positions.shape + (head_dim,), dtype)
  return jax.lax.fori_loop(0, half, column, (zeros, zeros))


def rope(x: Array, cos: Array, sin: Array) -> Array:
  """Rotary embedding of x [B, T, ..., hd] with tables [B, T, hd] from `rope_tables`."""
  hd = x.shape[-1]
  shape = cos.shape[:2] + (1,) * (x.ndim - 3) + (hd,)
  x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
  rotated = jnp.concatenate([-x2, x1], axis=-1)
  return x * cos.reshape(shape) + rotated * sin.reshape(shape)


def init_weight(key, shape, dtype=jnp.float32):
  """N(0, 0.02^2), drawn flat and reshaped: same values, but XLA:CPU compiles a rank-4 normal ~10x slower."""
  return (0.02 * jax.random.normal(key, (math.prod(shape),), jnp.float32)).reshape(shape).astype(dtype)


@jax.custom_vjp
def swiglu(gu: Array) -> Array:
  """silu(gate) * up of the fused gate/up activations `[..., 2, F]` -> `[..., F]`.

  The backward pass writes the `[..., 2, F]` gradient in one pass. Differentiating the two slices instead
  pads each slice's gradient to `[..., 2, F]` and adds them: two extra full-size writes per layer.
  """
  return jax.nn.silu(gu[..., 0, :]) * gu[..., 1, :]


def _swiglu_fwd(gu):
  return swiglu(gu), gu


def _swiglu_bwd(gu, dh):
  # The sigmoid is recomputed here from the saved activations. Without the barrier XLA merges it with the
  # forward's sigmoid (common subexpressions), which then writes it out as a [T, F] array for the backward
  # to read: one more forward pass over memory (M train step 1.015x-1.016x with the barrier; same values).
  gu = jax.lax.optimization_barrier(gu)
  g, u = gu[..., 0, :].astype(jnp.float32), gu[..., 1, :].astype(jnp.float32)
  dh = dh.astype(jnp.float32)
  sig = jax.nn.sigmoid(g)
  dg = dh * u * sig * (1.0 + g * (1.0 - sig))      # d silu(g) / dg = sig(g) (1 + g (1 - sig(g)))
  du = dh * g * sig
  return (jnp.stack([dg, du], axis=-2).astype(gu.dtype),)


swiglu.defvjp(_swiglu_fwd, _swiglu_bwd)
