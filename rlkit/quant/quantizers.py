"""QUANTIZERS: the format of the sampler copy's matmul kernels, applied when the trainer exports its weights to
the sampler (`rl.sync.quantizer`; the export of rlkit/sync/backends.py; FP4 rollout, methods/systems.md §1).

  e = export(master):  a matmul kernel W  ->  quantizer.kernel(W, in_axes, sync.dtype)
                       another floating leaf  ->  W cast to sync.dtype (RNE, `astype`; '' keeps its dtype)
                       any other leaf  ->  as is

Entries (ours):
  none  no quantizer: the kernels are cast to sync.dtype like every other floating leaf. The default, and
        the export of before this registry; with sync.dtype = '' the float32 master as is.
  bf16  the kernels cast to bfloat16 (RNE), whatever sync.dtype: with the default sync.dtype = 'bfloat16'
        bit for bit the export of `none`; with sync.dtype = 'float32', bf16 weights beside f32 norms.
  int8  weight-only int8, symmetric, one float32 scale per output channel (rlkit/quant/int8.py); the
        sampler's weight matmul multiplies the codes and scales the result (the hook in
        rlkit/models/matmul.py). The sampler still computes in sync.dtype (W8A16 with the default).
  fp8   weight-only float8_e4m3fn codes, one float32 scale per output channel (rlkit/quant/fp8.py), in the
        int8 format's container and matmul: an fp8-rounded copy that computes in sync.dtype.
  mxfp4, nvfp4   weight-only block-scaled FP4 (rlkit/quant/fp4.py; blocks along the contraction) for the MoE
        experts and the dense matmul kernels (rlkit/quant/fp4_weight.py: Pallas kernel on GPU).
  mxfp4_experts, nvfp4_experts   FP4 for the MoE experts only (TRACE's quantization points); the dense
        kernels, the routers and everything else cast to sync.dtype.
  mxfp4_w4a4, nvfp4_w4a4   as mxfp4 / nvfp4, and every dense kernel's activations rounded to the same format
        in the sampler (per token, blocks along the contraction; `FP4Weight.act`): W4A4 dense matmuls. The
        experts stay weight-only here (their activations: model.expert_quant).

Matmul kernels (`kernel_inputs`): the projections of `rlkit.models.lora.VIEWS` (attn qkv, o; mlp gate_up,
down; their leading axes are the inputs) and an untied `lm_head` [D, V]. Not quantized: norms, biases, the
embedding (a gather, and a tied LM head), LoRA adapters (unmerged sampling), the MoE routers. The stacked MoE
experts (`moe/gate_up`, `moe/down`, [E, D, N]) are quantized only by quantizers with an `experts` function (the
FP4 ones); their grouped matmul goes through `rlkit.models.matmul.expert_matmul`.

A quantized kernel is a `QuantizedWeight` pytree, so the export has more leaves than the master (int8,
float8_e4m3fn or packed FP4 codes, float32 or E8M0/E4M3 scales); every sync backend sends them like any other
leaf (sparse_delta: the bits that changed, a code flip or a scale's last bits; tests/quant/test_quantizers.py
syncs int8 and fp8 sparsely, an RL run syncs FP4 experts densely: tests/optim/test_frozen.py).
`export_shardings` lays them out: each part of a kernel takes the spec its `part_specs` derives from the
kernel's, with the dims it cannot split replicated.

A new format: a QuantizedWeight subclass with its `matmul` (and `ragged_matmul` for experts), and
`QUANTIZERS.add(name, Quantizer(...))`.
"""
from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Optional

import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding

from rlkit.core.registry import Registry
from rlkit.models.lora import VIEWS
from rlkit.models.matmul import QuantizedWeight
from rlkit.parallel.rules import fit_spec, path_str
from rlkit.quant.fp4_weight import quantize_fp4_experts, quantize_fp4_kernel
from rlkit.quant.fp8 import quantize_fp8
from rlkit.quant.int8 import quantize_int8

Array = jax.Array


class Quantizer(NamedTuple):
  """kernel(W, in_axes, dtype) -> the sampler's leaf for matmul kernel W (its leading `in_axes` axes are the
  inputs; `dtype`: sync.dtype, the dtype the leaf should present, '' for W's own). None: no quantizer (or, with
  `experts`, none for the dense kernels). experts(W [E, D, N], dtype) -> the leaf for stacked MoE experts;
  None: experts are cast like other leaves."""
  kernel: Optional[Callable[[Array, int, str], Any]]
  experts: Optional[Callable[[Array, str], Any]] = None


QUANTIZERS: Registry[Quantizer] = Registry("quantizer")
QUANTIZERS.add("none", Quantizer(None))
QUANTIZERS.add("bf16", Quantizer(lambda w, in_axes, dtype: w.astype(jnp.bfloat16)))
QUANTIZERS.add("int8", Quantizer(quantize_int8))
QUANTIZERS.add("fp8", Quantizer(quantize_fp8))
for _fmt in ("mxfp4", "nvfp4"):
  _experts = functools.partial(quantize_fp4_experts, fmt=_fmt)
  QUANTIZERS.add(_fmt, Quantizer(functools.partial(quantize_fp4_kernel, fmt=_fmt), _experts))
  QUANTIZERS.add(f"{_fmt}_experts", Quantizer(None, _experts))
  QUANTIZERS.add(f"{_fmt}_w4a4", Quantizer(functools.partial(quantize_fp4_kernel, fmt=_fmt, act=True), _experts))
EXPERT_KERNELS = (("moe", "gate_up"), ("moe", "down"))


def kernel_inputs(path) -> int:
  """How many leading axes of the leaf at `path` (a pytree key path) a matmul contracts: 0 when it is not a
  matmul kernel the quantizers convert (module docstring)."""
  keys = path_str(path).split("/")
  if keys[-1] == "lm_head":
    return 1
  return VIEWS.get(tuple(keys[-2:]), 0)


def cast(x: Array, dtype: str) -> Array:
  """A floating leaf cast to `dtype` (RNE, as `astype`); other leaves, and any leaf for dtype '', as they are."""
  return x.astype(jnp.dtype(dtype)) if dtype and jnp.issubdtype(x.dtype, jnp.floating) else x


def layer_index(path) -> Optional[int]:
  """The decoder layer a leaf at `path` belongs to (its `layers_<i>` key), None outside the layers."""
  for key in path_str(path).split("/"):
    if key.startswith("layers_") and key[7:].isdigit():
      return int(key[7:])
  return None


def export(params: Any, quantizer: str, dtype: str, layers: tuple = ()) -> Any:
  """The sampler's representation of `params` (module docstring); pure, so jit it (rlkit.sync.export_params).
  `layers`: the decoder layers whose kernels the quantizer converts (`sync.quant_layers`; () every layer); the
  other layers' kernels are cast like any floating leaf. Leaves outside the layers (an untied lm_head) follow
  the quantizer either way."""
  kernel, experts = QUANTIZERS.get(quantizer)

  def one(path, x):
    if layers and layer_index(path) is not None and layer_index(path) not in layers:
      return cast(x, dtype)
    if experts is not None and tuple(path_str(path).split("/")[-2:]) in EXPERT_KERNELS and x.ndim == 3:
      return experts(x, dtype)
    in_axes = kernel_inputs(path) if kernel is not None else 0
    if in_axes and x.ndim > in_axes and jnp.issubdtype(x.dtype, jnp.floating):
      return kernel(x, in_axes, dtype)
    return cast(x, dtype)

  return jax.tree_util.tree_map_with_path(one, params)


def export_shardings(kernel_shardings: Any, exported: Any) -> Any:
  """Shardings for the export `exported` (arrays or `jax.eval_shape`s) from those of the tree it was made
  from (`kernel_shardings`: the master's own, or the sampler mesh's rules applied to the master's shapes):
  a leaf keeps its sharding; each part of a QuantizedWeight takes the spec its `part_specs` derives from the
  kernel's (int8/fp8: the kernel's own; FP4: its stored layout's), with the dims it cannot split (a scale's
  size-1 contracted axes, odd packed lengths) replicated (`rlkit.parallel.rules.fit_spec`)."""
  def one(path, sharding, leaf):
    if not isinstance(leaf, QuantizedWeight):
      return sharding
    if not isinstance(sharding, NamedSharding):
      return jax.tree.map(lambda _: sharding, leaf)
    name = path_str(path)
    parts, treedef = jax.tree.flatten(leaf)
    return jax.tree.unflatten(treedef, [NamedSharding(sharding.mesh, fit_spec(spec, tuple(part.shape),
                                                                              sharding.mesh, name))
                                        for part, spec in zip(parts, leaf.part_specs(sharding.spec))])
  return jax.tree_util.tree_map_with_path(one, kernel_shardings, exported)
