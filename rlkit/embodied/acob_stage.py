"""The `acob` stage: ACoB's staged value calibration, then reference-regularised actor updates, for a flow expert
on a control environment (rlkit/embodied/acob.py has the rules; DESIGN, methods/embodied.md §3).

The stage starts from the preceding `flow_bc` expert: pi_ref, a frozen copy, and the actor, trained. Chunk critics
Q1, Q2 (s, chunk) and V(s) are MLPs; a ring buffer keeps every decision (obs, chunk, discounted chunk reward,
next obs, done, whether pi_ref acted, and pi_ref's Monte-Carlo return where its episode ended inside the
collection). Each iteration collects `decisions` chunks in each of `num_envs` environments and then, by phase:
  1. calibrate (`calibrate_steps` iterations): pi_ref acts; Q(s, a_ref) and V(s) regress on its MC returns;
  2. TD (`td_steps` iterations, repeated up to `td_rounds` times while the gate fails): pi_ref acts; chunked TD
     of Q (target: the twin target critics' min at pi_ref's next chunk, the Cal-QL floor max(y, G_ref) on pi_ref's
     transitions) and of V (to the target critics' value of pi_ref's chunk at s); then the gate on the latest collection (TD error, |Q(s, a_ref) -
     G|, the AUC of Q for chunks of episodes that ended in success): passed -> phase 3; failed after the last round
     -> the stage keeps calibrating and never updates the actor (`acob/gate_failed` 1: reported, not hidden);
  3. improve: the actor acts (its sampler plus `explore_noise`); TD as in 2 with the actor's next chunk; the actor
     takes `actor_updates` steps of w-weighted flow matching on buffer chunks (w from A = min Q - V) plus beta x
     D_ref; beta follows dual ascent on D_ref - d_max; every `check_every` iterations the actor is evaluated and, if
     its success fell below pi_ref's minus `margin` (the trip-wire), it is rolled back to the last good actor and
     its learning rate halved.
Ablations are configs: `calibrate_steps=0, td_steps=0` (no calibration: actor updates from the first iteration,
with random critics: the naive actor-critic), `gate=False` (phase 3 after the TD steps whatever the gate says),
`beta=0, d_max=inf` (no reference penalty), `margin=inf` (no trip-wire). State: {"train": the actor's TrainState, "critic", "target", "ref", "buffer", "obs", "env", "acob"}.
The iteration itself is rlkit/embodied/acob_loop.py's AcobLoop (an actor side and a learner side), which
ACoB-Stream (rlkit/embodied/stream.py) runs on separate threads.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from rlkit.core.errors import ConfigError
from rlkit.embodied.acob_loop import AcobLoop, critics, learn_steps
from rlkit.embodied.stream import STREAM_MODES, block_metrics, run_stream
from rlkit.embodied.bc_stage import StepIterator, check_env_fields, env_fields, env_of, evaluate_expert, flow_config, \
    flow_defaults
from rlkit.embodied.expert_source import expert_params
from rlkit.optim.optimizers import make_optimizer
from rlkit.train.config import optimizer_defaults
from rlkit.train.stages import Stage, loop, register_stage, stage_key
from rlkit.train.steps import init_train_state

PHASES = {1: "calibrate", 2: "td", 3: "improve"}


def acob_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "acob"               # stage kind (registry STAGES)
  c.steps = 100                 # iterations (collect, then the phase's updates)
  env_fields(c)
  c.flow = flow_defaults()       # the expert's shape: the preceding flow_bc stage's
  c.num_envs = 16               # environments stepped in parallel
  c.decisions = 8               # chunks each environment takes per iteration
  c.gamma = 0.99                # discount per environment step (gamma^H between decisions)
  c.calibrate_steps = 10        # phase 1 iterations (0: none)
  c.td_steps = 10               # phase 2 iterations per round (0: none)
  c.td_rounds = 3               # phase 2 rounds while the gate fails
  c.eps_td = 0.05               # gate: mean squared TD error below this
  c.eps_cal = 0.5               # gate: mean |Q(s, a_ref) - G| below this
  c.auc_min = 0.8               # gate: success AUC of Q at least this (undefined without both outcomes: fails)
  c.gate = True                 # False: phase 3 follows the TD steps whatever the gate says (still logged)
  c.critic_hidden = 128         # Q and V MLP width (two hidden layers)
  c.critic_updates = 8          # critic steps per iteration
  c.batch_size = 256            # buffer rows per critic or actor step
  c.buffer = 20_000             # replay capacity (decisions)
  c.tau = 0.01                  # Polyak rate of the target critics
  c.actor_updates = 4           # actor steps per phase-3 iteration
  c.explore_noise = 0.1         # std of the Gaussian noise on the actor's acting chunks (phase 3)
  c.lam = 1.0                   # advantage temperature of w = min(exp(A / lam), w_max)
  c.w_max = 20.0
  c.binary_weights = False      # w = 1[A > 0] instead
  c.beta = 1.0                  # initial weight of D_ref
  c.d_max = 0.05                # the drift budget of dual ascent (inf: no dual ascent, beta fixed)
  c.beta_lr = 1.0               # dual ascent step
  c.beta_max = 100.0
  c.check_every = 10            # phase 3: evaluate the actor every N iterations for the trip-wire
  c.margin = 0.1                # trip-wire: success below pi_ref's minus this rolls the actor back (inf: off)
  c.stream = ml_collections.ConfigDict()       # ACoB-Stream (rlkit/embodied/stream.py)
  c.stream.mode = "off"         # off: the plain loop | sync: the actor and learner sides in one thread (equals off
                                # with block 1) | stream: on two threads, neither waiting (not deterministic)
  c.stream.block = 10           # sync/stream: learn steps per stage iteration (the worker thread lives one block;
                                # checkpoints fall between blocks; `steps` counts blocks)
  c.stream.publish_every = 1    # learn steps between the learner's publications of its params
  c.stream.max_staleness = 1    # collections older than this many publications train the critic only
  c.stream.infer_s = 0.0        # emulated inference seconds per collection (a large VLA's forward)
  c.stream.exec_s = 0.0         # emulated execution seconds per chunk (a robot acting)
  c.eval_every = 0              # logged evaluations every N iterations (0: only at the end)
  c.max_skipped_updates = 10
  c.optimizer = optimizer_defaults()           # the actor's
  c.optimizer.lr = 1e-4
  c.critic_optimizer = optimizer_defaults()
  c.critic_optimizer.lr = 3e-4
  return c


def validate(section, name: str) -> None:
  check_env_fields(section, name)
  for key in ("num_envs", "decisions", "critic_hidden", "critic_updates", "batch_size", "buffer", "td_rounds",
              "check_every"):
    if section[key] < 1:
      raise ConfigError(f"{name}.{key}={section[key]} must be >= 1.")
  for key in ("calibrate_steps", "td_steps", "actor_updates"):
    if section[key] < 0:
      raise ConfigError(f"{name}.{key}={section[key]} must be >= 0.")
  if section.buffer < section.num_envs * section.decisions:
    raise ConfigError(f"{name}.buffer={section.buffer} holds less than one collection "
                      f"({section.num_envs * section.decisions} decisions).")
  if not (0 < section.gamma <= 1 and 0 < section.tau <= 1 and section.lam > 0 and section.w_max > 0):
    raise ConfigError(f"{name}: gamma and tau in (0, 1], lam and w_max > 0.")
  st = section.stream
  if st.mode not in STREAM_MODES:
    raise ConfigError(f"{name}.stream.mode={st.mode!r}; choose one of {', '.join(STREAM_MODES)}.")
  if st.block < 1 or st.publish_every < 1 or st.max_staleness < 0 or st.infer_s < 0 or st.exec_s < 0:
    raise ConfigError(f"{name}.stream: block and publish_every >= 1, max_staleness, infer_s and exec_s >= 0, got "
                      f"{st.to_dict()}.")


def _buffer(cfg, obs_dim, horizon, action_dim) -> dict:
  n = cfg.buffer
  f = lambda *shape: jnp.zeros((n,) + shape, jnp.float32)           # noqa: E731
  return {"obs": f(obs_dim), "chunk": f(horizon, action_dim), "reward": f(), "next_obs": f(obs_dim),
          "done": f(), "ref": f(), "mc": f(), "has_mc": f(), "success": f(),
          "ptr": jnp.zeros((), jnp.int32), "size": jnp.zeros((), jnp.int32)}


def _init(ctx, cfg, params):
  env, task = env_of(cfg)
  fc = flow_config(cfg, env)
  key = jax.random.fold_in(ctx.key, 0xAC0B)
  ref = expert_params(params, cfg, env, fc, jax.random.fold_in(key, 0))
  _, _, critic_init = critics(cfg.critic_hidden)
  critic = critic_init(jax.random.fold_in(key, 1), env.obs_dim, fc.horizon * fc.action_dim)
  obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.fold_in(key, 2), cfg.num_envs),
                                                           task)
  first = 1 if cfg.calibrate_steps else 2 if cfg.td_steps else 3
  copy = lambda tree: jax.tree.map(jnp.copy, tree)             # noqa: E731 (the update steps donate their states)
  actor_tx = make_optimizer(cfg.optimizer, learn_steps(cfg) * max(cfg.actor_updates, 1))
  return {"train": init_train_state(copy(ref), actor_tx),
          "critic": init_train_state(copy(critic), make_optimizer(cfg.critic_optimizer,
                                                                  learn_steps(cfg) * cfg.critic_updates)),
          "target": critic, "ref": ref, "buffer": _buffer(cfg, env.obs_dim, fc.horizon, fc.action_dim),
          "obs": obs, "env": env_state,
          "acob": {"phase": jnp.int32(first), "phase_steps": jnp.int32(0), "td_round": jnp.int32(0),
                   "beta": jnp.float32(cfg.beta), "lr_scale": jnp.float32(1.0), "good_actor": copy(ref),
                   "ref_success": jnp.float32(-1.0), "gate_failed": jnp.int32(0)}}


def _run(ctx, cfg, state, start: int, meta: dict):
  index = meta["stage_index"]
  acob_loop = AcobLoop(cfg, state["ref"], lambda params, step: evaluate_expert(
      ctx, cfg, params, 1_000_000 + step, index)["eval/success"])

  st = cfg.stream
  if st.mode == "off":
    def iteration(state, _, key, iterator, step):
      return acob_loop.iteration(state, key, step)
  else:
    key0 = stage_key(ctx, index)

    def iteration(state, _, key, iterator, step):          # one block of learn steps (ACoB-Stream)
      state, rows, stats = run_stream(acob_loop, state, st.block, key0, mode=st.mode, start=step * st.block,
                                      publish_every=st.publish_every, max_staleness=st.max_staleness,
                                      infer_s=st.infer_s, exec_s=st.exec_s)
      return state, block_metrics(rows, stats), stats["skipped"]

  return loop(ctx, cfg, state, start, meta, StepIterator(), iteration, ("reward", "success", "acob/phase"))


def evaluate(ctx, params, global_step: int, index: int, samples=None) -> dict:
  return evaluate_expert(ctx, ctx.config[ctx.config.stages[index]], params, global_step, index)


register_stage("acob", Stage(_init, _run, acob_defaults, validate, needs=(), evaluate=evaluate))
