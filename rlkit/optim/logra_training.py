"""LoGRA as the trainer's optimizer: `optimizer.name = "logra"` (methods/systems.md §3; rlkit/optim/logra.py).

The decoder projections named in `optimizer.logra_targets` (qkv, o, gate_up, down of every dense layer) are
trained by RowAdam on gradient sketches; every other parameter by AdamW (`b1`, `b2`, `eps`). A kernel is
sketched in its 2-D view W [in, out] (`rlkit.models.lora.VIEWS`: the kernel reshaped row-major, its leading
input axes merged, e.g. qkv [D, KV, G+2, hd] -> [D, KV·(G+2)·hd]); the optimizer sees the same views.

Model side (`logra_path`, a `GradientPath`): the step differentiates zero sketches A [in, r] in place of the
selected kernels, and the model applies the kernel (closed over: no gradient buffer) plus the zero-valued
term (x·A)·Pᵀ (`rlkit.models.lora.low_rank_term`: its forward computes nothing, its backward xᵀ·(dy·P)), so
∂L/∂A = G·P, the sketch, without the dense G.
P [out, r] comes from `layer_projections` at the LoGRA count in the optimizer state: regenerated from
`logra_seed`, the weight's path and the count, never stored, so a checkpoint holds only the count and
RowAdam's row moments, and a resumed run draws the same projections.

The update D·Pᵀ of a selected kernel is dense [in, out] (it is added to the weight); the step applies the
updates of all layers in one `apply_updates`, and XLA schedules each product next to its addition. Gradient
clipping uses the sketches' norm, an unbiased estimate of the dense one (E[P·Pᵀ] = I).
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from rlkit.models.lora import SKETCH_A, SKETCH_P, VIEWS, view_shape
from rlkit.optim.logra import layer_projections, logra, logra_count
from rlkit.optim.trainable import GradientPath


def _map(tree: Any, targets, selected: Callable, other: Callable, module: str = "") -> Any:
  """`tree` with `selected(module, name, leaf)` at the target kernels and `other(leaf)` elsewhere."""
  return {k: _map(v, targets, selected, other, k) if isinstance(v, dict)
          else (selected(module, k, v) if (module, k) in VIEWS and k in targets else other(v))
          for k, v in tree.items()}


def selected_mask(tree: Any, targets) -> Any:
  """Bools like `tree` (params, their views, gradients or sketches): True at the sketched kernels."""
  return _map(tree, targets, lambda m, k, v: True, lambda v: False)


def to_views(tree: Any, targets) -> Any:
  return _map(tree, targets, lambda m, k, v: v.reshape(view_shape(m, k, v.shape)), lambda v: v)


def kernel_views(inner: optax.GradientTransformation, targets) -> optax.GradientTransformationExtraArgs:
  """`inner` run on the 2-D views of the target kernels; its updates reshaped back to the kernels' shapes."""
  inner = optax.with_extra_args_support(inner)

  def update_fn(updates, state, params=None, **extra):
    new, state = inner.update(updates, state, to_views(params, targets), **extra)
    return jax.tree.map(lambda u, p: u.reshape(p.shape), new, params), state

  return optax.GradientTransformationExtraArgs(lambda params: inner.init(to_views(params, targets)), update_fn)


def logra_optimizer(learning_rate, cfg) -> optax.GradientTransformationExtraArgs:
  """The registered `logra` optimizer of an optimizer section (it consumes `logra_path`'s sketches)."""
  targets = tuple(cfg.logra_targets)
  inner = logra(learning_rate, cfg.logra_rank, seed=cfg.logra_seed, b2=cfg.logra_b2, eps=cfg.eps,
                weight_decay=cfg.weight_decay, mask=lambda tree: selected_mask(tree, targets),
                refresh_every=cfg.logra_refresh_every, sketch_inputs=True, adamw_b1=cfg.b1, adamw_b2=cfg.b2,
                adamw_eps=cfg.eps)
  return kernel_views(inner, targets)


def logra_path(cfg) -> GradientPath:
  """How the step differentiates for `logra_optimizer(cfg)` (module docstring)."""
  targets, rank = tuple(cfg.logra_targets), cfg.logra_rank

  def grad_args(params, opt_state):
    del opt_state
    return _map(params, targets, lambda m, k, v: jnp.zeros((view_shape(m, k, v.shape)[0], rank), v.dtype),
                lambda v: v)

  def model_params(args, params, opt_state):
    views = to_views(params, targets)
    projections = layer_projections(views, rank, logra_count(opt_state), seed=cfg.logra_seed,
                                    refresh_every=cfg.logra_refresh_every, mask=selected_mask(views, targets))

    def build(a, p, proj, module=""):
      out = {}
      for k, v in a.items():
        if isinstance(v, dict):
          out[k] = build(v, p[k], proj[k], k)
        elif (module, k) in VIEWS and k in targets:
          out[k], out[k + SKETCH_A], out[k + SKETCH_P] = p[k], v, proj[k].T
        else:
          out[k] = v
      return out
    return build(args, params, projections)

  return GradientPath(trainable=lambda params: params, with_trainable=lambda params, t: t,
                      grad_args=grad_args, model_params=model_params)


def check(section, where: str) -> None:
  """ValueError naming the key and the fix for bad `logra_*` fields of an optimizer section."""
  from rlkit.models.lora import TARGETS
  if section.logra_rank < 1:
    raise ValueError(f"{where}.logra_rank={section.logra_rank} must be >= 1 (the sketch width r).")
  if not 0 <= section.logra_b2 < 1:
    raise ValueError(f"{where}.logra_b2={section.logra_b2} must be in [0, 1).")
  if section.logra_refresh_every < 0:
    raise ValueError(f"{where}.logra_refresh_every={section.logra_refresh_every} must be >= 0 (0: one projection "
                     "throughout).")
  bad = [t for t in section.logra_targets if t not in TARGETS]
  if bad or (section.name == "logra" and not section.logra_targets):
    raise ValueError(f"{where}.logra_targets={tuple(section.logra_targets)!r}: name one or more of "
                     f"{', '.join(TARGETS)}.")
