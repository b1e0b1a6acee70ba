"""DiffusionNFT (Zheng et al. 2025, arXiv 2509.16117; negative-aware fine-tuning on the forward process): no
likelihoods and no sampling trajectories. A generated sample x0 with reward-derived optimality r in [0, 1] is
noised afresh, a_s = s x0 + (1 - s) eps (rlkit's convention, rlkit/models/flow.py), and the velocity network is
trained through two implicit policies around the sampling (old) one:

  u+ = beta u_theta + (1 - beta) u_old          (the positive policy)
  u- = (1 + beta) u_old - beta u_theta          (the implicit negative policy: the reflection of u+ in u_old)
  x0_hat(u) = a_s + (1 - s) u                   (the data prediction of a velocity)
  L+- = ||x0_hat(u+-) - x0||^2 / w+-,   w+- = stop_gradient(mean |x0_hat(u+-) - x0|), at least 1e-5
  loss = mean_b [ r L+ + (1 - r) L- ] / beta,   r = clip(A / A_max / 2 + 1/2, 0, 1)

so positive samples pull the model toward them and negative ones push it away, and a sample with r = 1/2 (zero
advantage) gives no gradient at theta = theta_old. The adaptive weights w and the advantage-to-r map follow the
public implementations (e.g. X-GenGroup/Flow-Factory's trainer), read, not copied.
"""
from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from rlkit.models.flow import FlowConfig, FlowExpert, interpolate

Array = jax.Array


def optimality(advantages: Array, adv_max: float) -> Array:
  """r = clip(A / adv_max / 2 + 1/2, 0, 1): a group advantage as the probability that the sample is positive."""
  return jnp.clip(jnp.clip(advantages, -adv_max, adv_max) / adv_max / 2.0 + 0.5, 0.0, 1.0)


def nft_loss(params: Any, old_params: Any, flow: FlowConfig, cond: Array, x0: Array, r: Array, s: Array,
             eps: Array, beta: float) -> tuple[Array, dict]:
  """(DiffusionNFT's loss, {"positive", "negative"}) for samples x0 [B, H, A] with optimality r [B] at draws
  (s [B], eps [B, H, A]) (module docstring)."""
  model = FlowExpert(flow)
  a_s = interpolate(x0, eps, s)
  u = model.apply({"params": params}, a_s, s, cond)
  u_old = jax.lax.stop_gradient(model.apply({"params": old_params}, a_s, s, cond))
  gap = (1.0 - s)[:, None, None]

  def weighted(v):
    err = a_s + gap * v - x0
    w = jax.lax.stop_gradient(jnp.maximum(jnp.mean(jnp.abs(err), axis=(-2, -1)), 1e-5))
    return jnp.mean(err ** 2, axis=(-2, -1)) / w
  pos = weighted(beta * u + (1.0 - beta) * u_old)
  neg = weighted((1.0 + beta) * u_old - beta * u)
  return jnp.mean(r * pos + (1.0 - r) * neg) / beta, {"positive": jnp.mean(pos), "negative": jnp.mean(neg)}
