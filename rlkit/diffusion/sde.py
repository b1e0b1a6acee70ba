"""Flow-GRPO's stochastic sampler for a flow-matching generator: the ODE da/ds = u turned into an SDE with the same
marginals, so each denoising step is a Gaussian whose log-density the policy gradient needs (Flow-GRPO, Liu et al.
2025; DanceGRPO samples the same way).

rlkit's time runs from s = 0 (noise) to s = 1 (data) with u = a - eps (rlkit/models/flow.py); the papers write
t = 1 - s and v = -u. Their Euler-Maruyama step from t to t + dt (dt < 0),

  x' = x + [v + sigma_t^2 / (2t) (x + (1 - t) v)] dt + sigma_t sqrt(-dt) eps,   sigma_t = a sqrt(t / (1 - t)),

is, from s to s + ds in our convention,

  x' = x (1 - sigma^2 ds / (2 (1 - s))) + u ds (1 + sigma^2 s / (2 (1 - s))) + sigma sqrt(ds) eps,
  sigma = a sqrt((1 - s) / s),

where `a` is the noise level (the release's `noise_level`, 0.7 by default). sigma is infinite at s = 0: there the
release puts the next grid point's s in the denominator, and so does `sigma_at`. With a = 0 the step is the
deterministic Euler step of `rlkit.models.flow.sample`.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def sigma_at(s: Array, ds: Array, noise_level: float) -> Array:
  """sigma = a sqrt((1 - s) / s), with s no smaller than the step ds (the release's rule at s = 0)."""
  return noise_level * jnp.sqrt((1.0 - s) / jnp.maximum(s, ds))


def step_moments(x: Array, u: Array, s: Array, ds: Array, noise_level: float) -> tuple[Array, Array]:
  """(mean, std) of the Gaussian step from x at time s with velocity u (module docstring); s, ds broadcast."""
  sig = sigma_at(s, ds, noise_level)
  mean = x * (1.0 - sig ** 2 * ds / (2.0 * (1.0 - s))) + u * ds * (1.0 + sig ** 2 * s / (2.0 * (1.0 - s)))
  return mean, sig * jnp.sqrt(ds)


def gaussian_logp(x: Array, mean: Array, std: Array, event_dims: int) -> Array:
  """log N(x; mean, std^2 I) summed over the last `event_dims` axes."""
  z = (x - mean) / std
  lp = -0.5 * z ** 2 - jnp.log(std) - 0.5 * jnp.log(2 * jnp.pi)
  return jnp.sum(lp, axis=tuple(range(-event_dims, 0)))


def sde_step(x: Array, u: Array, s: Array, ds: Array, noise_level: float, eps: Array,
             event_dims: int) -> tuple[Array, Array]:
  """(the next sample, its log-density under the step) for standard normal `eps` of x's shape."""
  mean, std = step_moments(x, u, s, ds, noise_level)
  nxt = mean + std * eps
  return nxt, gaussian_logp(nxt, mean, std, event_dims)
