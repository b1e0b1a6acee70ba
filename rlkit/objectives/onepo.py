"""OnePO's maths, in two named variants selected by `rl.onepo.rule` (rlkit/train/onepo.py): our design and
HuatuoGPT-3's released rule.

`guidance` (OUR DESIGN, methods/llm.md §7, "guidance that retires"): a teacher's answers join a group only
while the policy cannot solve it, with a weight annealed to zero, so the run ends as plain GRPO.

  alpha(t)   = alpha0 * max(0, 1 - t / T_anneal)          the teacher rows' loss weight at stage step t
  guided     = the group's on-policy accuracy <= max_accuracy (0: all-fail groups only)
  advantages over the union of a group's policy and teacher rows (LUFFY's mixed group):
      A_i = (r_i - b) / (std_union + eps),  b = mean over the union (LUFFY) or over the policy rows only
  teacher-row token objective (LUFFY's policy shaping; no behaviour probability is needed):
      l_t = -A * f(pi(y_t)),   f(p) = p / (p + gamma)

Why the baseline option excludes teacher rows from the *mean* and not the std: in an all-fail group (the case
guidance exists for) the policy rows' rewards are all equal, so their std is 0 and a std over them alone
would divide by zero; a union baseline instead pushes every policy row of the group down by the teacher's
success (the "entropy collapse" pitfall of §7). With `teacher_in_baseline=False` policy rows of an all-fail
group keep advantage exactly 0 and only the teacher row is pushed up.

`f(p) = p/(p+gamma)` has gradient `gamma / (p+gamma)^2 * p * grad log p`: near 1/gamma times the SFT gradient
for unlikely teacher tokens (where imitation is needed) and vanishing for tokens the policy already
produces, unlike a clipped ratio, which would zero them.

`huatuo` (the RELEASED RULE of HuatuoGPT-3's OnePO, FreedomIntelligence/HuatuoGPT-3 `onepo/`, read and
re-implemented from its description; methods/primary-sources.md):

  replace    a teacher response replaces AT MOST ONE rollout of a prompt's group, chosen uniformly, and only
             when its reward is STRICTLY above every student reward of that group (the "reward frontier");
             otherwise the group is unchanged. The group keeps its size; its advantages are plain GRPO's.
  floor      on teacher tokens the ratio's denominator is floored: rho_t = pi(y_t) / max(pi_old(y_t), floor)
             (floor 0.1). On a low-support token (pi_old < floor) with A > 0 the advantage is also rescaled by
             floor / sg(pi(y_t)), so that token's gradient is A * grad log pi(y_t), as if its ratio were 1,
             until pi rises past floor * (1 + eps_high), where the clip stops it. With A <= 0 only the
             denominator is floored: the ratio pi/floor is below 1 - eps_low while pi < floor (1 - eps_low), where
             PPO's pessimistic clip leaves no gradient, so an unlikely teacher token is not pushed further down.
             The clipped surrogate itself (clip ranges, dual clip, aggregation) is the ordinary PPO one
             (`ppo_clip`). With one update per batch (old = current) and A > 0 the gradient is A grad log pi
             whatever the floor: the floor acts on later updates of the same batch and on A <= 0.
  retire     the teacher is phased out: per group by the frontier rule itself (as the policy's best answer
             reaches the teacher's, the teacher stops entering), and globally by a schedule (`retirement`).

What follows the release and what is ours in `huatuo`: the frontier rule (strict >, one replacement, a uniform
index), the floor and the positive-advantage rescale, and a hard step cutoff (`retire="cutoff"`, the release's
`teacher_max_steps`; off there by default) follow the release. Ours: the cutoff counts stage steps from 0 (the
teacher enters at steps t < T); `retire="linear"` (each group offered the teacher with probability
1 - t / T) is our option, not the release's; the release's optional plateau stop (the teacher retires once the
share of groups it no longer beats stays high for a window) is not implemented; the release trains with DAPO's
dynamic sampling after the replacement, where rlkit filters before augmenting (`rl.filter` runs first), so a
`huatuo` recipe runs without a filter.
"""
from __future__ import annotations

import math
from typing import Callable, Optional

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.core.registry import Registry
from rlkit.objectives.policy_losses import ppo_clip_loss

DEFAULT_EPS = 1e-6
DEFAULT_FLOOR = 0.1          # the release's probability floor


def anneal(step: int, alpha0: float, anneal_steps: int) -> float:
  """alpha0 * max(0, 1 - step / anneal_steps); 0 at every step when anneal_steps == 0 (guidance off)."""
  if anneal_steps <= 0:
    return 0.0
  return float(alpha0) * max(0.0, 1.0 - step / anneal_steps)


def mixed_group_advantages(rewards: jax.Array, teacher: jax.Array, valid: jax.Array, group_size: int,
                           teacher_in_baseline: bool = True, eps: float = DEFAULT_EPS) -> jax.Array:
  """[N] advantages of groups of `group_size` contiguous rows holding policy and teacher rows.

  :param rewards: `[N]`.
  :param teacher: `[N]` bool, True on teacher rows.
  :param valid: `[N]` bool, False on padding rows (advantage 0, in no statistic).
  :param teacher_in_baseline: True: the baseline is the mean over the union (LUFFY); False: over the group's
    valid policy rows only. The std is the union's (ddof=1) either way.
  :returns: `[N]` float32; 0 on padding rows and in groups whose valid rewards are all equal.
  """
  r = jnp.asarray(rewards, jnp.float32).reshape(-1, group_size)
  v = jnp.asarray(valid, bool).reshape(r.shape)
  base = v & ~jnp.asarray(teacher, bool).reshape(r.shape) if not teacher_in_baseline else v
  n = v.sum(1, keepdims=True)
  mean = jnp.where(v, r, 0.0).sum(1, keepdims=True) / jnp.maximum(n, 1)
  std = jnp.sqrt(jnp.where(v, jnp.square(r - mean), 0.0).sum(1, keepdims=True) / jnp.maximum(n - 1, 1))
  nb = base.sum(1, keepdims=True)
  baseline = jnp.where(nb > 0, jnp.where(base, r, 0.0).sum(1, keepdims=True) / jnp.maximum(nb, 1), mean)
  hi = jnp.where(v, r, -jnp.inf).max(1, keepdims=True)
  lo = jnp.where(v, r, jnp.inf).min(1, keepdims=True)
  adv = (r - baseline) / (std + eps)
  return jnp.where(v & (hi > lo), adv, 0.0).reshape(-1)


def shaped_offpolicy_loss(logp: jax.Array, advantages: jax.Array, mask: jax.Array, gamma: float = 0.1) -> jax.Array:
  """Per-token `-A * p / (p + gamma)`, `p = exp(logp)` (differentiated through logp), 0 off `mask`. [N, T]."""
  p = jnp.exp(jnp.where(mask, logp, 0.0))
  return jnp.where(mask, -jax.lax.stop_gradient(advantages) * p / (p + gamma), 0.0)


# ------------------------------------------------------------------------------------------------- huatuo

# retirement kind -> p(step, horizon): the probability that a group is offered the teacher at stage step `step`
# (`onepo.retire`); horizon <= 0 offers it never (guidance off).
RETIREMENTS: Registry[Callable[[int, int], float]] = Registry("onepo retirement")


@RETIREMENTS.register("cutoff")
def cutoff(step: int, horizon: int) -> float:
  """1 while step < horizon, then 0: the release's `teacher_max_steps`, a hard stop."""
  return 1.0 if step < horizon else 0.0


@RETIREMENTS.register("linear")
def linear(step: int, horizon: int) -> float:
  """max(0, 1 - step / horizon) (OUR option): the share of groups offered the teacher falls linearly."""
  return max(0.0, 1.0 - step / horizon) if horizon > 0 else 0.0


def frontier(teacher_rewards: np.ndarray, rewards: np.ndarray, offered: Optional[np.ndarray] = None) -> np.ndarray:
  """[groups] bool: where the teacher's reward is finite and STRICTLY above every student reward of its group.

  :param teacher_rewards: `[groups]` one teacher response's reward per group.
  :param rewards: `[groups, G]` the students' rewards.
  :param offered: `[groups]` bool, the groups the retirement schedule offers the teacher (default: all).
  """
  teacher = np.asarray(teacher_rewards, np.float64)
  rewards = np.asarray(rewards, np.float64)
  if not np.isfinite(rewards).all():
    raise ValueError("frontier: student rewards must be finite (a reward that failed should be a number).")
  beats = np.isfinite(teacher) & (teacher > rewards.max(1))
  return beats if offered is None else beats & np.asarray(offered, bool)


def replacement_order(num_rows: int, group_size: int, replace: np.ndarray, pick: np.ndarray) -> np.ndarray:
  """[num_rows] indices into `concat(rows, teacher rows)` (one teacher row per group, after the `num_rows`
  rows): row `g * group_size + pick[g]` becomes teacher row `num_rows + g` where `replace[g]`, every other row
  stays itself. So a group holds at most one teacher row and keeps its size."""
  order = np.arange(num_rows)
  groups = np.flatnonzero(np.asarray(replace, bool))
  pick = np.asarray(pick, np.int64)
  if np.any((pick < 0) | (pick >= group_size)):
    raise ValueError(f"replacement_order: picks must lie in [0, {group_size}), got {pick}.")
  order[groups * group_size + pick[groups]] = num_rows + groups
  return order


def floored_teacher_loss(logp: jax.Array, old_logp: jax.Array, advantages: jax.Array, mask: jax.Array,
                         floor: float = DEFAULT_FLOOR, eps_low: float = 0.2, eps_high: float = 0.2,
                         dual_clip: Optional[float] = None) -> tuple[jax.Array, dict[str, jax.Array]]:
  """The release's teacher-token surrogate: `ppo_clip` with the ratio's denominator floored and, on
  low-support tokens with a positive advantage, the advantage rescaled by floor / sg(pi) (module docstring).

  :param logp: `[N, T]` the policy's log-probs of the teacher tokens (differentiated).
  :param old_logp: `[N, T]` the trainer's log-probs of them before the update (no gradient).
  :param advantages: `[N]` or `[N, T]` (no gradient).
  :param mask: `[N, T]` True on the teacher tokens to train (the teacher rows' loss mask).
  :returns: `([N, T]` loss, 0 off the mask, `metrics)`: `ppo_clip`'s, plus `low_support_frac` (tokens with
    pi_old < floor) and `rescaled_frac` (those with A > 0, whose advantage was rescaled), masked means.
  """
  if not 0.0 < floor < 1.0:
    raise ValueError(f"floored_teacher_loss: floor must be in (0, 1), got {floor}.")
  mask = jnp.asarray(mask).astype(bool)
  log_floor = math.log(floor)
  old = jax.lax.stop_gradient(old_logp)
  adv = jax.lax.stop_gradient(jnp.asarray(advantages)).astype(logp.dtype)
  adv = jnp.broadcast_to(adv[:, None] if adv.ndim == 1 else adv, logp.shape)
  low = mask & (old < log_floor)
  rescaled = low & (adv > 0)
  p = jnp.exp(jax.lax.stop_gradient(jnp.where(mask, logp, 0.0)))
  effective = adv * jnp.where(rescaled, floor / jnp.maximum(p, jnp.finfo(logp.dtype).tiny), 1.0)
  loss, metrics = ppo_clip_loss(logp, jnp.maximum(old, log_floor), effective, mask, eps_low=eps_low,
                                eps_high=eps_high, dual_clip=dual_clip)
  count = jnp.maximum(mask.sum(), 1)
  return loss, {**metrics, "low_support_frac": low.sum() / count, "rescaled_frac": rescaled.sum() / count}
