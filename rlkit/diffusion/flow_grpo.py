"""Flow-GRPO's policy for a flow-matching generator (Liu et al. 2025; DanceGRPO samples the same way): K steps of
the marginal-preserving SDE (rlkit/diffusion/sde.py) from x^0 = eps, each a Gaussian whose log-density is one
column of the policy's log-likelihood, so the shared GRPO / PPO loss takes a clipped ratio per denoising step
with the sample's group advantage on each (the release's per-step ratio).

The generator is rlkit/models/flow.py's network with its observation input as the condition (a class one-hot or
a prompt embedding): samples are [B, H, A] (a point in the plane: H = 1, A = 2; an 8x8 image: H = 1, A = 64).

Rows (TrainBatch): one sample each; extras["cond"] [N, C]; extras["chain"] [N, K + 1, H, A] (the sampled chain,
its last entry the sample).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

from rlkit.diffusion.sde import gaussian_logp, step_moments
from rlkit.models.flow import FlowConfig, FlowExpert
from rlkit.train.policy import PolicyAdapter

Array = jax.Array


@dataclasses.dataclass(frozen=True)
class SdeConfig:
  steps: int = 10               # K denoising steps, s_k = k / K
  noise_level: float = 0.7      # a: the SDE's noise scale (0: the deterministic Euler sampler, which has no density)


def _moments(params: Any, flow: FlowConfig, sde: SdeConfig, x: Array, k: int, cond: Array):
  ds = 1.0 / sde.steps
  s = k * ds
  u = FlowExpert(flow).apply({"params": params}, x, jnp.full((x.shape[0],), s), cond)
  return step_moments(x, u, s, ds, sde.noise_level)


def sde_sample(params: Any, flow: FlowConfig, sde: SdeConfig, cond: Array, key: Array):
  """(samples [B, H, A], the chain [B, K + 1, H, A], per-step log-densities [B, K]) of one draw."""
  k0, *ks = jax.random.split(key, sde.steps + 1)
  x = jax.random.normal(k0, (cond.shape[0], flow.horizon, flow.action_dim))
  links, logps = [x], []
  for k in range(sde.steps):
    mean, std = _moments(params, flow, sde, x, k, cond)
    x = mean + std * jax.random.normal(ks[k], x.shape)
    links.append(x)
    logps.append(gaussian_logp(x, mean, std, 2))
  return x, jnp.stack(links, axis=1), jnp.stack(logps, axis=1)


def sde_logp(params: Any, flow: FlowConfig, sde: SdeConfig, cond: Array, chain: Array) -> Array:
  """Per-step log-densities [B, K] of a recorded chain [B, K + 1, H, A] under `params`."""
  out = []
  for k in range(sde.steps):
    mean, std = _moments(params, flow, sde, chain[:, k], k, cond)
    out.append(gaussian_logp(chain[:, k + 1], mean, std, 2))
  return jnp.stack(out, axis=1)


def flow_grpo_policy(flow: FlowConfig, sde: SdeConfig) -> PolicyAdapter:
  """The SDE chain as a policy adapter: logp [N, K] of extras["chain"] given extras["cond"]."""
  def forward(params, mb, keys):
    return sde_logp(params, flow, sde, mb.extras["cond"], mb.extras["chain"]), {}
  return PolicyAdapter("flow_grpo", forward)
