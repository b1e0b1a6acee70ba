"""OnePO, "guidance that retires" (OUR DESIGN, methods/llm.md §7): a teacher's answers join a group only
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
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

DEFAULT_EPS = 1e-6


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
