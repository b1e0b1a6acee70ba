"""The `accrue` stage: ACCRUE's continual off-policy RL across a sequence of tasks (rlkit/embodied/accrue.py has the
rules; DESIGN, methods/embodied.md §4), on a control environment, over the preceding stage's flow expert as the
frozen base.

`tasks` lists the sequence (EnvParams fields over `env_task`, one dict a task); the stage spends
`steps_per_task` iterations on each (`steps` must be their product). The base's chunk a0(z) is its sampler from the
noise's mean (a function of the observation alone); the actor is the residual mu(z, a0) = a0 + rho tanh(f), the
critics twin Q with targets (TD3: target copies, `policy_delay`, `target_noise` smoothing). One iteration: collect `decisions` chunks in each
of `num_envs` environments of the current task with mu plus `explore_noise`, push them to the task's buffer, then
`critic_updates` critic steps on batches of which `p_mem` come from the memory of earlier tasks (their MC returns
consolidate the critic, their successful chunks the actor: `critic_mc`, `lambda_bc`), with an actor step every
`policy_delay` critic steps, except in the first `n_warm` iterations of every task (the critic learns the task's
reward first: on the first task it starts random, on a later one it is inherited from another reward; an actor
trained on such a critic drags the base's good chunks away, which probes of the first task showed).
At a task's end: its last collection's per-environment segments are the candidate trajectories, `per_task` of them
kept (`memory_mode`: top return or reservoir); then every task of the sequence is evaluated (`accrue/success_t<j>`,
the forgetting matrix's row); then, unless `inherit`, the actor and critics start afresh (Fresh-AC); the buffer
empties and the environments reset on the next task. Arms of the method's study are configs: Fresh-AC
(`inherit=False, p_mem=0`), SeqFT (`p_mem=0`), ACCRUE (the defaults), + BC (`lambda_bc > 0`), full replay
(`per_task` at the candidates' count), the base alone (`steps_per_task` of evaluation only: `critic_updates=0`).
State: {"train": TrainState of {"actor", "base"} (the base frozen), "critic", "target", "buffer", "memory", "obs",
"env"}.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.core.errors import ConfigError
from rlkit.core.types import Metric
from rlkit.embodied import accrue
from rlkit.embodied.bc_stage import StepIterator, check_env_fields, env_fields, env_of, flow_config, flow_defaults
from rlkit.embodied.episodes import chunk_collector, episode_labels, evaluate_policy, ring_push
from rlkit.embodied.expert_source import expert_params
from rlkit.envs import EnvParams, with_task
from rlkit.models.flow import sample
from rlkit.optim.optimizers import gradient_path, make_optimizer
from rlkit.train.config import optimizer_defaults
from rlkit.train.stages import Stage, loop, register_stage
from rlkit.train.steps import init_train_state, make_update_step

MEMORY_MODES = ("top_return", "reservoir")


def accrue_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "accrue"             # stage kind (registry STAGES)
  c.steps = 200                 # iterations in all: len(tasks) x steps_per_task
  env_fields(c)
  c.flow = flow_defaults()       # the base's shape: the preceding flow_bc stage's
  c.tasks = ()                  # the sequence: EnvParams fields over env_task per task (dicts); () = env_task alone
  c.steps_per_task = 200        # iterations on each task
  c.inherit = True              # keep actor and critics from task to task (False: Fresh-AC)
  c.num_envs = 16               # environments stepped in parallel
  c.decisions = 8               # chunks each environment takes per iteration
  c.gamma = 0.99                # discount per environment step (gamma^H between decisions)
  c.hidden = 128                # actor and critic MLP width
  c.rho = 0.5                   # the actor's largest residual on the base's chunk
  c.explore_noise = 0.3         # std of the Gaussian noise on the acting chunks
  c.target_noise = 0.2          # TD3's target smoothing: std of the noise on the target actor's chunks (0: off)
  c.target_noise_clip = 0.5     # ... clipped to +-this
  c.critic_updates = 32         # critic steps per iteration (the defaults here: experiments/accrue/README's probes)
  c.policy_delay = 2            # an actor step every N critic steps (TD3)
  c.batch_size = 256            # rows per step
  c.buffer = 20_000             # the current task's replay capacity (decisions)
  c.tau = 0.01                  # Polyak rate of the target actor and critics
  c.n_warm = 5                  # critic-only iterations at the start of every task
  c.per_task = 16               # trajectories kept in memory per task
  c.memory_mode = "top_return"  # top_return | reservoir
  c.p_mem = 0.25                # share of each batch drawn from the memory of earlier tasks
  c.critic_mc = 1.0             # weight of the critic's regression to memory MC returns
  c.lambda_ref = 0.05           # weight of ||mu - a0||^2
  c.lambda_bc = 0.0             # weight of behaviour cloning on successful memory chunks
  c.eval_every = 0              # evaluate the current task every N iterations (0: only at task ends)
  c.max_skipped_updates = 10
  c.optimizer = optimizer_defaults()           # the actor's
  c.optimizer.lr = 3e-4
  c.critic_optimizer = optimizer_defaults()
  c.critic_optimizer.lr = 3e-4
  return c


def task_list(section) -> list:
  return [dict(t) for t in section.tasks] or [{}]


def validate(section, name: str) -> None:
  check_env_fields(section, name)
  fields = set(EnvParams.__dataclass_fields__)
  for i, task in enumerate(section.tasks):
    if not isinstance(task, (dict, ml_collections.ConfigDict)) or set(task) - fields:
      raise ConfigError(f"{name}.tasks[{i}]={task!r} must be a dict of EnvParams fields ({sorted(fields)}).")
  n = len(task_list(section))
  if section.steps != n * section.steps_per_task:
    raise ConfigError(f"{name}.steps={section.steps} must be len(tasks) x steps_per_task = {n} x "
                      f"{section.steps_per_task} = {n * section.steps_per_task}.")
  for key in ("steps_per_task", "num_envs", "decisions", "hidden", "policy_delay", "batch_size", "per_task"):
    if section[key] < 1:
      raise ConfigError(f"{name}.{key}={section[key]} must be >= 1.")
  if section.memory_mode not in MEMORY_MODES:
    raise ConfigError(f"{name}.memory_mode={section.memory_mode!r}; choose one of {', '.join(MEMORY_MODES)}.")
  if not 0 <= section.p_mem < 1 or section.buffer < section.num_envs * section.decisions:
    raise ConfigError(f"{name}: p_mem in [0, 1) and buffer >= num_envs x decisions, got p_mem={section.p_mem}, "
                      f"buffer={section.buffer}.")


def _tasks(cfg, base_task) -> list:
  return [with_task(base_task, **t) for t in task_list(cfg)]


def _fresh(cfg, env, fc, key):
  """(actor params, critic params) of a fresh residual actor-critic."""
  actor, q = accrue.ResidualActor(cfg.hidden, cfg.rho), accrue.TwinQ(cfg.hidden)
  z, a = jnp.zeros((1, env.obs_dim)), jnp.zeros((1, fc.horizon, fc.action_dim))
  return actor.init(jax.random.fold_in(key, 1), z, a)["params"], q.init(jax.random.fold_in(key, 2), z, a)["params"]


def _optimizers(cfg):
  frozen = ml_collections.ConfigDict(cfg.optimizer.to_dict())
  frozen.frozen = "^base/"                                     # the base never moves
  total = cfg.steps * max(cfg.critic_updates, 1)
  return make_optimizer(frozen, total), make_optimizer(cfg.critic_optimizer, total)


def _init(ctx, cfg, params):
  env, base_task = env_of(cfg)
  fc = flow_config(cfg, env)
  key = jax.random.fold_in(ctx.key, 0xACC)
  base = expert_params(params, cfg, env, fc, jax.random.fold_in(key, 0))
  actor, critic = _fresh(cfg, env, fc, key)
  tx, critic_tx = _optimizers(cfg)
  policy = {"actor": actor, "base": base}
  train = init_train_state(policy, tx, gradient_path(cfg.optimizer))
  task = _tasks(cfg, base_task)[0]
  obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.fold_in(key, 3), cfg.num_envs),
                                                           task)
  f = lambda *shape: jnp.zeros((cfg.buffer,) + shape, jnp.float32)   # noqa: E731
  chunk = (fc.horizon, fc.action_dim)
  buffer = {"z": f(env.obs_dim), "a": f(*chunk), "reward": f(), "z_next": f(env.obs_dim), "done": f(), "mc": f(),
            "has_mc": f(), "success": f(), "ptr": jnp.zeros((), jnp.int32), "size": jnp.zeros((), jnp.int32)}
  memory = accrue.empty_memory(len(task_list(cfg)), cfg.per_task, cfg.decisions,
                               {k: v.shape[1:] for k, v in buffer.items() if k not in ("ptr", "size")})
  copy = lambda tree: jax.tree.map(jnp.copy, tree)             # noqa: E731 (the update steps donate their states)
  return {"train": train, "critic": init_train_state(critic, critic_tx), "target": {"actor": copy(actor),
          "q": copy(critic)}, "buffer": buffer, "memory": memory, "obs": obs, "env": env_state}


def _run(ctx, cfg, state, start: int, meta: dict):
  env, base_task = env_of(cfg)
  fc = flow_config(cfg, env)
  tasks = _tasks(cfg, base_task)
  actor_m, q_m = accrue.ResidualActor(cfg.hidden, cfg.rho), accrue.TwinQ(cfg.hidden)
  gamma_h = cfg.gamma ** fc.horizon

  def base_chunk(base, z):
    return sample(base, fc, z, None, cfg.sample_steps, start=jnp.zeros((z.shape[0], fc.horizon, fc.action_dim)))

  def act(policy, z, key):
    return actor_m.apply({"params": policy["actor"]}, z, base_chunk(policy["base"], z))

  collect = chunk_collector(env, fc.horizon, cfg.num_envs, cfg.decisions, cfg.gamma, act)

  def critic_loss(q_params, mb, step_inputs):
    loss, m = accrue.critic_loss(q_params, mb["target_q"], mb["target_actor"], mb, q=q_m, actor=actor_m,
                                 gamma_h=gamma_h, critic_mc=cfg.critic_mc)
    return loss, {"critic/loss": Metric(loss), **{k: Metric(v) for k, v in m.items()}}

  def actor_loss(policy, mb, step_inputs):
    loss, m = accrue.actor_loss(policy["actor"], mb["q"], mb, q=q_m, actor=actor_m, lambda_ref=cfg.lambda_ref,
                                lambda_bc=cfg.lambda_bc)
    return loss, {"loss": Metric(loss), **{k: Metric(v) for k, v in m.items()}}

  tx, critic_tx = _optimizers(cfg)
  rows_of = lambda b: {"num_rows": b["z"].shape[0]}           # noqa: E731
  critic_step = make_update_step(critic_loss, critic_tx, 1, rows_of)
  actor_step = make_update_step(actor_loss, tx, 1, rows_of, gradient_path(cfg.optimizer))

  @jax.jit
  def batch_of(buffer, memory, base, task, key):
    k_cur, k_mem = jax.random.split(key)
    idx = jax.random.randint(k_cur, (cfg.batch_size,), 0, jnp.maximum(buffer["size"], 1))
    current = {k: buffer[k][idx] for k in ("z", "a", "reward", "z_next", "done", "mc", "has_mc", "success")}
    rows = accrue.mixed_batch(current, accrue.sample_memory(memory, k_mem, cfg.batch_size, task), cfg.p_mem)
    smooth = cfg.target_noise * jax.random.normal(jax.random.fold_in(key, 1), rows["a"].shape)
    return {**rows, "a0": base_chunk(base, rows["z"]), "a0_next": base_chunk(base, rows["z_next"]),
            "target_noise": jnp.clip(smooth, -cfg.target_noise_clip, cfg.target_noise_clip)}

  @jax.jit
  def polyak(target, actor, q):
    mix = lambda t, p: (1 - cfg.tau) * t + cfg.tau * p          # noqa: E731
    return {"actor": jax.tree.map(mix, target["actor"], actor), "q": jax.tree.map(mix, target["q"], q)}

  def evaluate_task(policy, task, key):
    return evaluate_policy(env, task, lambda z, k: act(policy, z, k), key, cfg.eval_episodes, fc.horizon)

  def iteration(state, _, key, iterator, step):
    t, within = divmod(step, cfg.steps_per_task)
    task = tasks[t]
    k_col, k_upd, k_eval = jax.random.split(key, 3)
    traj, obs, env_state = collect(state["train"].params, cfg.explore_noise, state["obs"], state["env"], k_col, task)
    g, has_end, succ = episode_labels(traj, gamma_h)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])           # noqa: E731 [D, E, ...] -> [D E, ...]
    rows = {"z": flat(traj["obs"]), "a": flat(traj["chunk"]), "reward": flat(traj["reward"]),
            "z_next": flat(traj["next_obs"]), "done": flat(traj["done"]).astype(jnp.float32), "mc": flat(g),
            "has_mc": flat(has_end), "success": flat(succ)}
    buffer = ring_push(state["buffer"], rows)
    train, critic, target = state["train"], state["critic"], state["target"]
    warm = within < cfg.n_warm         # every task: the first's critic starts random, a later one's inherited
    metrics, skipped = {"accrue/task": t, "reward": float(traj["reward"].mean()),
                        "success": float(traj["success"].sum()) / max(float(traj["done"].sum()), 1.0)}, []
    for u in range(cfg.critic_updates):
      mb = batch_of(buffer, state["memory"], train.params["base"], t, jax.random.fold_in(k_upd, u))
      critic, m = critic_step(critic, {**mb, "target_q": target["q"], "target_actor": target["actor"]}, {})
      metrics["critic/loss"] = float(m["critic/loss"].value)
      if not warm and (u + 1) % cfg.policy_delay == 0:
        train, m = actor_step(train, {**mb, "q": critic.params}, {})
        skipped.append(int(m["skipped_updates"].value))
        metrics.update({k: float(m[k].value) for k in ("loss", "accrue/q", "accrue/ref", "accrue/bc")})
      target = polyak(target, train.params["actor"], critic.params)
    memory = state["memory"]
    if within + 1 == cfg.steps_per_task:                       # the task's end (module docstring)
      per_env = {k: jnp.swapaxes(v.reshape((cfg.decisions, cfg.num_envs) + v.shape[1:]), 0, 1)
                 for k, v in rows.items()}                     # [E, D, ...]
      keep = accrue.select_trajectories(np.asarray(per_env["reward"].sum(axis=1)), cfg.per_task, cfg.memory_mode,
                                        jax.random.fold_in(k_eval, 1))
      memory = accrue.store(memory, t, {k: v[keep] for k, v in per_env.items()}, np.ones((len(keep), cfg.decisions)))
      for j, other in enumerate(tasks):
        metrics[f"accrue/success_t{j}"] = evaluate_task(train.params, other, jax.random.fold_in(k_eval, 100 + j))[
            "eval/success"]
      if t + 1 < len(tasks):
        if not cfg.inherit:
          actor, q = _fresh(cfg, env, fc, jax.random.fold_in(ctx.key, 0xACC + t + 1))
          tx_fresh, critic_fresh = _optimizers(cfg)
          train = init_train_state({"actor": actor, "base": train.params["base"]}, tx_fresh,
                                   gradient_path(cfg.optimizer))
          critic = init_train_state(q, critic_fresh)
          target = {"actor": jax.tree.map(jnp.copy, actor), "q": jax.tree.map(jnp.copy, q)}
        buffer = {**buffer, "ptr": jnp.zeros((), jnp.int32), "size": jnp.zeros((), jnp.int32)}
        obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(
            jax.random.split(jax.random.fold_in(k_eval, 2), cfg.num_envs), tasks[t + 1])
    return ({**state, "train": train, "critic": critic, "target": target, "buffer": buffer, "memory": memory,
             "obs": obs, "env": env_state}, metrics, skipped)

  return loop(ctx, cfg, state, start, meta, StepIterator(), iteration, ("reward", "success", "accrue/task"))


def evaluate(ctx, params, global_step: int, index: int, samples=None) -> dict:
  """The current task's evaluation (the stage's last one: the sequence's last task)."""
  cfg = ctx.config[ctx.config.stages[index]]
  env, base_task = env_of(cfg)
  fc = flow_config(cfg, env)
  offset = sum(ctx.config[name].steps for name in ctx.config.stages[:index])
  t = min((global_step - offset - 1) // cfg.steps_per_task, len(task_list(cfg)) - 1)
  actor_m = accrue.ResidualActor(cfg.hidden, cfg.rho)

  def act(z, k):
    a0 = sample(params["base"], fc, z, None, cfg.sample_steps, start=jnp.zeros((z.shape[0], fc.horizon,
                                                                                fc.action_dim)))
    return actor_m.apply({"params": params["actor"]}, z, a0)
  key = jax.random.fold_in(jax.random.fold_in(ctx.key, 10_000 + index), global_step)
  return {**evaluate_policy(env, _tasks(cfg, base_task)[t], act, key, cfg.eval_episodes, fc.horizon),
          "eval/task": t}


register_stage("accrue", Stage(_init, _run, accrue_defaults, validate, needs=(), evaluate=evaluate))
