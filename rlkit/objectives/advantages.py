"""Group-relative advantage estimators: GRPO, Lite-PPO batch scaling, Dr. GRPO and RLOO.

Rewards arrive as a flat `[N]` vector with the G completions of each prompt in contiguous rows
(`Rollout.group_ids == arange(N) // G`). For one group `r = (r_1, ..., r_G)`:

  group:  A_i = (r_i - mean(r)) / (std(r) + eps)          GRPO
  batch:  A_i = (r_i - mean(r)) / (std(r_batch) + eps)    group mean, batch std (Lite-PPO; TRL "batch")
  none:   A_i =  r_i - mean(r)                            Dr. GRPO
  rloo:   A_i =  r_i - mean_{j != i} r_j  =  G/(G-1) (r_i - mean(r))

`std` is Bessel-corrected (ddof=1), as in TRL, verl and Tunix. Exact formulas and the points where peer
libraries disagree: methods/llm.md §12.

Choices:
- `eps` defaults to 1e-6 (verl, Tunix); TRL uses 1e-4. They differ only for groups whose std is comparable
  to eps: binary rewards give std >= 0.17 for G <= 32, so the choice matters only for near-flat continuous
  rewards. Pass `eps=1e-4` to match TRL.
- A group whose rewards are all equal gets exactly 0 under every estimator, so it contributes exactly zero
  gradient. This is enforced, not left to arithmetic: the float mean of G equal numbers need not equal them,
  and in the `group` estimator a ~1e-8 centring residue divided by a ~1e-8 std (+ eps) is not small.
- A group of size 1 is flat by this rule, so it gets 0 (no peer to compare with). verl's GRPO loop gives it
  the raw reward instead, its vectorised RLOO gives 0; we pick 0 everywhere.

`group_size` is a static Python int (it fixes a reshape), so these functions jit with it as a constant.

Padding rows: with `valid` ([N] bool) a group's statistics use its valid rows only (mean over them, std with
ddof=1 over them, the leave-one-out over them) and invalid rows get exactly 0, so padding rows an augmenter
leaves in a group change nothing. `valid=None` (every row real) runs the unmasked formulas.
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp

from rlkit.core.registry import Registry

AdvantageFn = Callable[..., jax.Array]

ADVANTAGES: Registry[AdvantageFn] = Registry("advantage estimator")

DEFAULT_EPS = 1e-6


def _grouped(rewards: jax.Array, group_size: int) -> jax.Array:
  """[N] -> [N // G, G] in a float dtype (at least float32: integer or bf16 rewards are promoted)."""
  rewards = jnp.asarray(rewards)
  if rewards.ndim != 1:
    raise ValueError(f"rewards must be a flat [N] vector, got shape {rewards.shape}.")
  if not isinstance(group_size, int) or group_size < 1:
    raise ValueError(f"group_size must be a positive int, got {group_size!r}.")
  if rewards.shape[0] % group_size:
    raise ValueError(
        f"{rewards.shape[0]} rewards do not split into groups of {group_size}; the batch must hold whole "
        "groups, each in contiguous rows.")
  dtype = jnp.promote_types(rewards.dtype, jnp.float32)
  return rewards.astype(dtype).reshape(-1, group_size)


def _is_informative(grouped: jax.Array) -> jax.Array:
  # max > min is exact; std > 0 can be fooled by rounding in the mean.
  return grouped.max(axis=1) > grouped.min(axis=1)


def informative_groups(rewards: jax.Array, group_size: int) -> jax.Array:
  """`[N // G]` bool, True where a group's rewards are not all equal (std > 0, tested exactly).

  Flat groups carry no group-relative signal; DAPO's dynamic sampling drops them (see `dapo.py`).
  """
  return _is_informative(_grouped(rewards, group_size))


def _zero_flat_groups(grouped: jax.Array, advantages: jax.Array) -> jax.Array:
  return jnp.where(_is_informative(grouped)[:, None], advantages, 0.0).reshape(-1)


class _Masked:
  """Valid-row statistics of grouped rewards `r` [g, G] under `v` [g, G] bool."""

  def __init__(self, r: jax.Array, valid: jax.Array):
    self.r, self.v = r, valid.reshape(r.shape)
    self.n = self.v.sum(axis=1, keepdims=True).astype(r.dtype)
    self.mean = jnp.where(self.v, r, 0.0).sum(axis=1, keepdims=True) / jnp.maximum(self.n, 1)

  def std(self) -> jax.Array:
    sq = jnp.where(self.v, jnp.square(self.r - self.mean), 0.0).sum(axis=1, keepdims=True)
    return jnp.sqrt(sq / (self.n - 1))        # NaN / inf for n <= 1: those groups are flat and zeroed

  def finish(self, advantages: jax.Array) -> jax.Array:
    hi = jnp.where(self.v, self.r, -jnp.inf).max(axis=1, keepdims=True)
    lo = jnp.where(self.v, self.r, jnp.inf).min(axis=1, keepdims=True)
    return jnp.where(self.v & (hi > lo), advantages, 0.0).reshape(-1)


def _masked(rewards, group_size, valid):
  return _Masked(_grouped(rewards, group_size), jnp.asarray(valid, bool))


@ADVANTAGES.register("group")
def grpo_advantages(rewards: jax.Array, group_size: int, eps: float = DEFAULT_EPS, valid=None) -> jax.Array:
  """GRPO: `(r_i - group mean) / (group std + eps)`, std with ddof=1. `[N] -> [N]`."""
  if valid is not None:
    m = _masked(rewards, group_size, valid)
    return m.finish((m.r - m.mean) / (m.std() + eps))
  r = _grouped(rewards, group_size)
  centred = r - r.mean(axis=1, keepdims=True)
  std = r.std(axis=1, ddof=1, keepdims=True)  # NaN for G == 1; those groups are flat and zeroed.
  return _zero_flat_groups(r, centred / (std + eps))


@ADVANTAGES.register("batch")
def batch_std_advantages(rewards: jax.Array, group_size: int, eps: float = DEFAULT_EPS,
                         valid=None) -> jax.Array:
  """Group mean, batch std: `(r_i - group mean) / (std of all N rewards + eps)`, ddof=1. `[N] -> [N]`.

  The std is of the raw rewards over the whole batch (TRL `scale_rewards="batch"`). Under data parallelism
  "batch" means whatever rows this call sees; gather rewards first for a global std.
  """
  if valid is not None:
    m = _masked(rewards, group_size, valid)
    n = m.n.sum()
    batch_mean = jnp.where(m.v, m.r, 0.0).sum() / n
    std = jnp.sqrt(jnp.where(m.v, jnp.square(m.r - batch_mean), 0.0).sum() / (n - 1))
    return m.finish((m.r - m.mean) / (std + eps))
  r = _grouped(rewards, group_size)
  centred = r - r.mean(axis=1, keepdims=True)
  std = r.std(ddof=1)
  return _zero_flat_groups(r, centred / (std + eps))


@ADVANTAGES.register("none")
def dr_grpo_advantages(rewards: jax.Array, group_size: int, eps: float = DEFAULT_EPS, valid=None) -> jax.Array:
  """Dr. GRPO: `r_i - group mean`, no std division (removes the difficulty bias). `eps` is unused."""
  del eps
  if valid is not None:
    m = _masked(rewards, group_size, valid)
    return m.finish(m.r - m.mean)
  r = _grouped(rewards, group_size)
  return _zero_flat_groups(r, r - r.mean(axis=1, keepdims=True))


@ADVANTAGES.register("rloo")
def rloo_advantages(rewards: jax.Array, group_size: int, eps: float = DEFAULT_EPS, valid=None) -> jax.Array:
  """RLOO: `r_i - mean_{j != i} r_j` (leave-one-out baseline). 1-member groups get 0; `eps` is unused."""
  del eps
  if valid is not None:
    m = _masked(rewards, group_size, valid)
    total = jnp.where(m.v, m.r, 0.0).sum(axis=1, keepdims=True)
    return m.finish(m.r - (total - m.r) / jnp.maximum(m.n - 1, 1))
  r = _grouped(rewards, group_size)
  if group_size == 1:
    return jnp.zeros(r.shape[0], r.dtype)
  others = (r.sum(axis=1, keepdims=True) - r) / (group_size - 1)
  return _zero_flat_groups(r, r - others)


def group_advantages(name: str, rewards: jax.Array, group_size: int,
                     eps: float = DEFAULT_EPS, valid=None) -> jax.Array:
  """Advantages `[N]` from the estimator registered as `name` ("group", "batch", "none", "rloo"); `valid`
  [N] bool marks real rows (None: all)."""
  if valid is None:
    return ADVANTAGES.get(name)(rewards, group_size, eps=eps)
  return ADVANTAGES.get(name)(rewards, group_size, eps=eps, valid=valid)
