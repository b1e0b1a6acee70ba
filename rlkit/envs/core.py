"""Control environments for embodied RL: pure JAX, jittable and vmappable, in gymnax's functional style.

  obs, state = env.reset(key, params)
  obs, state, reward, done, info = env.step(key, state, action, params)

`params` (`EnvParams`, a pytree) is the task: where the goal region lies (`goal_center`, `goal_spread`: each
episode draws its goal uniformly from that disk), how close counts (`goal_radius`), for how many consecutive steps
(`hold_steps`: 1 is a reach, more is a precision task), the actuator gain (`action_gain`, multiplying the
action), a constant drift added to the action after the gain (a force field, a biased joint, `drift`), the
control cost and the episode length. The reward is dense, -distance - ctrl_cost |a|^2, or with `sparse` 1 at the
step that completes the task and 0 otherwise. A sequence of tasks is a sequence of params of one environment, so a
continual-learning run changes numbers, not code, and a batch of tasks is one params pytree with a leading axis
(`jax.vmap` over params as over keys).

`step` resets a finished episode itself (gymnax's auto-reset): where `done`, the returned obs and state are a
fresh episode's, drawn with the step's key; reward, done and info belong to the step that ended. info:
`distance` (end effector to goal), `success` (the goal held for `hold_steps` steps: the episode ends there),
`truncated` (out of steps without success), `steps` (the ended or running episode's step count).

An environment implements `_reset(key, params) -> state` (goal and `t`, `hold` included), `_advance(state,
force, params) -> state` (the dynamics under `force = action_gain * clip(action) + drift`), `_observe(state,
params)` and `effector(state)`, and registers itself in ENVS.
"""
from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp

from rlkit.core.registry import Registry

Array = jax.Array


@flax.struct.dataclass
class EnvParams:
  """A task (module docstring). Vectors have the environment's sizes: goal [2] (the plane of the effector),
  drift [action_dim]."""
  goal_center: Array
  goal_spread: float = 0.0
  goal_radius: float = 0.02
  hold_steps: int = 1
  action_gain: float = 1.0
  drift: Array = None
  ctrl_cost: float = 0.0
  max_steps: int = 100
  sparse: int = 0               # 1: the reward is 1 at the step that completes the task and 0 otherwise


VECTORS = ("goal_center", "drift")


def with_task(params: EnvParams, **task) -> EnvParams:
  """`params` with the fields of `task` replaced (vectors given as lists, as a config writes them, become
  float32 arrays): one task of a sequence."""
  unknown = sorted(set(task) - set(params.__dataclass_fields__))
  if unknown:
    raise ValueError(f"Unknown task field(s) {unknown}; an EnvParams has {sorted(params.__dataclass_fields__)}.")
  return params.replace(**{k: jnp.asarray(v, jnp.float32) if k in VECTORS else v for k, v in task.items()})


@flax.struct.dataclass
class Progress:
  """What every environment's state carries beside its physics: the goal, the step count, the steps held."""
  goal: Array            # [2]
  t: Array               # int32 []
  hold: Array            # int32 [], consecutive steps within goal_radius


class Env:
  """The shared `reset` / `step` of an environment (module docstring); subclasses give the physics."""
  name = ""
  action_dim = 0
  obs_dim = 0

  def default_params(self) -> EnvParams:
    raise NotImplementedError

  # --- subclass interface
  def _reset(self, key: Array, params: EnvParams, progress: Progress) -> Any:
    raise NotImplementedError

  def _advance(self, state: Any, force: Array, params: EnvParams) -> Any:
    raise NotImplementedError

  def _observe(self, state: Any, params: EnvParams) -> Array:
    raise NotImplementedError

  def effector(self, state: Any) -> Array:
    raise NotImplementedError

  def scripted(self, obs: Array) -> Array:
    """A hand-written controller's action for `obs` [..., obs_dim] (the demonstrations of behaviour cloning)."""
    raise NotImplementedError

  # --- shared
  def reset(self, key: Array, params: EnvParams) -> tuple[Array, Any]:
    k_goal, k_state = jax.random.split(key)
    angle = jax.random.uniform(k_goal, (), minval=0.0, maxval=2 * jnp.pi)
    r = params.goal_spread * jnp.sqrt(jax.random.uniform(jax.random.fold_in(k_goal, 1), ()))
    goal = params.goal_center + r * jnp.stack([jnp.cos(angle), jnp.sin(angle)])
    state = self._reset(k_state, params, Progress(goal.astype(jnp.float32), jnp.int32(0), jnp.int32(0)))
    return self._observe(state, params), state

  def step(self, key: Array, state: Any, action: Array, params: EnvParams):
    clipped = jnp.clip(action.astype(jnp.float32), -1.0, 1.0)
    force = params.action_gain * clipped + params.drift
    new = self._advance(state, force, params)
    distance = jnp.linalg.norm(self.effector(new) - new.progress.goal)
    hold = jnp.where(distance <= params.goal_radius, new.progress.hold + 1, 0)
    t = new.progress.t + 1
    new = new.replace(progress=new.progress.replace(t=t, hold=hold))
    success = hold >= params.hold_steps
    truncated = (t >= params.max_steps) & ~success
    done = success | truncated
    dense = -distance - params.ctrl_cost * jnp.sum(clipped ** 2)
    reward = jnp.where(params.sparse > 0, success.astype(jnp.float32), dense)
    obs_reset, state_reset = self.reset(key, params)
    obs = jnp.where(done, obs_reset, self._observe(new, params))
    state = jax.tree.map(lambda a, b: jnp.where(done, a, b), state_reset, new)
    info = {"distance": distance, "success": success, "truncated": truncated, "steps": t}
    return obs, state, reward.astype(jnp.float32), done, info


ENVS: Registry[Callable[[], Env]] = Registry("environment")


def make_env(name: str, **task) -> tuple[Env, EnvParams]:
  """The environment registered as `name` and its default task with `task`'s fields replaced (`with_task`)."""
  env = ENVS.get(name)()
  return env, with_task(env.default_params(), **task)


def rollout(env: Env, params: EnvParams, policy: Callable[[Array, Array], Array], key: Array, steps: int):
  """`steps` steps of `policy(obs, key) -> action` from a reset, jittable (a `lax.scan`): (the final state,
  {obs [steps, obs_dim], action, reward, done, success, distance})."""
  k_reset, k_run = jax.random.split(key)
  obs, state = env.reset(k_reset, params)

  def one(carry, k):
    obs, state = carry
    k_act, k_step = jax.random.split(k)
    action = policy(obs, k_act)
    nobs, nstate, reward, done, info = env.step(k_step, state, action, params)
    return (nobs, nstate), {"obs": obs, "action": action, "reward": reward, "done": done,
                            "success": info["success"], "distance": info["distance"]}
  (_, state), out = jax.lax.scan(one, (obs, state), jax.random.split(k_run, steps))
  return state, out
