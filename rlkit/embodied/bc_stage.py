"""The `flow_bc` stage: behaviour cloning of a flow-matching action expert (rlkit/models/flow.py) from an
environment's scripted controller (rlkit/embodied/episodes.py): the reference policy the embodied RL stages
start from.

At the start the stage draws its demonstrations (the section's `demo_*` fields; from the stage's key, so a resumed
stage draws the same ones) and a fresh expert; it needs none of the run's tokenizer, task, data or language model.
One iteration: `batch_size` (obs, chunk) pairs drawn with the iteration's key, one step of the conditional
flow-matching loss (fresh (s, eps) draws, the mean over the batch) through the shared update step (its
non-finite guard, every optimizer). Evaluations (every `eval_every`, and at the end): `evaluate_policy` with
`sample_steps` Euler steps from noise: eval/success, eval/distance, eval/return.

State: {"train": the expert's TrainState}; `rlkit.embodied.bc_stage.flow_config(section, env)` rebuilds the
expert's shape (and the RL stages read it from the same fields of their own section).
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from rlkit.core.errors import ConfigError
from rlkit.core.types import Metric
from rlkit.embodied.episodes import demonstrations, evaluate_policy
from rlkit.embodied.expert_source import expert_params
from rlkit.envs import ENVS, EnvParams, make_env
from rlkit.models.flow import FlowConfig, cfm_loss, sample
from rlkit.optim.optimizers import gradient_path, make_optimizer
from rlkit.train.config import optimizer_defaults
from rlkit.train.phases.update import reduce_over_steps
from rlkit.train.stages import Stage, loop, register_stage
from rlkit.train.steps import init_train_state, make_update_step


def flow_defaults() -> ml_collections.ConfigDict:
  """The expert's shape (FlowConfig's fields but the action size, which the environment gives)."""
  c = ml_collections.ConfigDict()
  c.horizon = 4                 # actions per chunk, taken open loop before the policy decides again
  c.hidden = 128                # trunk width
  c.blocks = 3                  # adaLN-Zero blocks
  c.time_dim = 64               # width of the time embedding and its MLP (the timestep module)
  c.mlp_ratio = 2               # block MLP width / hidden
  return c


def env_fields(c: ml_collections.ConfigDict) -> None:
  """The environment fields every embodied stage section has."""
  c.env = "point_mass"          # registry ENVS: point_mass | reacher (MuJoCo MJX)
  c.env_task = ml_collections.ConfigDict()   # EnvParams fields over the env's default task (goal_center,
                                # goal_spread, goal_radius, hold_steps, action_gain, drift, ctrl_cost, max_steps)
  c.eval_episodes = 64          # episodes of each evaluation (first episodes of fresh environments)
  c.sample_steps = 10           # Euler steps of the expert's deterministic sampler (evaluation)
  c.expert_path = ""            # a run's first stage starts from the expert saved here (a workdir, its checkpoints
                                # or one checkpoints/<step>; rlkit/embodied/expert_source.py), not a fresh one


def flow_bc_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "flow_bc"            # stage kind (registry STAGES)
  c.steps = 500                 # optimizer steps
  c.batch_size = 256            # (obs, chunk) pairs per step
  env_fields(c)
  c.flow = flow_defaults()
  c.demo_envs = 64              # environments the scripted controller runs for the demonstrations
  c.demo_steps = 200            # steps each (episodes end and restart inside)
  c.demo_noise = 0.3            # std of the Gaussian noise on the executed actions (the labels stay clean)
  c.eval_every = 0              # evaluate every N steps (0: only at the end of the stage)
  c.max_skipped_updates = 10    # stop after this many steps in a row with a non-finite loss/grad (0: never)
  c.optimizer = optimizer_defaults()
  return c


def flow_config(section, env) -> FlowConfig:
  return FlowConfig(action_dim=env.action_dim, **section.flow.to_dict())


def env_of(section) -> tuple:
  """(the section's environment, its task)."""
  return make_env(section.env, **section.env_task.to_dict())


def check_env_fields(section, name: str) -> None:
  if section.env not in ENVS:
    raise ConfigError(f"{name}.env={section.env!r} is not an environment; choose one of {', '.join(ENVS.names())}.")
  unknown = sorted(set(section.env_task.keys()) - set(EnvParams.__dataclass_fields__))
  if unknown:
    raise ConfigError(f"{name}.env_task has unknown field(s) {unknown}; an environment task has "
                      f"{sorted(EnvParams.__dataclass_fields__)}.")
  for key in ("eval_episodes", "sample_steps"):
    if section[key] < 1:
      raise ConfigError(f"{name}.{key}={section[key]} must be >= 1.")
  if section.flow.horizon < 1 or section.flow.hidden < 1 or section.flow.blocks < 0:
    raise ConfigError(f"{name}.flow: horizon and hidden must be >= 1 and blocks >= 0, got "
                      f"{section.flow.to_dict()}.")


def validate(section, name: str) -> None:
  check_env_fields(section, name)
  for key in ("batch_size", "demo_envs", "demo_steps"):
    if section[key] < 1:
      raise ConfigError(f"{name}.{key}={section[key]} must be >= 1.")
  if section.demo_steps < section.flow.horizon:
    raise ConfigError(f"{name}.demo_steps={section.demo_steps} is shorter than one chunk "
                      f"({name}.flow.horizon={section.flow.horizon}).")
  if section.demo_noise < 0:
    raise ConfigError(f"{name}.demo_noise={section.demo_noise} must be >= 0.")


def _init(ctx, cfg, params):
  env, _ = env_of(cfg)
  flow = expert_params(params, cfg, env, flow_config(cfg, env), jax.random.fold_in(ctx.key, 0xB0))
  return {"train": init_train_state(flow, make_optimizer(cfg.optimizer, cfg.steps), gradient_path(cfg.optimizer))}


def evaluate_expert(ctx, cfg, expert, global_step: int, index: int) -> dict:
  """An embodied stage's evaluation: `evaluate_policy` of the flow expert's deterministic sampler (the section's
  sample_steps and eval_episodes), its key from the stage and the global step."""
  env, task = env_of(cfg)
  fc = flow_config(cfg, env)
  key = jax.random.fold_in(jax.random.fold_in(ctx.key, 10_000 + index), global_step)
  return evaluate_policy(env, task, lambda obs, k: sample(expert, fc, obs, k, cfg.sample_steps), key,
                         cfg.eval_episodes, fc.horizon)


def evaluate(ctx, params, global_step: int, index: int, samples=None) -> dict:
  return evaluate_expert(ctx, ctx.config[ctx.config.stages[index]], params, global_step, index)


class StepIterator:
  """The stage's batches are drawn from the step's key, so its iterator only counts."""

  def __init__(self):
    self.step = 0

  def __next__(self):
    self.step += 1
    return self.step - 1

  def get_state(self):
    return {"step": self.step}

  def set_state(self, state):
    self.step = int(state["step"])


def flow_matching_loop(ctx, cfg, state, start: int, meta: dict, fc: FlowConfig, obs, targets):
  """The stage loop of conditional flow matching: each step draws `cfg.batch_size` rows of (obs [N, O], targets
  [N, H, A]) with their (s, eps) from the step's key and takes one optimizer step on the CFM loss (state
  {"train": TrainState}). Behaviour cloning here; the generative pretraining stage too (rlkit/diffusion)."""
  def loss_fn(params, mb, step_inputs):
    loss = jnp.sum(cfm_loss(params, fc, mb["obs"], mb["actions"], mb["s"], mb["eps"])) / step_inputs["num_rows"]
    return loss, {"loss": Metric(loss)}

  tx = make_optimizer(cfg.optimizer, cfg.steps)
  step_fn = make_update_step(loss_fn, tx, 1, lambda b: {"num_rows": b["obs"].shape[0]}, gradient_path(cfg.optimizer))

  @jax.jit
  def draw(key):
    k_idx, k_s, k_eps = jax.random.split(key, 3)
    idx = jax.random.randint(k_idx, (cfg.batch_size,), 0, obs.shape[0])
    return {"obs": obs[idx], "actions": targets[idx], "s": jax.random.uniform(k_s, (cfg.batch_size,)),
            "eps": jax.random.normal(k_eps, (cfg.batch_size,) + targets.shape[1:])}

  def iteration(state, _, key, iterator, step):
    train, m = step_fn(state["train"], draw(key), {})
    skipped = [int(jax.device_get(m["skipped_updates"].value))]
    return {"train": train}, reduce_over_steps(m, 1), skipped

  return loop(ctx, cfg, state, start, meta, StepIterator(), iteration, ("loss",))


def _run(ctx, cfg, state, start: int, meta: dict):
  env, task = env_of(cfg)
  fc = flow_config(cfg, env)
  obs, chunks = demonstrations(env, task, jax.random.fold_in(ctx.key, 0xDE + meta["stage_index"]), cfg.demo_envs,
                               cfg.demo_steps, cfg.demo_noise, fc.horizon)
  obs, chunks = jnp.asarray(obs), jnp.asarray(chunks)
  ctx.logger.say(f"stage {meta['stage']}: {obs.shape[0]} demonstration chunks from {cfg.env}'s scripted controller")
  return flow_matching_loop(ctx, cfg, state, start, meta, fc, obs, chunks)


register_stage("flow_bc", Stage(_init, _run, flow_bc_defaults, validate, needs=(), evaluate=evaluate))
