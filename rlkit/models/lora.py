"""LoRA adapters on the decoder's projections, and the low-rank term of a projection that LoRA and LoGRA share.

The hook (ours). A projection `name` of a module (`attn`: qkv, o; `mlp`: gate_up, down) is a matmul of the
tokens' features x [.., in] by its kernel seen as a 2-D matrix W [in, out] (`VIEWS`: the kernel's leading
`axes` are the inputs, the rest the outputs, row-major: qkv [D, KV·(G+2)·hd], o [KV·G·hd, D], gate_up
[D, 2·F], down [F, D]). When the module's params also hold `<name>_lora_a` A [in, r] and `<name>_lora_b`
B [r, out] (and optionally a scalar `<name>_lora_scale` s, default 1), the transformer adds

  y = x·W + s·(x·A)·B        (`low_rank_term`, called from `layers.project`)

- LoRA (Hu et al. 2021): A, B trained, s = alpha / r, B = 0 at the start (so the model starts as the base
  model); the base weights are frozen: `trainable_mask` selects the adapters (and every leaf outside a
  decoder's params, e.g. a value head), and the update step differentiates those only, so the base gets
  neither optimizer state nor a gradient buffer. `merge` folds W + s·A·B back into the kernels (export to
  Hugging Face, merged sampling); both paths give the same logits up to float rounding.
- LoGRA (rlkit/optim/logra_training.py): under its own names (`<name>_sketch_a`, `<name>_sketch_p`), A = 0 is
  the sketch, B = Pᵀ the step's projection: the gradient w.r.t. A is the sketch G·P of the kernel's gradient,
  whose dense [in, out] buffer is never formed; as A is zero the forward adds nothing (a custom VJP).

Why not qwix (Tunix's LoRA, checked at 0.1.8): it intercepts `jnp.einsum`/`dot_general` inside Linen methods
and matches rules by module path. rlkit's weight matmuls run inside a `jax.custom_vjp` (`models/matmul.py`,
hand-written backward), which cannot close over adapter params that need gradients; the decode layout
multiplies weight-first (`fd,btd->btf`), which qwix would read as the activation being the weight; and the
attention einsums in the same modules would need op-level exclusions. The term above is 40 lines, sits
where weights meet activations (one line in `layers.project`), and serves LoGRA as well.
"""
from __future__ import annotations

import functools
import math
from typing import Any, Mapping

import jax
import jax.numpy as jnp
import ml_collections

A, B, SCALE = "_lora_a", "_lora_b", "_lora_scale"
SUFFIXES = (A, B, SCALE)
SKETCH_A, SKETCH_P = "_sketch_a", "_sketch_p"     # LoGRA's zero sketch A and B = Pᵀ (rlkit/optim/logra_training.py)
# (module, kernel) -> how many leading axes of the kernel are its inputs (the 2-D view [in, out]).
VIEWS = {("attn", "qkv"): 1, ("attn", "o"): 3, ("mlp", "gate_up"): 1, ("mlp", "down"): 1}
TARGETS = tuple(name for _, name in VIEWS)


def lora_defaults() -> ml_collections.ConfigDict:
  """The `lora` section of a model (`model.lora`, `models.<role>.lora`); every field is documented here, once."""
  c = ml_collections.ConfigDict()
  c.rank = 0                    # LoRA adapters of this rank on `targets`, base weights frozen (0: off, full training)
  c.alpha = 16.0                # adapter scale alpha / rank
  c.targets = TARGETS           # decoder projections that get adapters: qkv | o | gate_up | down
  c.merged_sampling = True      # the sampler (rollouts, evaluation) runs W + scale·A·B merged; False: x·W + s·(x·A)·B
  return c


def check(section, where: str) -> None:
  """ValueError naming the key and the fix for a bad `lora` section (types are checked by
  config_checks.validate)."""
  if section.rank < 0:
    raise ValueError(f"{where}.rank={section.rank} must be >= 0 (0 turns LoRA off).")
  if section.alpha <= 0:
    raise ValueError(f"{where}.alpha={section.alpha} must be > 0 (the adapters are scaled by alpha / rank).")
  bad = [t for t in section.targets if t not in TARGETS]
  if bad or (section.rank and not section.targets):
    raise ValueError(f"{where}.targets={tuple(section.targets)!r}: name one or more of {', '.join(TARGETS)}.")


def view_shape(module: str, name: str, shape: tuple) -> tuple[int, int]:
  """[in, out] of a projection kernel's 2-D view (see `VIEWS`)."""
  axes = VIEWS[(module, name)]
  return math.prod(shape[:axes]), math.prod(shape[axes:])


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _zero_sketch_term(y, x, a, p, dtype):
  """y + (x·A)·B for a sketch A known to be zero (LoGRA; `p` is B = Pᵀ [r, out]): the value is y, so the
  forward computes nothing (the autodiff of the general term keeps an output-sized float32 buffer per
  projection); the backward gives A its gradient xᵀ·(dy·Bᵀ), the sketch, and y its cotangent unchanged. x and
  B get zero cotangents: B is not trained, and x's would be (dy·Bᵀ)·Aᵀ = 0."""
  del x, a, p, dtype
  return y


def _zero_sketch_fwd(y, x, a, p, dtype):
  return y, (x, a, p)


def _zero_sketch_bwd(dtype, res, dy):
  x, a, p = res
  lead = x.shape[:-1]
  g = jnp.einsum("...o,ro->...r", dy.reshape(lead + (p.shape[1],)).astype(dtype), p.astype(dtype),
                 preferred_element_type=jnp.float32)
  da = jnp.einsum("...i,...r->ir", x.astype(dtype), g.astype(dtype), preferred_element_type=jnp.float32)
  return dy, jnp.zeros_like(x), da.astype(a.dtype), jnp.zeros_like(p)


_zero_sketch_term.defvjp(_zero_sketch_fwd, _zero_sketch_bwd)


def low_rank_term(module, name: str, x: jax.Array, y: jax.Array, dtype) -> jax.Array:
  """`y` plus s·(x·A)·B when the module's params carry the adapters of `name` (else `y` unchanged).
  x [..., in] are the projection's inputs, y its output (any shape with out = prod of its feature axes).
  LoGRA's zero sketch (`<name>_sketch_a` A = 0, `<name>_sketch_p` P) adds nothing and only makes the backward
  pass compute ∂L/∂A (`_zero_sketch_term`)."""
  if module.has_variable("params", name + SKETCH_A):
    return _zero_sketch_term(y, x, module.get_variable("params", name + SKETCH_A),
                             module.get_variable("params", name + SKETCH_P), dtype)
  if not module.has_variable("params", name + A):
    return y
  a, b = module.get_variable("params", name + A), module.get_variable("params", name + B)
  lead = x.shape[:-1]
  h = jnp.einsum("...i,ir->...r", x.astype(dtype), a.astype(dtype), preferred_element_type=jnp.float32)
  term = jnp.einsum("...r,ro->...o", h.astype(dtype), b.astype(dtype), preferred_element_type=jnp.float32)
  if module.has_variable("params", name + SCALE):
    term = term * module.get_variable("params", name + SCALE).astype(jnp.float32)
  return (y.astype(jnp.float32) + term.reshape(lead + y.shape[len(lead):])).astype(y.dtype)


# ---------------------------------------------------------------------------------------------- the pytree

def _projections(params: Any, targets=TARGETS):
  """(parent dict, module name, kernel name) of every target projection in a (nested) params dict."""
  out = []

  def walk(tree):
    for key, value in tree.items():
      if isinstance(value, dict):
        for (module, name) in VIEWS:
          if key == module and name in targets and name in value and hasattr(value[name], "shape"):
            out.append((value, module, name))
        walk(value)
  walk(params)
  return out


def has_adapters(params: Any) -> bool:
  """Whether a (nested) params dict holds any adapter."""
  return isinstance(params, Mapping) and any(str(k).endswith(A) or has_adapters(v) for k, v in params.items())


def add_adapters(params: Any, section, key: jax.Array) -> Any:
  """`params` with rank-`section.rank` adapters on `section.targets` (a new tree; `section.rank == 0`: as is).
  A ~ N(0, 1/in) per entry (the inputs' scale is kept), B = 0, scale = alpha / rank, all float32."""
  if not section.rank:
    return params
  r = section.rank

  def copy(tree):
    return {k: copy(v) if isinstance(v, dict) else v for k, v in tree.items()}
  params = copy(params)
  for i, (parent, module, name) in enumerate(_projections(params, tuple(section.targets))):
    n_in, n_out = view_shape(module, name, parent[name].shape)
    parent[name + A] = jax.random.normal(jax.random.fold_in(key, i), (n_in, r), jnp.float32) / math.sqrt(n_in)
    parent[name + B] = jnp.zeros((r, n_out), jnp.float32)
    parent[name + SCALE] = jnp.asarray(section.alpha / r, jnp.float32)
  return params


@jax.jit
def merge(params: Any) -> Any:
  """The base params with every adapter folded in, W ← W + s·A·B (in the kernel's dtype), adapters removed."""
  def walk(tree, module=""):
    out = {}
    for key, value in tree.items():
      if isinstance(value, dict):
        out[key] = walk(value, key)
      elif not key.endswith(SUFFIXES):
        if key + A in tree:
          n_in, _ = view_shape(module, key, value.shape)
          scale = tree.get(key + SCALE, jnp.float32(1.0))
          delta = (tree[key + A].astype(jnp.float32) @ tree[key + B].astype(jnp.float32)) * scale
          value = (value.reshape(n_in, -1).astype(jnp.float32) + delta).reshape(value.shape).astype(value.dtype)
        out[key] = value
    return out
  return walk(params)


def sampling_params(params: Any, section) -> Any:
  """What the sampler runs: the merged params with `section.merged_sampling` (and adapters), else `params`."""
  return merge(params) if section.merged_sampling and has_adapters(params) else params


def trainable_mask(params: Any) -> Any:
  """Bools like `params`: with adapters, True at the adapters' A and B and at every leaf outside a decoder
  that carries adapters (a value head); the base weights and the fixed scales are False. Without: all True."""
  if not has_adapters(params):
    return jax.tree.map(lambda _: True, params)

  def walk(tree, frozen):
    frozen = frozen or ("embedding" in tree and has_adapters(tree))     # a decoder's params
    return {k: walk(v, frozen) if isinstance(v, dict) else (k.endswith((A, B)) or not frozen)
            for k, v in tree.items()}
  return walk(params, False)


def check_run(config) -> None:
  """ValueError naming the key and the fix for the `lora` sections of a run config (the policy's `model.lora`
  and every `models.<role>.lora`): ranges, a frozen role with adapters, and LoRA together with LoGRA."""
  sections = {"model.lora": (config.model.lora, True)}
  sections.update({f"models.{role}.lora": (config.models[role].lora, config.models[role].trainable)
                   for role in config.models.keys()})
  optimizers = [f"{name}.optimizer" for name in config.stages if "optimizer" in config[name]]
  optimizers += [f"{name}.critic.optimizer" for name in config.stages if "critic" in config[name]]
  def section_at(key):
    out = config
    for part in key.split("."):
      out = out[part]
    return out
  logra = [key for key in optimizers if section_at(key).name == "logra"]
  for where, (section, trainable) in sections.items():
    check(section, where)
    if section.rank and not trainable:
      raise ValueError(f"{where}.rank={section.rank}: the role is frozen (trainable=False), so its adapters would "
                       f"never train; set {where}.rank=0.")
    if section.rank and logra:
      raise ValueError(f"{where}.rank={section.rank} with {logra[0]}.name='logra': LoGRA sketches the gradients of "
                       f"the base weights that LoRA freezes; set {where}.rank=0 or choose another optimizer.")


def with_saved_adapters(shapes: Any, saved: Any) -> Any:
  """`shapes` (the base model's abstract params) plus the adapters of `saved` (a checkpoint's params
  metadata) as ShapeDtypeStructs, so a checkpoint of a LoRA run restores whole (and is then merged)."""
  if not has_adapters(saved):
    return shapes
  out = dict(shapes)
  for k, v in saved.items():
    if isinstance(v, Mapping) and k in shapes:
      out[k] = with_saved_adapters(shapes[k], v)
    elif str(k).endswith(SUFFIXES):
      out[k] = jax.ShapeDtypeStruct(tuple(v.shape), v.dtype)
  return out
