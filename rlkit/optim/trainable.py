"""What the update step differentiates and what the optimizer sees: `GradientPath` (ours).

`rlkit.train.steps.make_update_step` computes the loss of `model_params(args, params, opt_state)` and takes
`jax.grad` w.r.t. `args = grad_args(trainable(params), opt_state)` only; everything else is closed over, so a
leaf that is not an argument gets no gradient buffer (under `stop_gradient` it still would). The optimizer
is initialised on and updates `trainable(params)`, and `with_trainable` writes the result back:

  path      trainable(params)              grad_args                    model_params
  DENSE     all params                     = trainable                  = args
  (LoRA)    the adapters (+ value heads)   = trainable                  params with args written in
  logra     all params                     selected kernels -> zero     kernels closed over, sketch A and
            (rlkit/optim/logra_training)   sketches [in, r]             projection Pᵀ beside them

DENSE is the path of every optimizer that registers none (`gradient_path`); it trains the adapters alone
when the params carry LoRA adapters (`rlkit.models.lora.trainable_mask`).
"""
from __future__ import annotations

from typing import Any, Callable, NamedTuple

import jax

from rlkit.models.lora import trainable_mask


class GradientPath(NamedTuple):
  trainable: Callable[[Any], Any]                  # params -> the tree the optimizer updates
  with_trainable: Callable[[Any, Any], Any]        # (params, trainable) -> params
  grad_args: Callable[[Any, Any], Any]             # (trainable, opt_state) -> the tree jax.grad differentiates
  model_params: Callable[[Any, Any, Any], Any]     # (args, params, opt_state) -> the params the model applies


def select(tree: Any, mask: Any) -> Any:
  """The sub-dict of `tree` with the leaves where `mask` is True (empty dicts dropped)."""
  out = {}
  for k, v in tree.items():
    if isinstance(v, dict):
      sub = select(v, mask[k])
      if sub:
        out[k] = sub
    elif mask[k]:
      out[k] = v
  return out


def write(tree: Any, part: Any) -> Any:
  """`tree` with the leaves of the sub-dict `part` written in (a new dict; `tree` is not changed)."""
  out = dict(tree)
  for k, v in part.items():
    out[k] = write(tree[k], v) if isinstance(v, dict) else v
  return out


def _all_trainable(params) -> bool:
  return all(jax.tree.leaves(trainable_mask(params)))


def _trainable(params):
  return params if _all_trainable(params) else select(params, trainable_mask(params))


def _with_trainable(params, trainable):
  return trainable if _all_trainable(params) else write(params, trainable)


DENSE = GradientPath(trainable=_trainable, with_trainable=_with_trainable,
                     grad_args=lambda trainable, opt_state: trainable,
                     model_params=lambda args, params, opt_state: _with_trainable(params, args))
