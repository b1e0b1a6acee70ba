"""ACoB (methods/embodied.md §3; DESIGN, the paper not available to us; VLA-Precision's released code, scy-v/
VLA-Precision, is named in primary-sources.md and not yet compared): value calibration in stages, with gates, before
reference-regularised actor updates, so online RL of a flow policy does not first unlearn its reference.

Chunk-level values (a decision takes an action chunk of H steps; its reward is the chunk's discounted sum
r_c = sum_h gamma^h r_h, and the next decision is gamma^H away):
  `mc_returns`        G_t = r_c,t + gamma^H G_{t+1}, restarting at episode ends: stage 1 regresses Q(s, a_ref) and
                      V(s) on the reference policy's own returns
  `chunk_td_target`   y = r_c + gamma^H (1 - done) Q'(s', a'): stage 2's chunked TD, with the Cal-QL-style floor
                      `calibrated_target` = max(y, G_ref) on the reference's transitions (a value never below what the
                      reference is known to earn)
  `calibration_gate`  the gate to stage 3 on held-out transitions: TD error < eps_td, |Q(s, a_ref) - G| < eps_cal,
                      and the AUC of Q at telling chunks of eventually successful episodes from failed ones >= auc_min
Stage 3, the actor (a flow expert, rlkit/models/flow.py):
  `weights`           w = min(exp(A / lam), w_max) with A = Q(s, a) - V(s) (or binary 1[A > 0])
  `actor_loss`        mean_i w_i CFM_i(theta) + beta D_ref,   D_ref = mean ||v_theta - v_ref||^2 at shared (s, eps)
                      (the per-step KL of the two flows under a fixed-sigma SDE, up to a constant)
  `dual_update`       beta <- clip(beta + eta (D_ref - D_max), 0, beta_max): dual ascent on the drift budget
  `tripwire`          roll back to the last good actor and halve its rate when evaluation success falls below the
                      reference's minus a margin
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.models.flow import FlowConfig, FlowExpert, cfm_loss, interpolate

Array = jax.Array


def chunk_rewards(rewards: Array, gamma: float) -> Array:
  """r_c = sum_h gamma^h r_h over the chunk axis (last) of rewards [..., H]."""
  h = rewards.shape[-1]
  return jnp.sum(rewards * gamma ** jnp.arange(h, dtype=jnp.float32), axis=-1)


def mc_returns(chunk_reward: Array, dones: Array, gamma: float, horizon: int) -> Array:
  """Monte-Carlo returns [T, ...] of time-major chunk rewards and dones (a done decision ends its episode), with
  gamma^H between decisions. A trajectory cut before its episode ends counts nothing past the cut (the caller
  drops or masks those decisions when it needs unbiased targets)."""
  discount = gamma ** horizon

  def back(g_next, x):
    r, d = x
    g = r + discount * (1.0 - d.astype(jnp.float32)) * g_next
    return g, g
  _, g = jax.lax.scan(back, jnp.zeros_like(chunk_reward[0]), (chunk_reward, dones), reverse=True)
  return g


def chunk_td_target(chunk_reward: Array, q_next: Array, done: Array, gamma: float, horizon: int) -> Array:
  """y = r_c + gamma^H (1 - done) Q'(s', a')."""
  return chunk_reward + gamma ** horizon * (1.0 - done.astype(jnp.float32)) * q_next


def calibrated_target(target: Array, reference_return: Array, is_reference: Array) -> Array:
  """The Cal-QL-style floor: max(target, G_ref) on the reference policy's transitions, the target elsewhere."""
  return jnp.where(is_reference, jnp.maximum(target, reference_return), target)


def auc(scores, labels) -> float:
  """The area under the ROC curve of `scores` ranking positive `labels` above negative ones (ties count half);
  NaN without both classes."""
  s, y = np.asarray(scores, np.float64), np.asarray(labels, bool)
  pos, neg = s[y], s[~y]
  if not pos.size or not neg.size:
    return float("nan")
  greater = (pos[:, None] > neg[None, :]).mean()
  ties = (pos[:, None] == neg[None, :]).mean()
  return float(greater + 0.5 * ties)


def calibration_gate(td_error: float, calibration_error: float, success_auc: float, eps_td: float, eps_cal: float,
                     auc_min: float) -> dict:
  """{passed, and each check's value and outcome} of the gate to stage 3 (module docstring); NaN fails."""
  checks = {"td_error": (td_error, td_error < eps_td), "calibration_error": (calibration_error,
                                                                             calibration_error < eps_cal),
            "success_auc": (success_auc, success_auc >= auc_min)}
  return {"passed": all(ok for _, ok in checks.values()),
          **{name: {"value": float(v), "passed": bool(ok)} for name, (v, ok) in checks.items()}}


def weights(advantage: Array, lam: float, w_max: float, binary: bool = False) -> Array:
  """w = min(exp(A / lam), w_max), or 1[A > 0] (`binary`): the actor's advantage weights (no gradient)."""
  w = (advantage > 0).astype(jnp.float32) if binary else jnp.minimum(jnp.exp(advantage / lam), w_max)
  return jax.lax.stop_gradient(w)


def reference_distance(params: Any, ref_params: Any, cfg: FlowConfig, obs: Array, s: Array, eps: Array,
                       actions: Array) -> Array:
  """D_ref [B]: ||v_theta(x_s, s, obs) - v_ref(x_s, s, obs)||^2 at the interpolants of `actions` with noises `eps`
  at times `s` (the same draws for both)."""
  x = interpolate(actions, eps, s)
  model = FlowExpert(cfg)
  diff = model.apply({"params": params}, x, s, obs) - model.apply({"params": ref_params}, x, s, obs)
  return jnp.sum(diff ** 2, axis=(-2, -1))


def actor_loss(params: Any, ref_params: Any, cfg: FlowConfig, batch: dict, beta: Array) -> tuple[Array, dict]:
  """mean_i w_i CFM_i + beta mean D_ref (module docstring); batch: obs, actions, weights, s, eps ([B] / [B, H, A])."""
  fm = cfm_loss(params, cfg, batch["obs"], batch["actions"], batch["s"], batch["eps"])
  d_ref = reference_distance(params, ref_params, cfg, batch["obs"], batch["s"], batch["eps"], batch["actions"])
  w = batch["weights"]
  loss = jnp.sum(w * fm) / jnp.maximum(jnp.sum(w), 1e-8) + beta * jnp.mean(d_ref)
  return loss, {"acob/weighted_fm": jnp.sum(w * fm) / jnp.maximum(jnp.sum(w), 1e-8), "acob/d_ref": jnp.mean(d_ref)}


def dual_update(beta: float, d_ref: float, d_max: float, lr: float, beta_max: float) -> float:
  """beta <- clip(beta + lr (D_ref - D_max), 0, beta_max)."""
  return float(min(max(beta + lr * (d_ref - d_max), 0.0), beta_max))


def tripwire(success: float, reference_success: float, margin: float) -> bool:
  """True when evaluation success fell below the reference's minus `margin`: roll back and halve the rate."""
  return success < reference_success - margin
