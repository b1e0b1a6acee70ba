"""ACCRUE (methods/embodied.md §4; DESIGN, the paper not available to us): continual off-policy RL across a task
sequence with a small residual actor-critic over a frozen base policy, inherited from task to task, and a small
per-task trajectory memory mixed into every batch. The functions; the stage that runs a sequence is separate.

  actor      mu_phi(z, a0) = a0 + rho tanh(f_phi(z, a0))        a0: the frozen flow base's chunk for z (its
                                                                 deterministic sampler from fixed noise)
  critics    twin Q_psi(z, a) with target copies (TD3)
  losses     critic: (Q_i(z, a) - y)^2, y = r_c + gamma^H (1 - d) min_i Q'_i(z', mu'(z') + e), e the clipped
                     Gaussian target smoothing of TD3 (the batch's `target_noise`; zeros turn it off);
                     + critic_mc x (Q_i(z, a) - G)^2 on memory rows (their stored Monte-Carlo returns)
             actor:  -Q_1(z, mu(z)) + lambda_ref ||mu(z) - a0||^2  + lambda_bc ||mu(z) - a_mem||^2 on the memory
                     rows of successful trajectories
  memory     `TrajectoryMemory`: per task, `per_task` trajectories kept by top return or reservoir sampling
             (`select_trajectories`); `mixed_batch` draws (1 - p_mem) of a batch from the current task's buffer and
             p_mem from the memory
"""
from __future__ import annotations

from typing import NamedTuple

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


class ResidualActor(nn.Module):
  """mu(z, a0) = a0 + rho tanh(f(z, a0)) on chunks [B, H, A]; f's last layer starts at zero, so mu starts at a0."""
  hidden: int
  rho: float

  @nn.compact
  def __call__(self, z, a0):
    x = jnp.concatenate([z, a0.reshape(a0.shape[0], -1)], axis=-1)
    x = nn.swish(nn.Dense(self.hidden)(x))
    x = nn.swish(nn.Dense(self.hidden)(x))
    f = nn.Dense(a0.shape[1] * a0.shape[2], kernel_init=nn.initializers.zeros)(x).reshape(a0.shape)
    return a0 + self.rho * jnp.tanh(f)


class TwinQ(nn.Module):
  hidden: int

  @nn.compact
  def __call__(self, z, a):
    x = jnp.concatenate([z, a.reshape(a.shape[0], -1)], axis=-1)
    out = []
    for i in range(2):
      h = nn.swish(nn.Dense(self.hidden, name=f"q{i}_0")(x))
      h = nn.swish(nn.Dense(self.hidden, name=f"q{i}_1")(h))
      out.append(nn.Dense(1, name=f"q{i}_out")(h)[..., 0])
    return tuple(out)


def critic_loss(q_params, target_q, target_actor, batch: dict, *, q: TwinQ, actor: ResidualActor, gamma_h: float,
                critic_mc: float) -> tuple[Array, dict]:
  """The TD3 critic loss on `batch` (z, a, reward, z_next, a0_next, done, mc, is_memory, optionally has_mc: the
  rows whose MC return reaches their episode's end, and target_noise: the clipped smoothing noise on the target
  actor's chunks) (module docstring)."""
  a_next = actor.apply({"params": target_actor}, batch["z_next"], batch["a0_next"]) + batch.get("target_noise", 0.0)
  y = batch["reward"] + gamma_h * (1.0 - batch["done"]) * jnp.minimum(*q.apply({"params": target_q},
                                                                              batch["z_next"], a_next))
  y = jax.lax.stop_gradient(y)
  q1, q2 = q.apply({"params": q_params}, batch["z"], batch["a"])
  td = jnp.mean((q1 - y) ** 2 + (q2 - y) ** 2)
  mem = batch["is_memory"] * batch.get("has_mc", 1.0)         # memory rows whose episode's return is complete
  mc = jnp.sum(mem * ((q1 - batch["mc"]) ** 2 + (q2 - batch["mc"]) ** 2)) / jnp.maximum(mem.sum(), 1.0)
  return td + critic_mc * mc, {"accrue/td": td, "accrue/mc": mc}


def actor_loss(actor_params, q_params, batch: dict, *, q: TwinQ, actor: ResidualActor, lambda_ref: float,
               lambda_bc: float) -> tuple[Array, dict]:
  """-Q1(z, mu) + lambda_ref ||mu - a0||^2 + lambda_bc ||mu - a||^2 on successful memory rows."""
  mu = actor.apply({"params": actor_params}, batch["z"], batch["a0"])
  q1, _ = q.apply({"params": q_params}, batch["z"], mu)
  ref = jnp.mean(jnp.sum((mu - batch["a0"]) ** 2, axis=(-2, -1)))
  bc_rows = batch["is_memory"] * batch["success"]
  bc = jnp.sum(bc_rows * jnp.sum((mu - batch["a"]) ** 2, axis=(-2, -1))) / jnp.maximum(bc_rows.sum(), 1.0)
  return -jnp.mean(q1) + lambda_ref * ref + lambda_bc * bc, {"accrue/q": jnp.mean(q1), "accrue/ref": ref,
                                                             "accrue/bc": bc}


class TrajectoryMemory(NamedTuple):
  """Fixed-capacity memory of transitions, `per_task` trajectories of `length` decisions for each of `tasks`
  tasks: every field [tasks, per_task, length, ...], `valid` [tasks, per_task, length] (1 where a decision was
  kept), `filled` [tasks] (the tasks stored so far)."""
  fields: dict
  valid: Array
  filled: Array


def empty_memory(tasks: int, per_task: int, length: int, shapes: dict) -> TrajectoryMemory:
  """A memory for transitions whose fields have per-decision `shapes` ({name: shape})."""
  return TrajectoryMemory({k: jnp.zeros((tasks, per_task, length) + tuple(s), jnp.float32) for k, s in shapes.items()},
                          jnp.zeros((tasks, per_task, length), jnp.float32), jnp.zeros((tasks,), jnp.float32))


def select_trajectories(returns: np.ndarray, k: int, mode: str, key=None) -> np.ndarray:
  """Indices of the `k` trajectories to keep: the highest returns ("top_return"), or a uniform sample without
  replacement ("reservoir": a reservoir over the whole stream keeps each trajectory with equal probability)."""
  returns = np.asarray(returns)
  k = min(k, returns.size)
  if mode == "top_return":
    return np.argsort(-returns, kind="stable")[:k]
  if mode == "reservoir":
    return np.sort(np.asarray(jax.random.choice(key, returns.size, (k,), replace=False)))
  raise ValueError(f"select_trajectories: mode={mode!r}; use 'top_return' or 'reservoir'.")


def store(memory: TrajectoryMemory, task: int, trajectories: dict, valid: np.ndarray) -> TrajectoryMemory:
  """`memory` with task `task`'s slot holding `trajectories` ({name: [k, length, ...]}, k <= per_task) and their
  `valid` [k, length] mask (a shorter selection leaves the rest of the slot empty)."""
  k = valid.shape[0]
  fields = {name: memory.fields[name].at[task].set(0.0).at[task, :k].set(jnp.asarray(v, jnp.float32))
            for name, v in trajectories.items()}
  mask = memory.valid.at[task].set(0.0).at[task, :k].set(jnp.asarray(valid, jnp.float32))
  return TrajectoryMemory(fields, mask, memory.filled.at[task].set(1.0))


def sample_memory(memory: TrajectoryMemory, key, n: int, before: int) -> dict:
  """`n` valid memory decisions, uniform over those of tasks < `before` (empty memory: zero rows, is_memory 0)."""
  weights = memory.valid * (jnp.arange(memory.valid.shape[0]) < before)[:, None, None]
  flat = weights.reshape(-1)
  total = flat.sum()
  idx = jax.random.choice(key, flat.size, (n,), p=jnp.where(total > 0, flat / jnp.maximum(total, 1e-9),
                                                            jnp.full_like(flat, 1.0 / flat.size)))
  rows = {k: v.reshape((-1,) + v.shape[3:])[idx] for k, v in memory.fields.items()}
  return {**rows, "is_memory": jnp.where(total > 0, flat[idx], 0.0)}


def mixed_batch(current: dict, memory_rows: dict, p_mem: float) -> dict:
  """A batch of len(current) rows: the first round((1 - p_mem) n) from the current task's rows, the rest from
  `memory_rows` (drawn by `sample_memory`, at least as many); memory rows keep their `is_memory` flag."""
  n = jax.tree.leaves(current)[0].shape[0]
  m = int(round(p_mem * n))
  cur = {k: v[:n - m] for k, v in current.items()}
  cur["is_memory"] = jnp.zeros(n - m, jnp.float32)
  mem = {k: memory_rows[k][:m] for k in cur}
  return {k: jnp.concatenate([cur[k], mem[k].astype(cur[k].dtype)]) for k in cur}
