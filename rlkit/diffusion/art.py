"""DiffusionART (OUR DESIGN, methods/embodied.md §1.2; KlingAI's method described, its paper not available to us):
aggregated reward-improving directions per prompt, and drift-adaptive restoration toward the reference. The pure
pieces; the stage composes them.

  directions   per prompt c: d_c = -grad_theta sum_i l_{c,i}(theta) with l the advantage-weighted flow-matching
               loss A_{c,i} FM(theta; x0_{c,i}, c, s, eps) (the same draws (s, eps) for every model evaluation)
  aggregate    d~_c = d_c / max(1, ||d_c|| / kappa) (no prompt dominates); optionally PCGrad (for c != c' with
               <d~_c, d~_c'> < 0, the projection on d~_c' removed from d~_c, against the unprojected ones);
               D = mean_c d~_c, which the optimizer then takes as a (negated) gradient
  drift        delta = E ||u_theta - u_ref||^2 / E ||u_ref||^2 on a fixed probe set (never the batch: a
               batch-dependent estimate triggers restorations by noise)
  restore      when delta > tau_hi or the reward gained per unit of drift h < h_min:
               alpha = clip(sqrt(tau_target / delta), alpha_min, 1) (delta grows ~ alpha^2 for small deltas),
               theta <- theta_ref + alpha (theta - theta_ref), Adam's moments m <- alpha m, v <- alpha^2 v
Group advantages are z-scores within a prompt's samples; a group whose rewards are all equal has advantage 0 and
is counted (`zero_groups`).
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import optax

from rlkit.models.flow import FlowConfig, FlowExpert, cfm_loss

Array = jax.Array


def group_advantage(rewards: Array, eps: float = 1e-6) -> tuple[Array, Array]:
  """(z-scored advantages [P, G] within each prompt's group, the number of groups with equal rewards)."""
  mean = rewards.mean(axis=1, keepdims=True)
  std = rewards.std(axis=1, keepdims=True)
  flat = std[:, 0] <= eps
  return jnp.where(std > eps, (rewards - mean) / jnp.maximum(std, eps), 0.0), jnp.sum(flat)


def prompt_directions(params: Any, flow: FlowConfig, cond: Array, x0: Array, adv: Array, s: Array,
                      eps: Array) -> Any:
  """Per-prompt directions d_c, stacked [P, ...] over the params, for samples x0 [P, G, H, A] of conditions
  cond [P, C] with advantages adv [P, G] at draws s [P, G], eps [P, G, H, A]."""
  def one(c, x, a, ss, e):
    def loss(p):
      g = x.shape[0]
      return jnp.sum(a * cfm_loss(p, flow, jnp.repeat(c[None], g, 0), x, ss, e))
    return jax.tree.map(jnp.negative, jax.grad(loss)(params))
  return jax.vmap(one)(cond, x0, adv, s, eps)


def _flat(tree: Any) -> Array:
  """[P, n] of stacked pytree leaves [P, ...]."""
  return jnp.concatenate([x.reshape(x.shape[0], -1) for x in jax.tree.leaves(tree)], axis=1)


def aggregate(directions: Any, kappa: float, pcgrad: bool = False) -> tuple[Any, dict]:
  """(D = the mean of the norm-capped (and optionally PCGrad-projected) per-prompt directions, {"clipped": the
  share of prompts capped, "conflicts": the share of prompt pairs with a negative inner product})."""
  flat = _flat(directions)
  norms = jnp.linalg.norm(flat, axis=1)
  scale = 1.0 / jnp.maximum(1.0, norms / kappa)
  capped = flat * scale[:, None]
  gram = capped @ capped.T
  p = capped.shape[0]
  off = ~jnp.eye(p, dtype=bool)
  conflicts = jnp.sum((gram < 0) & off) / jnp.maximum(p * (p - 1), 1)
  if pcgrad:
    sq = jnp.maximum(jnp.diag(gram), 1e-30)
    coef = jnp.where((gram < 0) & off, gram / sq[None, :], 0.0)         # coef[c, c'] = <d_c, d_c'> / |d_c'|^2
    capped = capped - coef @ capped
  mean = capped.mean(axis=0)
  out, start = [], 0
  leaves, treedef = jax.tree.flatten(directions)
  for leaf in leaves:
    size = leaf[0].size
    out.append(mean[start:start + size].reshape(leaf.shape[1:]))
    start += size
  return jax.tree.unflatten(treedef, out), {"clipped": jnp.mean(norms > kappa), "conflicts": conflicts}


def drift(params: Any, ref_params: Any, flow: FlowConfig, probe: dict) -> Array:
  """delta = E ||u_theta - u_ref||^2 / E ||u_ref||^2 on a fixed probe {"a_s", "s", "cond"}."""
  model = FlowExpert(flow)
  u = model.apply({"params": params}, probe["a_s"], probe["s"], probe["cond"])
  u_ref = model.apply({"params": ref_params}, probe["a_s"], probe["s"], probe["cond"])
  return jnp.sum((u - u_ref) ** 2) / jnp.maximum(jnp.sum(u_ref ** 2), 1e-12)


def restoration_alpha(delta: float, gain_per_drift: float, tau_hi: float, tau_target: float, h_min: float,
                      alpha_min: float) -> float:
  """The restoration's alpha (module docstring), or 1.0 (no restoration) when neither trigger fires."""
  if delta <= tau_hi and gain_per_drift >= h_min:
    return 1.0
  return float(min(max((tau_target / max(delta, 1e-12)) ** 0.5, alpha_min), 1.0))


def _scale_adam(state: Any, alpha: float) -> Any:
  """An optax state with every ScaleByAdamState's mu scaled by alpha and nu by alpha^2 (nested chains too)."""
  if isinstance(state, optax.ScaleByAdamState):
    return state._replace(mu=jax.tree.map(lambda m: alpha * m, state.mu),
                          nu=jax.tree.map(lambda v: alpha ** 2 * v, state.nu))
  if isinstance(state, tuple) and not hasattr(state, "_fields"):
    return tuple(_scale_adam(s, alpha) for s in state)
  if hasattr(state, "_fields"):
    return state._replace(**{f: _scale_adam(getattr(state, f), alpha) for f in state._fields})
  if isinstance(state, dict):
    return {k: _scale_adam(v, alpha) for k, v in state.items()}
  return state


def restore(params: Any, ref_params: Any, opt_state: Any, alpha: float) -> tuple[Any, Any]:
  """(theta_ref + alpha (theta - theta_ref), the optimizer state with Adam's moments rescaled): alpha = 1 is the
  identity."""
  if alpha == 1.0:
    return params, opt_state
  new = jax.tree.map(lambda p, r: r + alpha * (p - r), params, ref_params)
  return new, _scale_adam(opt_state, alpha)
