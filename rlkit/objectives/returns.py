"""Token-level returns, GAE, whitening, REINFORCE++ advantages and the clipped value loss (verl `core_algos`).

All arrays are `[N, T]` over response tokens with a mask `m` (True on tokens the policy produced). Time runs
over the valid tokens only: a masked step is skipped, not a zero-reward step (it neither discounts nor
resets), so interior masked spans (tool output in a multi-turn rollout) are transparent.

  outcome_token_rewards   r_{i,t} = R_i on the last valid token of row i, 0 elsewhere
  discounted_returns      G_t = r_t + gamma G_{t'}                   t' the next valid step, G = 0 past the end
  gae                     delta_t = r_t + gamma V_{t'} - V_t,  A_t = delta_t + gamma lam A_{t'},  returns = A + V
  masked_whiten           (x - mean_m x) / sqrt(var_m x + eps),  var with Bessel's correction (ddof = 1)
  reinforce_pp_advantages           masked_whiten(discounted_returns(r, m, gamma))
  reinforce_pp_baseline_advantages  masked_whiten(broadcast(R_i - mean_group R))
  clipped_value_loss      0.5 max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)

Peer semantics (verl b178a3c):
- `gae` is `compute_gae_advantage_return`: masked steps keep the next value and the running advantage (the
  "skip values and TD-error on observation tokens" rule), so values and rewards beyond a row's last valid
  token are never read. verl whitens the GAE advantages inside that function; here `masked_whiten` is a
  separate call (PPO: `adv = masked_whiten(gae(...)[0], mask)`), and `returns` are the unwhitened `A + V`.
- `masked_whiten` is `verl_F.masked_whiten` (masked mean, unbiased masked variance, `rsqrt(var + 1e-8)`).
- `reinforce_pp_advantages` is `compute_reinforce_plus_plus_outcome_advantage`, except at masked steps: verl
  resets its running return at every masked token ("reset after EOS"), which cuts the return across an
  interior masked span; we skip masked steps as its GAE does. The two agree whenever each row's valid
  tokens come before its padding.
- `reinforce_pp_baseline_advantages` is `compute_reinforce_plus_plus_baseline_outcome_advantage`.

Choices:
- Outputs are 0 off the mask (verl leaves carried or whitened values there); inputs off the mask are ignored,
  even if NaN, because every use goes through `jnp.where`.
- Whitening a constant gives exactly 0, not the rounding residue of the mean times `1 / sqrt(eps)` = 1e4; the
  variance divides by `max(n - 1, 1)`, so one valid token gives 0 and no valid token gives all zeros, where
  verl raises.
- REINFORCE++-baseline: flat groups (all valid rewards equal) and one-member groups centre to exactly 0 (as in
  `advantages.py`; verl keeps a one-member group's raw reward). verl then whitens over the batch, which shifts
  a flat group's zeros to `-mean / std`; by default we set them back to 0, so a flat group contributes no
  gradient (the house rule); `zero_flat_groups=False` keeps verl's shift. Rows with `valid` False get 0 and
  their tokens are excluded from the statistics whatever their mask.
- Functions are jit-friendly: `gamma`, `lam`, `clip` may be traced scalars; `group_size` is a static int.
"""
from __future__ import annotations

from typing import Optional

import jax
import jax.numpy as jnp

from rlkit.objectives.advantages import group_advantages

WHITEN_EPS = 1e-8
EXPLAINED_VAR_EPS = 1e-5  # verl's compute_data_metrics


def _float(x) -> jax.Array:
  x = jnp.asarray(x)
  return x.astype(jnp.promote_types(x.dtype, jnp.float32))


def _mask(mask) -> jax.Array:
  mask = jnp.asarray(mask).astype(bool)
  if mask.ndim != 2:
    raise ValueError(f"mask must be [N, T], got shape {mask.shape}.")
  return mask


def _reverse_scan(step, init, *arrays):
  """Runs `step(carry, per-column slices)` from the last column to the first; outputs stacked back to [N, T]."""
  _, out = jax.lax.scan(step, init, tuple(a.T for a in arrays), reverse=True)
  return out.T


def outcome_token_rewards(rewards: jax.Array, mask: jax.Array) -> jax.Array:
  """`[N] -> [N, T]`: each row's scalar reward on its last valid token (verl's `token_level_rewards` for
  outcome rewards), 0 elsewhere and on rows with no valid token. Add any per-token penalty to the result."""
  mask = _mask(mask)
  rewards = _float(rewards)
  if rewards.shape != mask.shape[:1]:
    raise ValueError(f"rewards must be [N] with N = {mask.shape[0]} rows, got shape {rewards.shape}.")
  width = mask.shape[1]
  last = width - 1 - jnp.argmax(mask[:, ::-1], axis=1)
  at_last = (jnp.arange(width)[None, :] == last[:, None]) & mask.any(axis=1, keepdims=True)
  return jnp.where(at_last, rewards[:, None], 0.0)


# Jitted: called eagerly (the advantage phase runs on the host's batch), `lax.scan` over a fresh closure would
# compile again at every call; under jit it is traced once per shape, with gamma and lambda traced values.
@jax.jit
def discounted_returns(token_rewards: jax.Array, mask: jax.Array, gamma=1.0) -> jax.Array:
  """`[N, T]` reward-to-go `G_t = r_t + gamma G_{next valid t}` on valid tokens, 0 off the mask."""
  mask = _mask(mask)
  rewards = jnp.where(mask, _float(token_rewards), 0.0)

  def step(running, x):
    r, m = x
    g = r + gamma * running
    return jnp.where(m, g, running), jnp.where(m, g, 0.0)

  return _reverse_scan(step, jnp.zeros(mask.shape[:1], rewards.dtype), rewards, mask)


@jax.jit
def gae(token_rewards: jax.Array, values: jax.Array, mask: jax.Array, gamma=1.0,
        lam=1.0) -> tuple[jax.Array, jax.Array]:
  """Generalised advantage estimation over the valid tokens (verl `compute_gae_advantage_return`, unwhitened).

  :param token_rewards: `[N, T]` per-token rewards (e.g. `outcome_token_rewards` minus a KL penalty).
  :param values: `[N, T]` critic values `V(s_t)` from the rollout; ignored off the mask.
  :param mask: `[N, T]` True on valid tokens.
  :returns: `(advantages, returns)`, both `[N, T]` and 0 off the mask; `returns = advantages + values`.
  """
  mask = _mask(mask)
  rewards = jnp.where(mask, _float(token_rewards), 0.0)
  values = jnp.where(mask, _float(values), 0.0)

  def step(carry, x):
    next_value, next_adv = carry
    r, v, m = x
    adv = r + gamma * next_value - v + gamma * lam * next_adv
    # A masked step passes the next valid step's value and advantage through unchanged.
    return (jnp.where(m, v, next_value), jnp.where(m, adv, next_adv)), jnp.where(m, adv, 0.0)

  zeros = jnp.zeros(mask.shape[:1], rewards.dtype)
  advantages = _reverse_scan(step, (zeros, zeros), rewards, values, mask)
  return advantages, jnp.where(mask, advantages + values, 0.0)


def masked_whiten(x: jax.Array, mask: jax.Array, shift_mean: bool = True, eps: float = WHITEN_EPS) -> jax.Array:
  """`(x - mean) / sqrt(var + eps)` with the mean and the unbiased variance over the mask (verl
  `masked_whiten`); `shift_mean=False` adds the mean back. 0 off the mask; a constant (or a single valid
  value, or none) gives exactly 0 (the mean when `shift_mean=False`)."""
  mask = jnp.asarray(mask).astype(bool)
  x = _float(x)
  n = mask.sum()
  mean = jnp.where(mask, x, 0.0).sum() / jnp.maximum(n, 1)
  centred = jnp.where(mask, x - mean, 0.0)
  var = jnp.square(centred).sum() / jnp.maximum(n - 1, 1)
  flat = ~(jnp.where(mask, x, -jnp.inf).max() > jnp.where(mask, x, jnp.inf).min())
  out = jnp.where(flat, 0.0, centred) * jax.lax.rsqrt(var + eps)
  if not shift_mean:
    out = out + mean
  return jnp.where(mask, out, 0.0)


def reinforce_pp_advantages(token_rewards: jax.Array, mask: jax.Array, gamma=1.0) -> jax.Array:
  """REINFORCE++ (verl `compute_reinforce_plus_plus_outcome_advantage`): whitened `discounted_returns`,
  `[N, T]`, statistics over the batch's valid tokens. The unwhitened returns are `discounted_returns(...)`."""
  return masked_whiten(discounted_returns(token_rewards, mask, gamma), mask)


def _flat_rows(rewards: jax.Array, group_size: int, valid: jax.Array) -> jax.Array:
  """[N] True on rows of groups whose valid rewards are all equal (or that have no valid row)."""
  r = rewards.reshape(-1, group_size)
  v = valid.reshape(r.shape)
  hi = jnp.where(v, r, -jnp.inf).max(axis=1)
  lo = jnp.where(v, r, jnp.inf).min(axis=1)
  return jnp.repeat(~(hi > lo), group_size)


def reinforce_pp_baseline_advantages(rewards: jax.Array, mask: jax.Array, group_size: int,
                                     valid: Optional[jax.Array] = None,
                                     zero_flat_groups: bool = True) -> jax.Array:
  """REINFORCE++-baseline (verl `compute_reinforce_plus_plus_baseline_outcome_advantage`).

  `R_i - mean of its group's valid rewards`, broadcast over row i's valid tokens, whitened over all valid
  tokens of the batch. See the module docstring for flat groups, one-member groups and `valid`.

  :param rewards: `[N]` outcome rewards, the G completions of a prompt in contiguous rows.
  :param mask: `[N, T]` True on valid tokens.
  :param group_size: G, a static int.
  :param valid: `[N]` bool, False on padding rows (None: all rows real).
  :param zero_flat_groups: set flat groups back to 0 after whitening (False: verl's shifted value).
  :returns: `[N, T]` advantages, 0 off the mask and on invalid rows.
  """
  mask = _mask(mask)
  rewards = _float(rewards)
  valid = jnp.ones(rewards.shape, bool) if valid is None else jnp.asarray(valid).astype(bool)
  centred = group_advantages("none", rewards, group_size, valid=valid)
  mask = mask & valid[:, None]
  advantages = masked_whiten(jnp.broadcast_to(centred[:, None], mask.shape), mask)
  if zero_flat_groups:
    advantages = jnp.where(_flat_rows(rewards, group_size, valid)[:, None], 0.0, advantages)
  return advantages


def clipped_value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array,
                       clip: Optional[float] = 0.5) -> tuple[jax.Array, dict[str, jax.Array]]:
  """PPO's clipped value loss per token (verl `compute_value_loss`, before its `agg_loss`).

  `0.5 * max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2)`; reduce it with `aggregation.aggregate`.
  `clip=None` turns clipping off (plain `0.5 (V - R)^2`); verl's `cliprange_value` default is 0.5.

  :param values: `[N, T]` current critic predictions (differentiated).
  :param old_values: `[N, T]` the rollout's values (no gradient).
  :param returns: `[N, T]` targets, e.g. `gae(...)[1]` (no gradient).
  :param mask: `[N, T]` True on valid tokens.
  :returns: `([N, T]` loss, 0 off the mask, `metrics)`, metrics local to these rows:
    `vf_clipfrac`  masked mean of tokens where the clipped term is the larger (its gradient is zero).
  """
  mask = _mask(mask)
  v = jnp.where(mask, values, 0.0)
  old = jnp.where(mask, jax.lax.stop_gradient(old_values), 0.0)
  target = jnp.where(mask, jax.lax.stop_gradient(returns), 0.0)
  unclipped = jnp.square(v - target)
  if clip is None:
    clipped = unclipped
  else:
    clipped = jnp.square(jnp.clip(v, old - clip, old + clip) - target)
  loss = 0.5 * jnp.maximum(unclipped, clipped)
  n = jnp.maximum(mask.sum(), 1)
  return jnp.where(mask, loss, 0.0), {"vf_clipfrac": jnp.where(mask, clipped > unclipped, False).sum() / n}


def explained_variance(values: jax.Array, returns: jax.Array, mask: jax.Array) -> jax.Array:
  """`1 - Var(R - V) / (Var(R) + 1e-5)` over valid tokens (verl's `critic/vf_explained_var`, logged with the
  rollout's values): 1 for a perfect critic, 0 for one that predicts the mean, negative for worse. A ratio of
  batch variances (ddof=1), so it is computed once on the whole batch, not summed over micro-batches."""
  mask = _mask(mask)
  n = jnp.maximum(mask.sum(), 1)

  def var(x):
    mean = jnp.where(mask, x, 0.0).sum() / n
    return jnp.where(mask, jnp.square(x - mean), 0.0).sum() / jnp.maximum(n - 1, 1)

  target = jnp.where(mask, returns, 0.0)
  return 1.0 - var(target - jnp.where(mask, values, 0.0)) / (var(target) + EXPLAINED_VAR_EPS)
