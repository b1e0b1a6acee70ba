"""Episodes of a chunked policy on a control environment (rlkit/envs): scripted demonstrations for behaviour
cloning and the evaluation every embodied stage reports.

A chunked policy maps observations [E, O] to action chunks [E, H, A]; the environment then takes the chunk's H
actions in turn (open loop within the chunk, as pi0-style action experts run), and the policy decides again.

Demonstrations (`demonstrations`): E environments run the env's scripted controller with Gaussian exploration
noise on the executed actions for T steps; each step t whose next H - 1 steps stay in one episode gives a pair
(obs_t, the controller's clean actions at steps t .. t + H - 1 of the executed trajectory): the noise shows states
off the controller's path, and the labels say how to recover from them (DART's reading).

Evaluation (`evaluate_policy`): E fresh episodes, each until its first end (success, or `max_steps`): the success
rate, the mean distance to the goal at that end, and the mean return over it.
"""
from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.envs.core import Env, EnvParams

Array = jax.Array


def demonstrations(env: Env, params: EnvParams, key: Array, envs: int, steps: int, noise: float,
                   horizon: int) -> tuple[np.ndarray, np.ndarray]:
  """(obs [M, O], action chunks [M, H, A]) of the scripted controller (module docstring)."""
  def one_env(k):
    k_reset, k_run = jax.random.split(k)
    obs, state = env.reset(k_reset, params)

    def step(carry, k):
      obs, state = carry
      k_noise, k_step = jax.random.split(k)
      clean = env.scripted(obs)
      taken = clean + noise * jax.random.normal(k_noise, clean.shape)
      nobs, nstate, _, done, _ = env.step(k_step, state, taken, params)
      return (nobs, nstate), (obs, clean, done)
    return jax.lax.scan(step, (obs, state), jax.random.split(k_run, steps))[1]

  obs, clean, done = (np.asarray(x) for x in jax.jit(jax.vmap(one_env))(jax.random.split(key, envs)))
  pairs_obs, pairs_act = [], []
  for t in range(steps - horizon + 1):
    ok = ~done[:, t:t + horizon - 1].any(axis=1)          # the chunk stays inside one episode
    pairs_obs.append(obs[ok, t])
    pairs_act.append(clean[ok, t:t + horizon])
  return np.concatenate(pairs_obs), np.concatenate(pairs_act)


def evaluate_policy(env: Env, params: EnvParams, act: Callable[[Array, Array], Array], key: Array,
                    episodes: int, horizon: int) -> dict:
  """{"eval/success", "eval/distance", "eval/return", "eval/episodes"} of `act(obs [E, O], key) -> chunks
  [E, H, A]` over `episodes` first episodes (module docstring)."""
  decisions = math.ceil(int(params.max_steps) / horizon)

  @jax.jit
  def run(key):
    k_reset, k_run = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, episodes), params)
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    zeros = jnp.zeros(episodes)
    carry0 = (obs, state, jnp.zeros(episodes, bool), zeros, zeros, zeros)

    def decide(carry, k):
      obs, state, ended, success, distance, ret = carry
      k_act, k_env = jax.random.split(k)
      chunk = act(obs, k_act)

      def one(c, h):
        obs, state, ended, success, distance, ret = c
        nobs, nstate, reward, done, info = step(jax.random.split(jax.random.fold_in(k_env, h), episodes), state,
                                               chunk[:, h], params)
        live = ~ended
        return (nobs, nstate, ended | done, jnp.where(live & done, info["success"], success),
                jnp.where(live, info["distance"], distance), ret + jnp.where(live, reward, 0.0)), None
      return jax.lax.scan(one, (obs, state, ended, success, distance, ret), jnp.arange(horizon))[0], None
    final = jax.lax.scan(decide, carry0, jax.random.split(k_run, decisions))[0]
    return final[3], final[4], final[5]

  success, distance, ret = (np.asarray(x, np.float64) for x in run(key))
  return {"eval/success": float(success.mean()), "eval/distance": float(distance.mean()),
          "eval/return": float(ret.mean()), "eval/episodes": episodes}
