"""FP4 weight-only kernels of the sampler copy (`rl.sync.quantizer` = mxfp4 | nvfp4 | mxfp4_experts |
nvfp4_experts; rlkit/quant/quantizers.py; methods/systems.md §1).

A kernel W is stored block-scaled FP4 (rlkit/quant/fp4.py) with its contracted axes first and flattened:

  dense kernel  [*in, *out]      (the leading `in_axes` axes contracted)  ->  BlockFP4 over [K = prod(in), *out]
  MoE experts   [E, D, N]        (ragged_dot contracts D per expert)      ->  BlockFP4 over [D, E, N]

so every block of B values runs along the contraction, as FP4 GEMM kernels need. `FP4Weight` presents the
kernel's shape and a compute dtype like the int8 format (rlkit/models/matmul.py): `astype` is lazy; a `reshape`
that keeps the contracted axes apart from the output axes is lazy (the model's `reshape(D, -1)` of qkv);
anything else reads the dequantized array.

Its `matmul` flattens x's contracted axes to [M, K] and multiplies through `kernels/fp4_matmul.py` on a GPU
(Pallas, compiled) or `fp4_matmul_reference` elsewhere (`impl`: auto | pallas | reference), then restores
the output's axes. With `act` (the `*_w4a4` quantizers) the [M, K] activations are first rounded to FP4 in
that format, per token in blocks along K, round to nearest with each token's own scales (rlkit/quant/trace.py
`fake_quant`, the MoE experts' activation quantization): W4A4, as an FP4 engine that quantizes both operands.
`ragged_matmul` (the MoE experts' hook, `rlkit.models.matmul.expert_matmul`): at decode sizes (at most
`EXPERT_KERNEL_ROWS` token-expert rows) with the Pallas kernel, every row is multiplied by every expert's FP4
weights and each row keeps its own expert's product, so each expert's weights are read once, which is what bounds
a decode step; E times the FLOPs, which decode has to spare. Otherwise (prefill, or the reference `impl`) the
experts are dequantized and multiplied by `lax.ragged_dot`.
"""
from __future__ import annotations

import math

import flax.struct
import jax
import jax.numpy as jnp
from jax.sharding import PartitionSpec as P

from kernels.fp4_matmul import fp4_matmul, fp4_matmul_reference
from rlkit.models.matmul import QuantizedWeight
from rlkit.quant.fp4 import BLOCK, BlockFP4, dequantize_blocks, quantize_blocks
from rlkit.quant.trace import fake_quant

Array = jax.Array
EXPERT_KERNEL_ROWS = 256      # token-expert rows up to which the experts run through the Pallas kernel


@flax.struct.dataclass
class FP4Weight(QuantizedWeight):
  """A kernel as block-scaled FP4 over [K, *rest] (module docstring). `layout`: 'dense' (the presented shape
  is [*in, *out] with `in_axes` leading contracted axes) or 'experts' ([E, D, N], stored [D, E, N])."""
  fp4: BlockFP4
  presented: tuple = flax.struct.field(pytree_node=False)
  in_axes: int = flax.struct.field(pytree_node=False, default=1)
  layout: str = flax.struct.field(pytree_node=False, default="dense")
  compute: str = flax.struct.field(pytree_node=False, default="float32")
  impl: str = flax.struct.field(pytree_node=False, default="auto")
  act: str = flax.struct.field(pytree_node=False, default="")     # "" (weight-only) or the activations' format

  @property
  def shape(self) -> tuple:
    return tuple(self.presented)

  @property
  def dtype(self):
    return jnp.dtype(self.compute)

  def astype(self, dtype) -> "FP4Weight":
    return self.replace(compute=jnp.dtype(dtype).name)

  def _k(self) -> int:
    return self.shape[1] if self.layout == "experts" else math.prod(self.shape[:self.in_axes])

  def dequantize(self) -> Array:
    stored = dequantize_blocks(self.fp4, self._k())
    if self.layout == "experts":
      return jnp.swapaxes(stored, 0, 1).astype(self.dtype)
    return stored.reshape(self.shape).astype(self.dtype)

  def transpose(self, *axes):
    return self.dequantize().transpose(*axes)

  def reshape(self, *shape):
    shape = tuple(shape[0]) if len(shape) == 1 and isinstance(shape[0], (tuple, list)) else tuple(shape)
    if -1 in shape:
      known = math.prod(d for d in shape if d != -1)
      shape = tuple(math.prod(self.shape) // known if d == -1 else d for d in shape)
    if self.layout == "dense":
      k = self._k()
      for split in range(len(shape) + 1):        # the new contracted axes: a prefix with product K
        if math.prod(shape[:split]) == k and math.prod(shape[split:]) == math.prod(self.shape[self.in_axes:]):
          if split and split < len(shape):
            return self.replace(presented=shape, in_axes=split)
    return self.dequantize().reshape(shape)

  def ragged_matmul(self, x: Array, group_sizes: Array) -> Array:
    impl = _resolved(self.impl)
    if self.layout != "experts" or impl == "reference" or x.shape[0] > EXPERT_KERNEL_ROWS:
      return super().ragged_matmul(x, group_sizes)
    one = lambda e: _fp4_matmul(x, BlockFP4(self.fp4.codes[:, e], self.fp4.scales[:, e],        # noqa: E731
                                            self.fp4.tensor_scale), impl)
    every = jax.lax.map(one, jnp.arange(self.shape[0]))                                   # [E, rows, N]
    expert_of_row = jnp.repeat(jnp.arange(self.shape[0]), group_sizes, total_repeat_length=x.shape[0])
    return jnp.take_along_axis(every, expert_of_row[None, :, None], axis=0)[0]

  def part_specs(self, spec) -> list:
    """codes and scales laid out as the stored [K, *rest] (dense: K keeps the kernel's single input axis'
    split, merged input axes are replicated; experts: [D, E, N] from [E, D, N]); the tensor scale replicated."""
    spec = tuple(spec) + (None,) * (len(self.shape) - len(tuple(spec)))
    if self.layout == "experts":
      stored = (spec[1], spec[0], spec[2])
    else:
      stored = (spec[0] if self.in_axes == 1 else None,) + spec[self.in_axes:]
    return [P(*stored), P(*stored), P()]          # jax.tree.leaves order: codes, scales, tensor_scale

  def matmul(self, eq: str, x: Array) -> Array:
    (xs, ws), ys = eq.split("->")[0].split(","), eq.split("->")[1]
    contracted, tok = "".join(c for c in ws if c not in ys), "".join(c for c in xs if c in ys)
    fallback = self.layout != "dense" or ws[:self.in_axes] != contracted   # no [M, K] x [K, N] kernel view
    if fallback and not self.act:
      return super().matmul(eq, x)
    x2 = jnp.einsum(f"{xs}->{tok}{contracted}", x)     # tokens first, the contracted axes in the kernel's order
    if self.act:
      x2 = _rounded_activations(x2, len(tok), self.act)
    if fallback:
      return super().matmul(f"{tok}{contracted},{ws}->{ys}", x2)
    lead = x2.shape[:len(tok)]
    flat = BlockFP4(*(a.reshape(a.shape[0], -1) for a in self.fp4[:2]), self.fp4.tensor_scale)   # [., N]
    y = _fp4_matmul(x2.reshape((-1, self._k())), flat, self.impl).reshape(lead + self.shape[self.in_axes:])
    return jnp.einsum(f"{tok}{ws[self.in_axes:]}->{ys}", y)


def _rounded_activations(x2: Array, tokens: int, fmt: str) -> Array:
  """x2 [*tokens, *contracted] with each token's contracted features (flattened, K of them) rounded to FP4 `fmt`
  in blocks along K; K padded with zeros to whole blocks (as `quantize_blocks` pads the kernel), which leaves
  every block's amax, hence its scale, as it is."""
  flat = x2.reshape((math.prod(x2.shape[:tokens]), -1))
  k = flat.shape[1]
  rounded = fake_quant(jnp.pad(flat, ((0, 0), (0, -k % BLOCK[fmt]))), fmt)[0][:, :k]
  return rounded.reshape(x2.shape)


def _resolved(impl: str) -> str:
  if impl == "auto":
    return "pallas" if jax.default_backend() == "gpu" else "reference"
  return impl


def _fp4_matmul(x2: Array, w: BlockFP4, impl: str) -> Array:
  impl = _resolved(impl)
  if impl == "pallas":
    return fp4_matmul(x2, w)
  if impl == "pallas_interpret":
    return fp4_matmul(x2, w, interpret=True)
  return fp4_matmul_reference(x2, w)


def quantize_fp4_kernel(w: Array, in_axes: int, dtype: str, fmt: str, act: bool = False) -> FP4Weight:
  """A dense matmul kernel W (leading `in_axes` axes contracted) as FP4Weight in `fmt`, presenting `dtype`;
  `act`: its activations rounded to `fmt` too (W4A4)."""
  k = math.prod(w.shape[:in_axes])
  fp4 = quantize_blocks(w.astype(jnp.float32).reshape((k,) + w.shape[in_axes:]), fmt)
  return FP4Weight(fp4, tuple(w.shape), in_axes, "dense", jnp.dtype(dtype or w.dtype).name, act=fmt if act else "")


def quantize_fp4_experts(w: Array, dtype: str, fmt: str) -> FP4Weight:
  """Stacked expert kernels W [E, D, N] (D contracted per expert) as FP4Weight, blocks along D."""
  fp4 = quantize_blocks(jnp.swapaxes(w.astype(jnp.float32), 0, 1), fmt)
  return FP4Weight(fp4, tuple(w.shape), 1, "experts", jnp.dtype(dtype or w.dtype).name)
