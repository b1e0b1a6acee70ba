"""Partition rules: how each parameter and each batch is laid out on the ("data", "fsdp", "tensor") mesh.

A rule set is an ordered list of `(regex, PartitionSpec)`; a parameter's path is its pytree keys joined by
'/' (e.g. `layers_3/attn/qkv`, or `1/0/mu/layers_3/attn/qkv` inside an optax state), and the first rule whose
regex `re.search`-es the path gives its spec. Default rules for `rlkit.models.transformer` (`DEFAULT_RULES`):

  param                 shape             spec                              why
  embedding             [V, D]            P(("tensor", "fsdp"), None)       vocab split over both axes: the
                                                                            lookup is a local masked gather +
                                                                            one all-reduce (with D on "fsdp"
                                                                            XLA replicated the table instead)
  lm_head               [D, V]            P("fsdp", "tensor")               D gathered (FSDP), logits stay
                                                                            split over the vocab
  attn/qkv              [D, KV, G+2, hd]  P("fsdp", "tensor", None, None)   KV heads split: a head never
                                                                            straddles devices; its G queries,
                                                                            k and v stay together
  attn/qkv_bias         [KV, G+2, hd]     P("tensor", None, None)           follows qkv's head axis
  attn/o                [KV, G, hd, D]    P("tensor", None, None, "fsdp")   row split over heads
  mlp/gate_up           [D, 2, F]         P("fsdp", None, "tensor")         Megatron column split of F
  mlp/down              [F, D]            P("tensor", "fsdp")               Megatron row split of F
  moe/gate_up           [E, D, 2F]        P("tensor", "fsdp", None)         experts split (expert parallel)
  moe/down              [E, F, D]         P("tensor", None, "fsdp")         experts split (expert parallel)
  moe/router            [D, E]            P()                               small; every token needs all of it
  .../scale (RMSNorms)  [D] or [hd]       P()                               small
  .../<w>_lora_a, _b    [in, r], [r, out] P()                               LoRA adapters (models/lora.py): small

Experts go on "tensor" rather than splitting each expert's F because `moe/gate_up` concatenates gate and up
along its last axis ([:F] gate, [F:] up), so an F split would put gate and up on different devices and force
a reshuffle before the SwiGLU product. Under GSPMD (Auto axes) XLA partitions the grouped matmul
(`ragged_dot`) over expert-sharded weights itself (tested equal to single-device on a (2, 2, 2) mesh; the
communication is XLA's choice); a hand-written all-to-all dispatch with `shard_map` would keep this layout.

Three conventions keep the rules short and safe:
  * 0-d leaves (optimizer step counts, scalars) are always replicated and need no rule;
  * a dimension whose size is not divisible by the number of devices its mesh axes span is replicated
    instead (logged at debug level), so e.g. a vocab of 151,936 on 7 devices still works, just unsplit;
    mesh axes that the mesh lacks are treated the same way;
  * a parameter matching no rule is an error naming its path; append `REPLICATE_REST` to a rule set to
    replicate everything unmatched instead (the defaults do not, so a new large weight is not silently
    replicated).

`sharded_init` builds parameters directly in their sharded layout (a jitted init with `out_shardings`), so
the full tree never exists on one device.

Batches: the leading (batch) dimension is split over ("data", "fsdp"), everything else is replicated
(`data_sharding`, `shard_batch`). Inside the model, `constrain_batch` keeps the residual stream split the
same way; it reads the mesh from the context, so trace sharded calls under `with jax.set_mesh(mesh):`
(without it results are the same, but GSPMD may split activations on D instead: see `constrain_batch`).
"""
from __future__ import annotations

import logging
import math
import re
from typing import Any, Callable, Optional, Sequence

import jax
import numpy as np
from jax.sharding import AxisType, Mesh, NamedSharding, PartitionSpec as P

from rlkit.parallel.mesh import BATCH_AXES, mesh_axis_size

Rules = Sequence[tuple[str, P]]

_L = r"(^|/)"   # the rule matches a whole trailing path component, under any prefix

DEFAULT_RULES: tuple[tuple[str, P], ...] = (
    (_L + r"embedding$", P(("tensor", "fsdp"), None)),
    (_L + r"lm_head$", P("fsdp", "tensor")),
    (_L + r"attn/qkv$", P("fsdp", "tensor", None, None)),
    (_L + r"attn/qkv_bias$", P("tensor", None, None)),
    (_L + r"attn/o$", P("tensor", None, None, "fsdp")),
    (_L + r"mlp/gate_up$", P("fsdp", None, "tensor")),
    (_L + r"mlp/down$", P("tensor", "fsdp")),
    (_L + r"moe/gate_up$", P("tensor", "fsdp", None)),
    (_L + r"moe/down$", P("tensor", None, "fsdp")),
    (_L + r"moe/router$", P()),
    (_L + r"scale$", P()),
    (_L + r"\w+_lora_[ab]$", P()),           # LoRA adapters (rlkit/models/lora.py): rank-r, small
)

REPLICATE_REST: tuple[str, P] = (r".*", P())


def _key_str(k: Any) -> str:
  for attr in ("key", "name", "idx"):   # DictKey, GetAttrKey, SequenceKey / FlattenedIndexKey
    if hasattr(k, attr):
      return str(getattr(k, attr))
  return str(k)


def path_str(path: Sequence[Any]) -> str:
  """'/'-joined pytree path, e.g. `layers_0/attn/qkv`."""
  return "/".join(_key_str(k) for k in path)


def fit_spec(spec: P, shape: tuple[int, ...], mesh: Optional[Mesh], name: str) -> P:
  """Check `spec` against the leaf's rank; on a mesh, replicate dims the mesh cannot split evenly."""
  if len(spec) > len(shape):
    raise ValueError(f"Partition rule for {name!r} gives spec {spec} with {len(spec)} entries, but the "
                     f"parameter has shape {shape}; fix the rule for this path.")
  if mesh is None:
    return spec
  out = []
  for dim, axes in zip(shape, spec):
    names = (axes,) if isinstance(axes, str) else tuple(axes or ())
    missing = [a for a in names if a not in mesh.shape]
    n = mesh_axis_size(mesh, [a for a in names if a in mesh.shape])
    if missing or dim % n:
      logging.debug("Replicating dim of size %d of %r (spec entry %r): %s.", dim, name, axes,
                    f"mesh has no axis {missing}" if missing else f"not divisible by {n} devices")
      axes = None
    out.append(axes)
  return P(*out)


def partition_specs(params: Any, rules: Optional[Rules] = None, mesh: Optional[Mesh] = None) -> Any:
  """A pytree of PartitionSpecs, one per leaf of `params` (arrays or ShapeDtypeStructs).

  Args:
    params: the pytree to lay out (parameters, an optax state, or `jax.eval_shape` of either).
    rules: ordered `(regex, PartitionSpec)` pairs; first match wins (default `DEFAULT_RULES`).
    mesh: if given, dims that its axes cannot split evenly are replicated (see the module docstring).
  """
  rules = DEFAULT_RULES if rules is None else rules
  compiled = [(re.compile(pattern), spec) for pattern, spec in rules]

  def spec_for(path, leaf):
    name, shape = path_str(path), tuple(np.shape(leaf))
    if not shape:
      return P()
    for pattern, spec in compiled:
      if pattern.search(name):
        return fit_spec(spec, shape, mesh, name)
    raise ValueError(f"No partition rule matches parameter {name!r} (shape {shape}). Add a rule for it, "
                     f"or append rlkit.parallel.REPLICATE_REST to replicate unmatched parameters.")

  return jax.tree_util.tree_map_with_path(spec_for, params)


def param_shardings(params: Any, mesh: Mesh, rules: Optional[Rules] = None) -> Any:
  """A pytree of NamedShardings for `params` on `mesh` (what `jit(out_shardings=...)` wants)."""
  specs = partition_specs(params, rules, mesh)
  return jax.tree.map(lambda s: NamedSharding(mesh, s), specs, is_leaf=lambda x: isinstance(x, P))


def shard_params(params: Any, mesh: Mesh, rules: Optional[Rules] = None) -> Any:
  """Place existing parameters on `mesh` according to `rules` (`jax.device_put` with NamedShardings)."""
  return jax.device_put(params, param_shardings(params, mesh, rules))


def sharded_init(init_fn: Callable[[jax.Array], Any], key: jax.Array, mesh: Mesh,
                 rules: Optional[Rules] = None) -> Any:
  """`init_fn(key)` computed directly in the sharded layout: each device only ever holds its shards.

  Shapes come from `jax.eval_shape` (nothing is computed); the init is then jitted with `out_shardings`, so
  XLA materialises each parameter already split. With JAX's default partitionable threefry, the values equal
  an unsharded `init_fn(key)`.
  """
  shapes = jax.eval_shape(init_fn, key)
  return jax.jit(init_fn, out_shardings=param_shardings(shapes, mesh, rules))(key)


# ---------------------------------------------------------------------------------------------------------
# Batch (activation) sharding

def data_sharding(mesh: Mesh, ndim: int = 2) -> NamedSharding:
  """Sharding of an `ndim`-d batch array (default `[B, T]` tokens): B over ("data", "fsdp"), the rest
  replicated."""
  if ndim == 0:
    return NamedSharding(mesh, P())
  return NamedSharding(mesh, P(BATCH_AXES, *([None] * (ndim - 1))))


def constrain_batch(x: jax.Array) -> jax.Array:
  """Inside a traced function: pin x's leading (batch) dim to ("data", "fsdp") of the `jax.set_mesh` mesh.

  Why: GSPMD propagates shardings from inputs *and* weights, and FSDP weights are split on their model dim
  D; when the D split wins, every device processes every row (measured: with the embedding split on D, a
  (1, 8, 1) mesh gave replicated logits at ~8x the per-device flops). With the constraint each device keeps
  its own rows and the weights are all-gathered per layer, which is FSDP. A no-op when no mesh is set, for
  axes that are not Auto (e.g. Manual inside `shard_map`), and when the batch does not divide evenly (e.g.
  generating for one prompt on many devices).
  """
  mesh = jax.sharding.get_abstract_mesh()
  auto = {n for n, t in zip(mesh.axis_names, mesh.axis_types) if t == AxisType.Auto}
  axes = tuple(a for a in BATCH_AXES if a in auto)
  if not axes or x.ndim == 0 or x.shape[0] % math.prod(mesh.shape[a] for a in axes):
    return x
  return jax.lax.with_sharding_constraint(x, P(axes))


def shard_batch(batch: Any, mesh: Mesh) -> Any:
  """Split every array in `batch` along its leading dim over ("data", "fsdp"); 0-d leaves are replicated.

  Single process: `batch` is the global batch. Multi-process: `batch` is this process's slice of the global
  batch (as a per-host data loader yields it) and the result is the global array.
  """
  n = mesh_axis_size(mesh, BATCH_AXES)

  def put(path, x):
    x = x if isinstance(x, jax.Array) else np.asarray(x)
    sharding = data_sharding(mesh, x.ndim)
    global_rows = x.shape[0] * jax.process_count() if x.ndim else 0
    if global_rows % n:
      raise ValueError(f"Batch leaf {path_str(path)!r} has global batch size {global_rows}, not divisible by "
                       f"data*fsdp = {n} devices; use a batch size that is a multiple of {n}.")
    if jax.process_count() == 1:
      return jax.device_put(x, sharding)
    return jax.make_array_from_process_local_data(sharding, np.asarray(x))

  return jax.tree_util.tree_map_with_path(put, batch)
