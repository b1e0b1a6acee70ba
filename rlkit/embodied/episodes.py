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

Off-policy collection (`chunk_collector`, with `episode_labels` and a replay `ring_push`): what the actor-critic
stages (acob, accrue) gather into their buffers.
"""
from __future__ import annotations

import math
from typing import Any, Callable

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


def policy_evaluator(env: Env, act: Callable[[Any, Array, Array], Array], episodes: int, horizon: int,
                     decisions: int) -> Callable:
  """The jitted evaluation (policy params, task EnvParams, key) -> (success, final distance, return), each
  [episodes], of `act(policy params, obs [E, O], key) -> chunks [E, H, A]` over `decisions` chunks of the first
  episodes of fresh environments (module docstring): one compilation serves any params and task of these shapes
  (an analysis evaluating many grafted experts on many tasks)."""
  @jax.jit
  def run(policy, params, key):
    k_reset, k_run = jax.random.split(key)
    obs, state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(k_reset, episodes), params)
    step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
    zeros = jnp.zeros(episodes)
    carry0 = (obs, state, jnp.zeros(episodes, bool), zeros, zeros, zeros)

    def decide(carry, k):
      obs, state, ended, success, distance, ret = carry
      k_act, k_env = jax.random.split(k)
      chunk = act(policy, obs, k_act)

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
  return run


def evaluation_row(success, distance, ret) -> dict:
  success, distance, ret = (np.asarray(x, np.float64) for x in (success, distance, ret))
  return {"eval/success": float(success.mean()), "eval/distance": float(distance.mean()),
          "eval/return": float(ret.mean()), "eval/episodes": int(success.size)}


def evaluate_policy(env: Env, params: EnvParams, act: Callable[[Array, Array], Array], key: Array,
                    episodes: int, horizon: int) -> dict:
  """{"eval/success", "eval/distance", "eval/return", "eval/episodes"} of `act(obs [E, O], key) -> chunks
  [E, H, A]` over `episodes` first episodes (module docstring; `policy_evaluator` for many evaluations)."""
  decisions = math.ceil(int(params.max_steps) / horizon)
  run = policy_evaluator(env, lambda _, obs, k: act(obs, k), episodes, horizon, decisions)
  return evaluation_row(*run(None, params, key))


def chunk_collector(env: Env, horizon: int, num_envs: int, decisions: int, gamma: float, act: Callable):
  """The jitted off-policy collection: (policy params, exploration std, obs, env state, key, task) -> (traj
  {obs, chunk, reward, next_obs, done, success} [D, E, ...], obs, env state), with `act(policy params, obs [E, O],
  key) -> chunks [E, H, A]` plus Gaussian noise of that std, on the task `task` (EnvParams: an argument, so a
  task sequence compiles once). A chunk's reward is its discounted sum (gamma^h);
  rewards after an episode's end inside a chunk do not count toward that decision (the chunk's rest acts on the
  next episode), and a decision is `done` when its chunk ended an episode (`success` when that end was one)."""
  step = jax.vmap(env.step, in_axes=(0, 0, 0, None))
  discounts = gamma ** jnp.arange(horizon, dtype=jnp.float32)

  @jax.jit
  def collect(policy, noise, obs, env_state, key, params):
    def decide(carry, k):
      obs, env_state = carry
      k_act, k_noise, k_env = jax.random.split(k, 3)
      chunk = act(policy, obs, k_act)
      chunk = chunk + noise * jax.random.normal(k_noise, chunk.shape)

      def one(c, h):
        o, s, reward, done, success = c
        o, s, r, d, info = step(jax.random.split(jax.random.fold_in(k_env, h), num_envs), s, chunk[:, h], params)
        live = ~done
        return (o, s, reward + jnp.where(live, discounts[h] * r, 0.0), done | d,
                success | (live & d & info["success"])), None
      zeros = jnp.zeros(num_envs, bool)
      (nobs, nstate, reward, done, success), _ = jax.lax.scan(
          one, (obs, env_state, jnp.zeros(num_envs), zeros, zeros), jnp.arange(horizon))
      return (nobs, nstate), {"obs": obs, "chunk": chunk, "reward": reward, "next_obs": nobs, "done": done,
                              "success": success}
    (obs, env_state), traj = jax.lax.scan(decide, (obs, env_state), jax.random.split(key, decisions))
    return traj, obs, env_state
  return collect


def episode_labels(traj: dict, gamma_h: float):
  """Per decision [D, E] of a collection: the Monte-Carlo return to the end of its episode (gamma_h = gamma^H
  between decisions), whether that end lies inside this collection (1.0) and whether the episode ended in success
  (1.0): the labels of calibration targets, memory returns and success rankings."""
  def back(carry, x):
    g_next, end_next, succ_next = carry
    r, d, s = x
    g = r + gamma_h * (1.0 - d) * g_next
    end = jnp.maximum(d, end_next)
    succ = jnp.where(d > 0, s, succ_next)
    return (g, end, succ), (g, end, succ)
  done = traj["done"].astype(jnp.float32)
  zeros = jnp.zeros_like(done[0])
  _, out = jax.lax.scan(back, (zeros, zeros, zeros), (traj["reward"], done, traj["success"].astype(jnp.float32)),
                        reverse=True)
  return out


@jax.jit
def ring_push(buffer: dict, rows: dict) -> dict:
  """`rows` ({name: [n, ...]}) written into a replay ring buffer ({name: [capacity, ...]}, plus "ptr" and "size")
  at its pointer."""
  n = jax.tree.leaves(rows)[0].shape[0]
  cap = next(v.shape[0] for k, v in buffer.items() if k not in ("ptr", "size"))
  idx = (buffer["ptr"] + jnp.arange(n)) % cap
  out = {k: buffer[k].at[idx].set(v.astype(buffer[k].dtype)) for k, v in rows.items()}
  return {**buffer, **out, "ptr": (buffer["ptr"] + n) % cap, "size": jnp.minimum(buffer["size"] + n, cap)}
