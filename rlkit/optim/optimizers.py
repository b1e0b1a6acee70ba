"""Optimizers and learning-rate schedules from config (registry keyed by `optimizer.name`).

`make_optimizer(cfg, total_steps)` builds `clip_by_global_norm(clip) -> <optimizer>` with the learning rate
from a schedule: linear warm-up for `warmup_steps`, then `constant`, `cosine` (to `lr * final_lr_frac`) or
`linear` decay over the rest of `total_steps`. The optimizer is wrapped in `optax.inject_hyperparams`, so the
current learning rate is part of the optimizer state (checkpointed, and logged as `lr`).
"""
from __future__ import annotations

from typing import Any, Callable

import ml_collections
import optax

from rlkit.core.registry import Registry

OPTIMIZERS: Registry[Callable[..., optax.GradientTransformation]] = Registry("optimizer")
SCHEDULES: Registry[Callable[..., optax.Schedule]] = Registry("lr schedule")


@OPTIMIZERS.register("adamw")
def _adamw(learning_rate, cfg) -> optax.GradientTransformation:
  return optax.adamw(learning_rate, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps, weight_decay=cfg.weight_decay)


@OPTIMIZERS.register("adam")
def _adam(learning_rate, cfg) -> optax.GradientTransformation:
  return optax.adam(learning_rate, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)


@OPTIMIZERS.register("sgd")
def _sgd(learning_rate, cfg) -> optax.GradientTransformation:
  return optax.sgd(learning_rate, momentum=cfg.b1 or None)


def _warmup_then(decay: optax.Schedule, lr: float, warmup: int) -> optax.Schedule:
  if warmup <= 0:
    return decay
  return optax.join_schedules([optax.linear_schedule(0.0, lr, warmup), decay], [warmup])


@SCHEDULES.register("constant")
def _constant(lr, warmup, total, final_frac):
  return _warmup_then(optax.constant_schedule(lr), lr, warmup)


@SCHEDULES.register("cosine")
def _cosine(lr, warmup, total, final_frac):
  return _warmup_then(optax.cosine_decay_schedule(lr, max(total - warmup, 1), alpha=final_frac), lr, warmup)


@SCHEDULES.register("linear")
def _linear(lr, warmup, total, final_frac):
  return _warmup_then(optax.linear_schedule(lr, lr * final_frac, max(total - warmup, 1)), lr, warmup)


def optimizer_defaults() -> ml_collections.ConfigDict:
  """The `optimizer` section of a training stage; every field is documented here, once."""
  c = ml_collections.ConfigDict()
  c.name = "adamw"          # registry name: adamw | adam | sgd
  c.lr = 1e-3               # peak learning rate
  c.schedule = "constant"   # constant | cosine | linear (after warm-up)
  c.warmup_steps = 0        # linear warm-up from 0 to `lr`, in optimizer steps
  c.final_lr_frac = 0.1     # cosine/linear decay ends at lr * final_lr_frac
  c.b1 = 0.9                # Adam beta1 (SGD momentum; 0 = none)
  c.b2 = 0.999              # Adam beta2
  c.eps = 1e-8              # Adam epsilon
  c.weight_decay = 0.0      # decoupled weight decay (adamw)
  c.clip_norm = 1.0         # clip gradients to this global norm; 0 disables
  return c


def make_optimizer(cfg: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
  schedule = SCHEDULES.get(cfg.schedule)(cfg.lr, cfg.warmup_steps, total_steps, cfg.final_lr_frac)
  make = OPTIMIZERS.get(cfg.name)
  tx = optax.inject_hyperparams(lambda learning_rate: make(learning_rate, cfg))(learning_rate=schedule)
  if cfg.clip_norm and cfg.clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx)
  return tx


def current_lr(opt_state: Any) -> Any:
  """The learning rate the last update used (from the inject_hyperparams state)."""
  for s in (opt_state if isinstance(opt_state, tuple) else (opt_state,)):
    if hasattr(s, "hyperparams"):
      return s.hyperparams["learning_rate"]
  return None
