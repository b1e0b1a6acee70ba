"""Flow-policy RL (methods/embodied.md §6): the likelihoods a flow-matching action expert (rlkit/models/flow.py)
trains on through the shared update step, as policy adapters, and GAE.

ReinFlow (noise-injected chains; FOUND: github.com/ReinFlow/ReinFlow, model/flow/ft_ppo/ppoflow.py): a noise head
sigma_phi(a, s, obs), bounded to [sigma_min, sigma_max], turns the K-step Euler sampler into a Markov chain

  a^0 = eps ~ N(0, I),   a^{k+1} = a^k + u_theta(a^k, s_k, obs) / K + sigma_phi(a^k, s_k, obs) xi,   s_k = k / K

with the exact log-likelihood log N(a^0; 0, I) + sum_k log N(a^{k+1}; a^k + u / K, diag sigma^2), each term
summed over the chunk. The adapter (`reinflow_policy`) returns one column per denoising step, logp [N, K] (the
initial term, which no parameter changes, left out), so the shared PPO loss takes a ratio per step (DPPO's
reading) with the row's advantage on each, and a sequence-level loss their sum (ReinFlow's).

FPO (FOUND: arXiv 2507.21053): no likelihood; the ratio is exp(L_CFM(theta_old) - L_CFM(theta)) with the
conditional flow-matching loss averaged over draws (s_i, eps_i) taken once per sample and reused for both
parameter sets. The adapter (`fpo_policy`) returns logp [N, 1] = -L_CFM(theta) at the row's stored draws, so the
update's exp(logp - old_logp) is exactly that ratio (1 at theta = theta_old).

Rows (TrainBatch): one decision (an action chunk) each; extras["obs"] [N, O]; ReinFlow's extras["chain"]
[N, K + 1, H, A] (the sampled chain, its last entry the executed chunk); FPO's extras["actions"] [N, H, A] and
its draws extras["fpo_s"] [N, M], extras["fpo_eps"] [N, M, H, A].
"""
from __future__ import annotations

import dataclasses
import math
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

from rlkit.models.flow import FlowConfig, FlowExpert, cfm_loss, sinusoid
from rlkit.train.policy import PolicyAdapter

Array = jax.Array
LOG_2PI = math.log(2 * math.pi)


@dataclasses.dataclass(frozen=True)
class ChainConfig:
  steps: int = 4                # K Euler steps
  sigma_min: float = 0.05
  sigma_max: float = 0.3
  hidden: int = 64


class NoiseHead(nn.Module):
  """sigma_phi(a^k, s_k, obs) [B, H, A] in [sigma_min, sigma_max] (a sigmoid between the bounds)."""
  flow: FlowConfig
  chain: ChainConfig

  @nn.compact
  def __call__(self, a, s, obs):
    b = a.shape[0]
    x = jnp.concatenate([a.reshape(b, -1), obs, sinusoid(s, 16)], axis=-1)
    x = nn.swish(nn.Dense(self.chain.hidden, name="hidden")(x))
    z = nn.Dense(self.flow.horizon * self.flow.action_dim, name="out")(x).reshape(a.shape)
    return self.chain.sigma_min + (self.chain.sigma_max - self.chain.sigma_min) * jax.nn.sigmoid(z)


def init_reinflow(flow_params: Any, flow: FlowConfig, chain: ChainConfig, obs_dim: int, key: Array) -> dict:
  """{"flow": the expert's params (e.g. behaviour-cloned), "noise": a fresh noise head's}."""
  noise = NoiseHead(flow, chain).init(key, jnp.zeros((1, flow.horizon, flow.action_dim)), jnp.zeros((1,)),
                                      jnp.zeros((1, obs_dim)))["params"]
  return {"flow": flow_params, "noise": noise}


def _gaussian_logp(x: Array, mean: Array, sigma: Array) -> Array:
  """log N(x; mean, diag sigma^2) summed over the chunk's [H, A]."""
  z = (x - mean) / sigma
  return jnp.sum(-0.5 * z ** 2 - jnp.log(sigma) - 0.5 * LOG_2PI, axis=(-2, -1))


def _drift_and_sigma(params, flow: FlowConfig, chain: ChainConfig, a: Array, k: int, obs: Array):
  s = jnp.full((a.shape[0],), k / chain.steps)
  u = FlowExpert(flow).apply({"params": params["flow"]}, a, s, obs)
  sigma = NoiseHead(flow, chain).apply({"params": params["noise"]}, a, s, obs)
  return a + u / chain.steps, sigma


def reinflow_sample(params: dict, flow: FlowConfig, chain: ChainConfig, obs: Array, key: Array):
  """(action chunks [B, H, A], the chain [B, K + 1, H, A], per-step log-densities [B, K], the initial noise's
  log-density [B]) of one draw of the noise-injected chain (module docstring)."""
  k0, *ks = jax.random.split(key, chain.steps + 1)
  a = jax.random.normal(k0, (obs.shape[0], flow.horizon, flow.action_dim))
  initial = _gaussian_logp(a, jnp.zeros_like(a), jnp.ones_like(a))
  links, logps = [a], []
  for k in range(chain.steps):
    mean, sigma = _drift_and_sigma(params, flow, chain, a, k, obs)
    a = mean + sigma * jax.random.normal(ks[k], a.shape)
    links.append(a)
    logps.append(_gaussian_logp(a, mean, sigma))
  return a, jnp.stack(links, axis=1), jnp.stack(logps, axis=1), initial


def reinflow_logp(params: dict, flow: FlowConfig, chain: ChainConfig, obs: Array, links: Array) -> Array:
  """Per-step log-densities [B, K] of a recorded chain [B, K + 1, H, A] under `params`."""
  out = []
  for k in range(chain.steps):
    mean, sigma = _drift_and_sigma(params, flow, chain, links[:, k], k, obs)
    out.append(_gaussian_logp(links[:, k + 1], mean, sigma))
  return jnp.stack(out, axis=1)


def reinflow_policy(flow: FlowConfig, chain: ChainConfig) -> PolicyAdapter:
  """The ReinFlow chain as a policy adapter: logp [N, K] of extras["chain"] given extras["obs"]."""
  def forward(params, mb, keys):
    return reinflow_logp(params, flow, chain, mb.extras["obs"], mb.extras["chain"]), {}
  return PolicyAdapter("reinflow", forward)


def fpo_draws(key: Array, n: int, draws: int, flow: FlowConfig) -> tuple[Array, Array]:
  """FPO's per-sample draws: flow times s [n, M] uniform in [0, 1] and noises eps [n, M, H, A]."""
  ks, ke = jax.random.split(key)
  return (jax.random.uniform(ks, (n, draws)),
          jax.random.normal(ke, (n, draws, flow.horizon, flow.action_dim)))


def fpo_logp(params: Any, flow: FlowConfig, obs: Array, actions: Array, s: Array, eps: Array) -> Array:
  """-L_CFM(theta) [N] averaged over each row's M draws (module docstring)."""
  m = s.shape[1]
  flat = lambda x: x.reshape((-1,) + x.shape[2:])            # noqa: E731  [N, M, ...] -> [N M, ...]
  rep = lambda x: jnp.repeat(x, m, axis=0)                   # noqa: E731
  losses = cfm_loss(params, flow, rep(obs), rep(actions), flat(s), flat(eps))
  return -losses.reshape(-1, m).mean(axis=1)


def fpo_policy(flow: FlowConfig) -> PolicyAdapter:
  """FPO as a policy adapter: logp [N, 1] = -L_CFM(theta) at the row's stored draws."""
  def forward(params, mb, keys):
    e = mb.extras
    return fpo_logp(params, flow, e["obs"], e["actions"], e["fpo_s"], e["fpo_eps"])[:, None], {}
  return PolicyAdapter("fpo", forward)


def gae(rewards: Array, values: Array, dones: Array, last_value: Array, gamma: float, lam: float):
  """(advantages, returns) [T, ...] of generalised advantage estimation over time-major rewards, values and
  dones [T, ...] (a done step's successor is a fresh episode: no bootstrap across it) with the value of the
  state after the last step `last_value` [...]."""
  def back(carry, x):
    gae_next, value_next = carry
    r, v, d = x
    keep = 1.0 - d.astype(jnp.float32)
    delta = r + gamma * value_next * keep - v
    adv = delta + gamma * lam * keep * gae_next
    return (adv, v), adv
  _, adv = jax.lax.scan(back, (jnp.zeros_like(last_value), last_value), (rewards, values, dones), reverse=True)
  return adv, adv + values
