"""Optimizers and learning-rate schedules from config (registry keyed by `optimizer.name`).

`make_optimizer(cfg, total_steps)` builds `clip_by_global_norm(clip) -> <optimizer>` with the learning rate
from a schedule: linear warm-up for `warmup_steps`, then `constant`, `cosine` (to `lr * final_lr_frac`) or
`linear` decay over the rest of `total_steps`. The optimizer is wrapped in `optax.inject_hyperparams`, so the
current learning rate is part of the optimizer state (checkpointed, and logged as `lr`). With `kl_target > 0`
the whole chain is wrapped in `predicted_kl_control` (rlkit/optim/logra.py): the update step passes a
`kl_probe` over its batch's tokens (rlkit/train/steps.py).

`optimizer.frozen` (a regex, `re.search`ed in each '/'-joined path of the tree the optimizer updates, e.g.
`moe/router$` for MoE routers) freezes the leaves it matches: `optax.partition` routes them to `freeze()`,
whose update is -0.0, the identity of IEEE addition (p + -0.0 == p bit for bit, -0.0 included; +0.0 would
turn a -0.0 weight into +0.0), and everything else to the optimizer above. So a frozen leaf gets no optimizer
state, no weight decay and no share of the clipped global norm, as if it were not a parameter (its gradient
is still computed). The pattern is checked against the real paths when the optimizer is initialised (a
ConfigError naming some). It applies to what the optimizer sees: with LoRA the adapters
(`<proj>_lora_a/_b`), with LoGRA every parameter except the sketched kernels (freezing one of those is
refused: drop it from `logra_targets` instead). (A step that predicted-KL control skips writes +0.0
updates, which only a frozen weight of exactly -0.0 would notice.)

An optimizer may change what the step differentiates: its registry entry's `gradient_path(cfg)` attribute
gives the `GradientPath` (rlkit/optim/trainable.py; `logra`: sketches, rlkit/optim/logra_training.py);
`gradient_path(cfg)` here returns it, or `DENSE`.
"""
from __future__ import annotations

import re
from typing import Any, Callable

import jax
import jax.numpy as jnp
import ml_collections
import optax

from rlkit.core.errors import ConfigError
from rlkit.core.registry import Registry, choice
from rlkit.optim import logra_training
from rlkit.optim.logra import PredictedKLState, predicted_kl_control
from rlkit.optim.trainable import DENSE, GradientPath
from rlkit.parallel.rules import path_str

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


@OPTIMIZERS.register("logra")
def _logra(learning_rate, cfg) -> optax.GradientTransformation:
  return logra_training.logra_optimizer(learning_rate, cfg)


_logra.gradient_path = logra_training.logra_path


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
  c.name = "adamw"          # registry name: adamw | adam | sgd | logra (sketched RowAdam on logra_targets,
                            # AdamW with b1, b2, eps on the rest; rlkit/optim/logra_training.py)
  c.lr = 1e-3               # peak learning rate
  c.schedule = "constant"   # constant | cosine | linear (after warm-up)
  c.warmup_steps = 0        # linear warm-up from 0 to `lr`, in optimizer steps
  c.final_lr_frac = 0.1     # cosine/linear decay ends at lr * final_lr_frac
  c.b1 = 0.9                # Adam beta1 (SGD momentum; 0 = none)
  c.b2 = 0.999              # Adam beta2
  c.eps = 1e-8              # Adam epsilon
  c.weight_decay = 0.0      # decoupled weight decay (adamw, logra)
  c.clip_norm = 1.0         # clip gradients to this global norm; 0 disables
  c.kl_target = 0.0         # scale each step so the KL it predicts on the step's own batch tokens is <= this;
                            # a non-finite prediction skips the step (0: off; DESIGN, methods/systems.md §3)
  c.logra_rank = 16         # logra: sketch width r of each selected projection
  c.logra_targets = ("qkv", "o", "gate_up", "down")   # logra: the decoder projections trained on sketches
  c.logra_b2 = 0.95         # logra: decay of RowAdam's row-wise second moment
  c.logra_refresh_every = 1   # logra: steps between projection redraws (0: one projection throughout)
  c.logra_seed = 0          # logra: seed of the projections (regenerated from it, the weight's path and the step)
  c.frozen = ""             # regex searched in '/'-joined param paths ("moe/router$"): those never change ("": none)
  return c


def check(section, where: str) -> None:
  """ConfigError naming the key and the fix for a bad optimizer section `where` (types are checked by
  `config_checks.validate`)."""
  choice(section.name, OPTIMIZERS, f"{where}.name")
  choice(section.schedule, SCHEDULES, f"{where}.schedule")
  if section.lr <= 0:
    raise ConfigError(f"{where}.lr={section.lr} must be > 0.")
  if section.kl_target < 0:
    raise ConfigError(f"{where}.kl_target={section.kl_target} must be >= 0 (0 turns the KL control off).")
  try:
    re.compile(section.frozen)
  except re.error as e:
    raise ConfigError(f"{where}.frozen={section.frozen!r} is not a regular expression ({e}); e.g. "
                      "'moe/router$'.") from None
  try:
    logra_training.check(section, where)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def gradient_path(cfg: ml_collections.ConfigDict) -> GradientPath:
  """What the update step differentiates for the optimizer of section `cfg` (module docstring)."""
  return getattr(OPTIMIZERS.get(cfg.name), "gradient_path", lambda cfg: DENSE)(cfg)


# ---------------------------------------------------------------------------------------------------------
# Frozen parameters (`optimizer.frozen`)

FROZEN, TRAINED = "frozen", "trained"


def freeze() -> optax.GradientTransformation:
  """Updates of -0.0 shaped like the params (not like the gradients: LoGRA's are sketches): p + -0.0 == p
  bit for bit, for every p."""
  def update_fn(updates, state, params=None):
    del updates
    if params is None:
      raise ValueError(optax.NO_PARAMS_MSG)
    return jax.tree.map(lambda p: jnp.full(jnp.shape(p), -0.0, p.dtype), params), state

  return optax.GradientTransformation(lambda params: optax.EmptyState(), update_fn)


def frozen_labels(cfg: ml_collections.ConfigDict) -> Callable[[Any], Any]:
  """params -> a tree of FROZEN / TRAINED by `cfg.frozen`; a ConfigError when the pattern matches no leaf, or
  (logra) a sketched kernel."""
  regex = re.compile(cfg.frozen)

  def labels(tree):
    flat, treedef = jax.tree_util.tree_flatten_with_path(tree)
    paths = [path_str(p) for p, _ in flat]
    hits = [bool(regex.search(p)) for p in paths]
    if not any(hits):
      raise ConfigError(f"optimizer.frozen={cfg.frozen!r} matches none of the {len(paths)} parameters the "
                        f"optimizer updates (with LoRA: the adapters), e.g. {', '.join(paths[:6])}. The pattern "
                        "is re.search-ed in these '/'-joined paths; fix it, or set optimizer.frozen=''.")
    if cfg.name == "logra":
      sketched = jax.tree.leaves(logra_training.selected_mask(tree, tuple(cfg.logra_targets)))
      both = [p for p, h, s in zip(paths, hits, sketched) if h and s]
      if both:
        raise ConfigError(f"optimizer.frozen={cfg.frozen!r} matches {', '.join(both[:3])}, which LoGRA trains on "
                          "sketches (optimizer.logra_targets); freezing one is not supported: remove its name "
                          "from logra_targets, or narrow the pattern.")
    return jax.tree.unflatten(treedef, [FROZEN if h else TRAINED for h in hits])

  return labels


def make_optimizer(cfg: ml_collections.ConfigDict, total_steps: int) -> optax.GradientTransformation:
  schedule = SCHEDULES.get(cfg.schedule)(cfg.lr, cfg.warmup_steps, total_steps, cfg.final_lr_frac)
  make = OPTIMIZERS.get(cfg.name)
  tx = optax.inject_hyperparams(lambda learning_rate: make(learning_rate, cfg))(learning_rate=schedule)
  if cfg.clip_norm and cfg.clip_norm > 0:
    tx = optax.chain(optax.clip_by_global_norm(cfg.clip_norm), tx)
  if cfg.get("frozen"):
    # Inside the KL control, whose prediction then sees the frozen leaves' zero displacement.
    tx = optax.partition({TRAINED: tx, FROZEN: freeze()}, frozen_labels(cfg))
  if cfg.kl_target > 0:
    tx = predicted_kl_control(tx, cfg.kl_target)
  return tx


def _find(opt_state: Any, test) -> Any:
  found = [s for s in jax.tree.leaves(opt_state, is_leaf=test) if test(s)]
  return found[0] if found else None


def current_lr(opt_state: Any) -> Any:
  """The learning rate the last update used (from the inject_hyperparams state)."""
  s = _find(opt_state, lambda s: hasattr(s, "hyperparams"))
  return None if s is None else s.hyperparams["learning_rate"]


def controls_kl(opt_state: Any) -> bool:
  """Whether the optimizer behind `opt_state` has predicted-KL control (`kl_target > 0`): static, read from
  the state's structure (so a jitted step can decide what to compute from it)."""
  return _find(opt_state, lambda s: isinstance(s, PredictedKLState)) is not None


def update_info(opt_state: Any) -> tuple[dict, Any]:
  """({"lr", with KL control "kl/predicted" (q of the unscaled step), "kl/scale" (α) and "kl/applied" (α²·q,
  the KL predicted for the step applied)}: values after an update, whether the KL control skipped it (False
  without one))."""
  lr = current_lr(opt_state)
  info = {} if lr is None else {"lr": lr}
  kl = _find(opt_state, lambda s: isinstance(s, PredictedKLState))
  if kl is None:
    return info, False
  return dict(info, **{"kl/predicted": kl.predicted_kl, "kl/scale": kl.scale,
                       "kl/applied": jnp.square(kl.scale) * kl.predicted_kl}), kl.scale == 0
