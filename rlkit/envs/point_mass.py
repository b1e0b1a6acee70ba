"""A point mass on a plane: the tiny analytic environment of the tests and quick experiments.

  v' = v + dt (force - damping v),   x' = x + dt v'        (semi-implicit Euler, unit mass)
  force = action_gain * clip(action, -1, 1) + drift         (rlkit/envs/core.py)

With damping 0 and a constant force f from rest at x0, after n steps x_n = x0 + dt^2 f n (n + 1) / 2, which the
tests check. Observation: position, velocity, goal - position ([6]). The start is uniform in the square
[-start_range, start_range]^2, at rest.
"""
from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from rlkit.envs.core import ENVS, Env, EnvParams, Progress

Array = jax.Array


@flax.struct.dataclass
class PointMassState:
  pos: Array       # [2]
  vel: Array       # [2]
  progress: Progress


class PointMass(Env):
  name = "point_mass"
  action_dim = 2
  obs_dim = 6

  def __init__(self, dt: float = 0.1, damping: float = 0.5, start_range: float = 1.0):
    self.dt, self.damping, self.start_range = dt, damping, start_range

  def default_params(self) -> EnvParams:
    return EnvParams(goal_center=jnp.zeros(2, jnp.float32), goal_spread=0.5, goal_radius=0.05, hold_steps=1,
                     action_gain=1.0, drift=jnp.zeros(2, jnp.float32), ctrl_cost=0.01, max_steps=50)

  def _reset(self, key, params, progress):
    pos = jax.random.uniform(key, (2,), minval=-self.start_range, maxval=self.start_range)
    return PointMassState(pos, jnp.zeros(2, jnp.float32), progress)

  def _advance(self, state, force, params):
    vel = state.vel + self.dt * (force - self.damping * state.vel)
    return state.replace(pos=state.pos + self.dt * vel, vel=vel)

  def _observe(self, state, params):
    return jnp.concatenate([state.pos, state.vel, state.progress.goal - state.pos])

  def effector(self, state):
    return state.pos

  def scripted(self, obs: Array) -> Array:
    """A PD controller toward the goal from the observation (blind to the drift): demonstrations for BC."""
    return jnp.clip(4.0 * obs[..., 4:6] - 2.0 * obs[..., 2:4], -1.0, 1.0)


ENVS.add("point_mass", PointMass)
