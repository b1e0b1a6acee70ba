"""DRaFT-K (Clark et al. 2024, "Directly Fine-Tuning Diffusion Models on Differentiable Rewards"): sample with the
deterministic sampler and backpropagate a differentiable reward through the last K denoising steps only (the
earlier steps' output is a constant: stop_gradient), so memory and variance stay bounded; K = 1 is DRaFT-1,
K = 0 no gradient at all (the model is unchanged), K = steps full backpropagation (DRaFT without truncation).

  loss(theta) = -mean_b r(x^K_b),   x^{k+1} = x^k + u_theta(x^k, s_k, cond) / steps,   x^0 = eps

with every x^k for k < steps - K held constant.
"""
from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp

from rlkit.models.flow import FlowConfig, FlowExpert

Array = jax.Array


def draft_sample(params: Any, flow: FlowConfig, cond: Array, eps: Array, steps: int, k: int) -> Array:
  """The Euler sample from `eps` [B, H, A] with gradients through its last `k` steps only."""
  if not 0 <= k <= steps:
    raise ValueError(f"DRaFT-K: k={k} must be in [0, steps={steps}].")
  model = FlowExpert(flow)
  x = eps
  for i in range(steps):
    if i == steps - k:
      x = jax.lax.stop_gradient(x)
    u = model.apply({"params": params}, x, jnp.full((x.shape[0],), i / steps), cond)
    x = x + u / steps
  return jax.lax.stop_gradient(x) if k == 0 else x


def draft_loss(params: Any, flow: FlowConfig, cond: Array, eps: Array, steps: int, k: int,
               reward: Callable[[Array, Array], Array]) -> tuple[Array, dict]:
  """(-mean reward, {"reward"}) of the truncated-gradient sample; `reward(x, cond) -> [B]` differentiable."""
  r = reward(draft_sample(params, flow, cond, eps, steps, k), cond)
  return -jnp.mean(r), {"reward": jnp.mean(r)}
