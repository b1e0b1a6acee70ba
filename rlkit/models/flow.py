"""A flow-matching action expert with explicit timestep modules (methods/embodied.md §2, §6): the policy of the
embodied stages, and the velocity network the generative stages share.

Time convention (one, everywhere in rlkit; methods/embodied.md's warning): s = 0 is noise, s = 1 is data,

  a_s = s a + (1 - s) eps,    u = a - eps  (the velocity target),    sampling integrates da/ds = v(a_s, s) from
  s = 0 (a_0 = eps ~ N(0, I)) up to s = 1.

Flow-GRPO / SD3 / openpi write x_t = (1 - t) x_0 + t eps with t = 1 noise: t = 1 - s and their v = -u
(`from_t_convention`). The network predicts u for an action chunk [H, A] given the observation (and a task
vector, concatenated to it):

  c   = time_mlp_out(swish(time_mlp_in(sinusoid(s))))                 the timestep module (pi0.5's time MLP)
  h   = action_in(flatten(a_s)) + obs_in(obs)
  per block i:  (scale, shift, gate) = modulation_i(swish(c))          adaLN-Zero: zero-initialised, so a fresh
                h = h + gate * MLP_i(rms(h) * (1 + scale) + shift)  block is the identity
  u   = action_out(rms(h) * (1 + scale_out) + shift_out)          with its own modulation_out

The timestep modules are the parameters under `time_mlp_in`, `time_mlp_out` and every `modulation*`
(TIMESTEP_MODULES, a regex over '/'-joined paths): what the update analysis groups (rlkit/embodied/analysis.py).
"""
from __future__ import annotations

import dataclasses
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp

Array = jax.Array
TIMESTEP_MODULES = r"(^|/)(time_mlp_in|time_mlp_out|modulation[^/]*)(/|$)"


@dataclasses.dataclass(frozen=True)
class FlowConfig:
  action_dim: int = 2
  horizon: int = 4             # H: actions per chunk
  hidden: int = 128
  blocks: int = 3
  time_dim: int = 64           # sinusoidal features of s, and the width of the time MLP
  mlp_ratio: int = 2


def sinusoid(s: Array, dim: int) -> Array:
  """[..., dim] sin/cos features of flow times s in [0, 1] (frequencies 1 .. 1000, geometric)."""
  freqs = jnp.exp(jnp.linspace(0.0, jnp.log(1000.0), dim // 2))
  angles = s[..., None] * freqs
  return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def rms_normalize(x: Array) -> Array:
  """x / RMS(x) over the features (no learned scale: the modulation supplies it)."""
  return x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + 1e-6)


class FlowExpert(nn.Module):
  """The velocity network u_theta(a_s, s, obs) [B, H, A] (module docstring)."""
  cfg: FlowConfig

  @nn.compact
  def __call__(self, a_s: Array, s: Array, obs: Array) -> Array:
    cfg = self.cfg
    b = a_s.shape[0]
    c = nn.Dense(cfg.time_dim, name="time_mlp_in")(sinusoid(s, cfg.time_dim))
    c = nn.swish(nn.Dense(cfg.time_dim, name="time_mlp_out")(nn.swish(c)))
    h = nn.Dense(cfg.hidden, name="action_in")(a_s.reshape(b, -1)) + nn.Dense(cfg.hidden, name="obs_in")(obs)
    zeros = nn.initializers.zeros
    for i in range(cfg.blocks):
      scale, shift, gate = jnp.split(nn.Dense(3 * cfg.hidden, kernel_init=zeros, name=f"modulation_{i}")(c), 3, -1)
      z = rms_normalize(h) * (1 + scale) + shift
      z = nn.Dense(cfg.hidden, name=f"mlp_{i}_out")(nn.swish(nn.Dense(cfg.mlp_ratio * cfg.hidden,
                                                                        name=f"mlp_{i}_in")(z)))
      h = h + gate * z
    scale, shift = jnp.split(nn.Dense(2 * cfg.hidden, kernel_init=zeros, name="modulation_out")(c), 2, -1)
    u = nn.Dense(cfg.horizon * cfg.action_dim, name="action_out")(rms_normalize(h) * (1 + scale) + shift)
    return u.reshape(b, cfg.horizon, cfg.action_dim)


def init_flow(cfg: FlowConfig, obs_dim: int, key: Array) -> Any:
  return FlowExpert(cfg).init(key, jnp.zeros((1, cfg.horizon, cfg.action_dim)), jnp.zeros((1,)),
                              jnp.zeros((1, obs_dim)))["params"]


def interpolate(a: Array, eps: Array, s: Array) -> Array:
  """a_s = s a + (1 - s) eps, s [B] broadcast over the chunk."""
  s = s.reshape(s.shape + (1,) * (a.ndim - s.ndim))
  return s * a + (1 - s) * eps


def from_t_convention(t: Array, v: Array) -> tuple[Array, Array]:
  """(s, u) of a time and velocity written in the t = 1 - s convention (Flow-GRPO, SD3, openpi)."""
  return 1.0 - t, -v


def cfm_loss(params: Any, cfg: FlowConfig, obs: Array, a: Array, s: Array, eps: Array) -> Array:
  """[B] conditional flow-matching loss ||u_theta(a_s, s, obs) - (a - eps)||^2, summed over the chunk, at the
  given (s, eps) draws (FPO reuses them for theta and theta_old)."""
  u = FlowExpert(cfg).apply({"params": params}, interpolate(a, eps, s), s, obs)
  return jnp.sum((u - (a - eps)) ** 2, axis=(-2, -1))


def sample(params: Any, cfg: FlowConfig, obs: Array, key: Array, steps: int, start: Array | None = None) -> Array:
  """Action chunks [B, H, A] by `steps` Euler steps of da/ds = u from a_0 = eps ~ N(0, I) (the deterministic
  sampler; the stochastic chains of RL live in rlkit/embodied), or from `start` (then `key` is unused: e.g. zeros,
  the noise's mean, for a chunk that is a function of the observation alone)."""
  model = FlowExpert(cfg)
  a = start if start is not None else jax.random.normal(key, (obs.shape[0], cfg.horizon, cfg.action_dim))
  ds = 1.0 / steps

  def one(a, k):
    s = jnp.full((obs.shape[0],), k * ds)
    return a + ds * model.apply({"params": params}, a, s, obs), None
  return jax.lax.scan(one, a, jnp.arange(steps))[0]
