"""Reward-model heads over a conditioning vector, one registry `REWARD_HEADS` for all of them, the risk
functionals an RL reward reads from their samples (fitting a head by name: `head_catalog.fit_head`).

A head reads `cond` [N, D], a pooled LM embedding of (prompt, response) (synthetic features in tests). The
point and distributional baselines are the FOUND prior art listed in ../shared/methods/llm.md §11; the
diffusion head "diffusion" (rlkit/rewards/drm.py) is our design (DESIGN, ../shared/methods/llm.md §11). Batch
`ratings` [N, A] hold A annotators' scores with `mask` [N, A] (1: observed; absent: all observed):

  scalar         r(e);                    MSE    Σ m (r(e) - y)² / Σ m
  bradley_terry  r(e);                    -log σ(r(e_chosen) - r(e_rejected))      (batch: cond_chosen/_rejected)
  gaussian       μ(e), log v(e);          NLL    ½ log 2πv + (y - μ)² / 2v on each observed rating
  quantile       q_1 ≤ ... ≤ q_Q at τ_i = (i + ½)/Q;  pinball Σ_i max(τ_i u, (τ_i - 1) u), u = y - q_i
                 q_1 free, q_{i+1} = q_i + softplus(·): quantiles never cross

Rating heads work in unit scale, r = rating_mean + rating_std · (network output), with the fixed (mean, std)
in the head's kwargs (`rating_scale` computes them from data), so one learning rate suits any rating scale.

Every head's `samples(params, apply, key, cond, n) -> [N, n]` puts it under the same distribution metrics
(rlkit/rewards/reward_metrics.py): a point model repeats its point, the Gaussian draws, the quantile head
returns its quantile function at the levels (j + ½)/n (linear between its Q levels, flat beyond them).
"""
from __future__ import annotations

import math
from typing import Any, Callable, Mapping, NamedTuple, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from rlkit.core.registry import Registry

Params = Any
Batch = Mapping[str, jax.Array]
Apply = Callable[..., Any]


class RewardHeadSpec(NamedTuple):
  """One registered head. `make(**kwargs)` checks the kwargs and builds the flax module; `init(module, key,
  cond)` its params; `loss(params, apply, key, batch) -> (scalar, metrics)` and `samples(params, apply, key,
  cond, n) -> [N, n]` are pure, with `apply = module.apply`. `batch_keys` are the arrays `loss` reads, the
  conditioning one first; `keywords` the kwargs `make` takes."""
  make: Callable[..., nn.Module]
  init: Callable[[nn.Module, jax.Array, jax.Array], Params]
  loss: Callable[[Params, Apply, jax.Array, Batch], tuple[jax.Array, dict]]
  samples: Callable[[Params, Apply, jax.Array, jax.Array, int], jax.Array]
  batch_keys: tuple[str, ...]
  keywords: tuple[str, ...]


REWARD_HEADS: Registry[RewardHeadSpec] = Registry("reward head")

RATING_BATCH = ("cond", "ratings")            # + optional "mask"
PAIR_BATCH = ("cond_chosen", "cond_rejected")


# ----------------------------------------------------------------------------------------------- kwargs checks

def positive_int(value) -> Optional[str]:
  return None if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else "a positive int"


def finite_float(value) -> Optional[str]:
  ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
  return None if ok else "a finite number"


def positive_float(value) -> Optional[str]:
  return None if finite_float(value) is None and value > 0 else "a finite number > 0"


def one_of(*choices: str) -> Callable[[Any], Optional[str]]:
  return lambda value: None if value in choices else f"one of {list(choices)}"


def register_head(name: str, module_cls: type, *, checks: Mapping[str, Callable[[Any], Optional[str]]],
                  init, loss, samples, batch_keys: tuple[str, ...],
                  validate: Optional[Callable[[Mapping[str, Any]], Optional[tuple[str, str]]]] = None) -> None:
  """Registers `module_cls` as head `name`. Its kwargs are the keys of `checks` (module fields; the others keep
  their defaults), each checked by a function returning what a valid value is, or None. `validate` sees all
  fields (defaults filled in) and returns (key, problem) for a mistake that spans keys, or None."""
  fields = module_cls.__dataclass_fields__

  def make(**kwargs) -> nn.Module:
    unknown = sorted(set(kwargs) - set(checks))
    if unknown:
      raise ValueError(f"reward head {name!r}: unknown keyword(s) {unknown}; valid keywords: {sorted(checks)}.")
    for key, value in kwargs.items():
      expected = checks[key](value)
      if expected:
        raise ValueError(f"reward head {name!r}: {key}={value!r} is invalid; give {expected}.")
    if validate:
      problem = validate({**{k: fields[k].default for k in checks}, **kwargs})
      if problem:
        raise ValueError(f"reward head {name!r}: {problem[0]} {problem[1]}.")
    return module_cls(**kwargs)

  REWARD_HEADS.add(name, RewardHeadSpec(make, init, loss, samples, batch_keys, tuple(sorted(checks))))


def rating_scale(ratings, mask=None) -> dict[str, float]:
  """{"rating_mean", "rating_std"} of the observed ratings: the fixed standardisation a rating head's kwargs
  take (computed once from training data, stored with the config, never re-estimated per batch)."""
  ratings = np.asarray(ratings, np.float64)
  values = ratings[np.ones(ratings.shape, bool) if mask is None else np.asarray(mask) > 0]
  if not values.size:
    raise ValueError("rating_scale: no observed ratings (the mask is all zero).")
  return {"rating_mean": float(values.mean()), "rating_std": float(max(values.std(), 1e-6))}


# ----------------------------------------------------------------------------------------------- shared pieces

class ConditionMLP(nn.Module):
  """The trunk every baseline head shares: `depth` SiLU layers of width `hidden` over cond [N, D]."""
  hidden: int
  depth: int

  @nn.compact
  def __call__(self, cond: jax.Array) -> jax.Array:
    h = jnp.asarray(cond, jnp.float32)
    for _ in range(self.depth):
      h = nn.silu(nn.Dense(self.hidden)(h))
    return h


def observed_ratings(batch: Batch) -> tuple[jax.Array, jax.Array]:
  """(ratings [N, A] float32 with unobserved entries zeroed, mask [N, A] float32)."""
  ratings = jnp.asarray(batch["ratings"], jnp.float32)
  mask = batch.get("mask")
  mask = jnp.ones_like(ratings) if mask is None else jnp.asarray(mask, jnp.float32)
  # Zeroed, so a NaN placeholder in an unobserved slot cannot leak into a gradient through 0 * NaN.
  return jnp.where(mask > 0, ratings, 0.0), mask


def masked_mean(values: jax.Array, mask: jax.Array) -> jax.Array:
  return (values * mask).sum() / jnp.maximum(mask.sum(), 1.0)


def init_on_cond(module: nn.Module, key: jax.Array, cond: jax.Array) -> Params:
  return module.init(key, jnp.asarray(cond, jnp.float32))


def repeated_point(params, apply, key, cond, n: int) -> jax.Array:
  """Samples of a point model: its prediction repeated n times, [N, n]."""
  return jnp.repeat(apply(params, cond)[:, None], n, axis=1)


TRUNK_CHECKS = {"hidden": positive_int, "depth": positive_int}
SCALE_CHECKS = {"rating_mean": finite_float, "rating_std": positive_float}


# ----------------------------------------------------------------------------------------------- point heads

class ScalarRewardHead(nn.Module):
  """r(e) [N]: the scalar reward model (regression or Bradley–Terry)."""
  hidden: int = 64
  depth: int = 2
  rating_mean: float = 0.0
  rating_std: float = 1.0

  @nn.compact
  def __call__(self, cond: jax.Array) -> jax.Array:
    out = nn.Dense(1)(ConditionMLP(self.hidden, self.depth)(cond))[:, 0]
    return self.rating_mean + self.rating_std * out


def scalar_loss(params, apply, key, batch):
  ratings, mask = observed_ratings(batch)
  mse = masked_mean(jnp.square(apply(params, batch["cond"])[:, None] - ratings), mask)
  return mse, {"mse": mse}


def bradley_terry_loss(params, apply, key, batch):
  margin = apply(params, batch["cond_chosen"]) - apply(params, batch["cond_rejected"])
  loss = jnp.mean(jax.nn.softplus(-margin))          # -log σ(margin), stable for large |margin|
  return loss, {"bt_loss": loss, "pair_accuracy": jnp.mean(margin > 0)}


register_head("scalar", ScalarRewardHead, checks={**TRUNK_CHECKS, **SCALE_CHECKS}, init=init_on_cond,
              loss=scalar_loss, samples=repeated_point, batch_keys=RATING_BATCH)
# Bradley–Terry identifies r only up to a shift (and its scale through the data), so no rating scale kwargs.
register_head("bradley_terry", ScalarRewardHead, checks=TRUNK_CHECKS, init=init_on_cond,
              loss=bradley_terry_loss, samples=repeated_point, batch_keys=PAIR_BATCH)


# ----------------------------------------------------------------------------------------------- gaussian

LOG_VAR_FLOOR = math.log(1e-4)


class GaussianRewardHead(nn.Module):
  """(mean [N], log-variance [N]) of a Gaussian reward, in rating units."""
  hidden: int = 64
  depth: int = 2
  rating_mean: float = 0.0
  rating_std: float = 1.0

  @nn.compact
  def __call__(self, cond: jax.Array) -> tuple[jax.Array, jax.Array]:
    out = nn.Dense(2)(ConditionMLP(self.hidden, self.depth)(cond))
    # A soft floor (variance >= 1e-4 in unit scale): a row of identical ratings would drive the NLL to -inf.
    log_var = LOG_VAR_FLOOR + jax.nn.softplus(out[:, 1] - LOG_VAR_FLOOR)
    return self.rating_mean + self.rating_std * out[:, 0], log_var + 2.0 * math.log(self.rating_std)


def gaussian_loss(params, apply, key, batch):
  ratings, mask = observed_ratings(batch)
  mean, log_var = apply(params, batch["cond"])
  nll = 0.5 * (math.log(2 * math.pi) + log_var[:, None]
               + jnp.square(ratings - mean[:, None]) * jnp.exp(-log_var)[:, None])
  nll = masked_mean(nll, mask)
  return nll, {"nll": nll, "mean_variance": jnp.mean(jnp.exp(log_var))}


def gaussian_samples(params, apply, key, cond, n: int) -> jax.Array:
  mean, log_var = apply(params, cond)
  return mean[:, None] + jnp.exp(0.5 * log_var)[:, None] * jax.random.normal(key, (mean.shape[0], n))


register_head("gaussian", GaussianRewardHead, checks={**TRUNK_CHECKS, **SCALE_CHECKS}, init=init_on_cond,
              loss=gaussian_loss, samples=gaussian_samples, batch_keys=RATING_BATCH)


# ----------------------------------------------------------------------------------------------- quantile

def quantile_levels(num_quantiles: int) -> jax.Array:
  """τ_i = (i + ½)/Q: the midpoints, so Q quantiles are the best Q-point approximation in W1."""
  return (jnp.arange(num_quantiles, dtype=jnp.float32) + 0.5) / num_quantiles


class QuantileRewardHead(nn.Module):
  """Quantiles [N, Q] at `levels()`, non-decreasing along Q by construction (cumulative softplus steps)."""
  hidden: int = 64
  depth: int = 2
  num_quantiles: int = 16
  rating_mean: float = 0.0
  rating_std: float = 1.0

  @nn.compact
  def __call__(self, cond: jax.Array) -> jax.Array:
    out = nn.Dense(self.num_quantiles)(ConditionMLP(self.hidden, self.depth)(cond))
    unit = jnp.cumsum(jnp.concatenate([out[:, :1], jax.nn.softplus(out[:, 1:])], axis=1), axis=1)
    return self.rating_mean + self.rating_std * unit

  def levels(self) -> jax.Array:
    return quantile_levels(self.num_quantiles)


def quantile_loss(params, apply, key, batch):
  ratings, mask = observed_ratings(batch)
  quantiles, levels = apply(params, batch["cond"]), apply(params, method="levels")
  u = ratings[:, :, None] - quantiles[:, None, :]                        # [N, A, Q]
  pinball = jnp.maximum(levels * u, (levels - 1.0) * u).mean(axis=-1)
  pinball = masked_mean(pinball, mask)
  return pinball, {"pinball": pinball}


def quantile_samples(params, apply, key, cond, n: int) -> jax.Array:
  quantiles, levels = apply(params, cond), apply(params, method="levels")
  grid = quantile_levels(n)
  return jax.vmap(lambda q: jnp.interp(grid, levels, q))(quantiles)


register_head("quantile", QuantileRewardHead,
              checks={**TRUNK_CHECKS, "num_quantiles": positive_int, **SCALE_CHECKS}, init=init_on_cond,
              loss=quantile_loss, samples=quantile_samples, batch_keys=RATING_BATCH)


# ----------------------------------------------------------------------------------------------- RL rewards

def reward_statistics(samples: jax.Array, quantiles=(0.1, 0.5, 0.9)) -> dict[str, jax.Array]:
  """Per row of samples [N, S]: mean, std and the chosen quantiles (keys "q10", "q50", "q90"), each [N]."""
  samples = jnp.asarray(samples, jnp.float32)
  stats = {"mean": samples.mean(axis=1), "std": samples.std(axis=1)}
  for level in quantiles:
    stats[f"q{round(100 * level):g}"] = jnp.quantile(samples, level, axis=1)
  return stats


RISKS = ("mean", "quantile", "cvar")


def risk_reward(samples: jax.Array, kind: str = "mean", level: float = 0.1) -> jax.Array:
  """The reward an RL step uses, [N], from reward samples [N, S]:

    mean      E[r]
    quantile  the level-quantile q_level(r) (linear interpolation between order statistics)
    cvar      E[r | r <= q_level]: the mean of the lowest ceil(level · S) samples (risk-averse lower tail)
  """
  if kind not in RISKS:
    raise ValueError(f"risk_reward: kind={kind!r} is not one of {list(RISKS)}.")
  if kind != "mean" and not (isinstance(level, (int, float)) and 0 < level <= 1):
    raise ValueError(f"risk_reward: level={level!r} must be a number in (0, 1] for kind={kind!r}.")
  samples = jnp.asarray(samples, jnp.float32)
  if kind == "mean":
    return samples.mean(axis=1)
  if kind == "quantile":
    return jnp.quantile(samples, level, axis=1)
  tail = max(1, math.ceil(level * samples.shape[1] - 1e-9))      # static: the sample count is a shape
  return jnp.sort(samples, axis=1)[:, :tail].mean(axis=1)


def uncertainty_penalty(samples: jax.Array, coef: float) -> jax.Array:
  """coef · std(r) per row [N]: subtract it from the reward to shrink the credit of responses the reward
  model is unsure (or annotators disagree) about."""
  return coef * jnp.asarray(samples, jnp.float32).std(axis=1)
