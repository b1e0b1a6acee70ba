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
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.core.errors import ConfigError
from rlkit.core.types import Metric
from rlkit.embodied import acob
from rlkit.embodied.bc_stage import StepIterator, check_env_fields, env_fields, env_of, evaluate_expert, flow_config, \
    flow_section
from rlkit.embodied.episodes import chunk_collector, episode_labels, ring_push
from rlkit.embodied.flow_rl_stage import Critic, expert_params
from rlkit.models.flow import sample
from rlkit.optim.optimizers import make_optimizer
from rlkit.train.config import optimizer_defaults
from rlkit.train.stages import Stage, loop, register_stage
from rlkit.train.steps import init_train_state, make_update_step

PHASES = {1: "calibrate", 2: "td", 3: "improve"}


def acob_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "acob"               # stage kind (registry STAGES)
  c.steps = 100                 # iterations (collect, then the phase's updates)
  env_fields(c)
  c.flow = flow_section()       # the expert's shape: the preceding flow_bc stage's
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


def _q_input(obs, chunk):
  return jnp.concatenate([obs, chunk.reshape(chunk.shape[0], -1)], axis=-1)


def critics(hidden: int):
  """(q(params, obs, chunk) -> (q1, q2), v(params, obs), init(key, obs_dim, chunk_size))."""
  m = Critic(hidden)            # a scalar MLP (flow_rl's critic) for each of Q1, Q2 and V

  def q(p, obs, chunk):
    x = _q_input(obs, chunk)
    return m.apply({"params": p["q1"]}, x), m.apply({"params": p["q2"]}, x)

  def v(p, obs):
    return m.apply({"params": p["v"]}, obs)

  def init(key, obs_dim, chunk_size):
    k1, k2, k3 = jax.random.split(key, 3)
    zq, zv = jnp.zeros((1, obs_dim + chunk_size)), jnp.zeros((1, obs_dim))
    return {"q1": m.init(k1, zq)["params"], "q2": m.init(k2, zq)["params"], "v": m.init(k3, zv)["params"]}
  return q, v, init


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
  ref = expert_params(params, cfg, env, jax.random.fold_in(key, 0))
  _, _, critic_init = critics(cfg.critic_hidden)
  critic = critic_init(jax.random.fold_in(key, 1), env.obs_dim, fc.horizon * fc.action_dim)
  obs, env_state = jax.vmap(env.reset, in_axes=(0, None))(jax.random.split(jax.random.fold_in(key, 2), cfg.num_envs),
                                                           task)
  first = 1 if cfg.calibrate_steps else 2 if cfg.td_steps else 3
  copy = lambda tree: jax.tree.map(jnp.copy, tree)             # noqa: E731 (the update steps donate their states)
  return {"train": init_train_state(copy(ref), make_optimizer(cfg.optimizer, cfg.steps * max(cfg.actor_updates, 1))),
          "critic": init_train_state(copy(critic), make_optimizer(cfg.critic_optimizer,
                                                                  cfg.steps * cfg.critic_updates)),
          "target": critic, "ref": ref, "buffer": _buffer(cfg, env.obs_dim, fc.horizon, fc.action_dim),
          "obs": obs, "env": env_state,
          "acob": {"phase": jnp.int32(first), "phase_steps": jnp.int32(0), "td_round": jnp.int32(0),
                   "beta": jnp.float32(cfg.beta), "lr_scale": jnp.float32(1.0), "good_actor": copy(ref),
                   "ref_success": jnp.float32(-1.0), "gate_failed": jnp.int32(0)}}


def update_fns(cfg, fc, ref):
  """The iteration's jitted pieces and losses: critic targets, the critic's and the actor's losses for the shared
  update step, the actor's weighted batch, the Polyak update of the target critics."""
  q, v, _ = critics(cfg.critic_hidden)

  @jax.jit
  def targets(target, acting, mb, key, mc_phase):
    """(y for Q, y for V) of buffer rows: their MC returns in phase 1; else the chunked TD target with the floor
    for Q, and the target critics' value of the acting policy's chunk for V."""
    k1, k2 = jax.random.split(key)
    q_next = jnp.minimum(*q(target, mb["next_obs"], sample(acting, fc, mb["next_obs"], k1, cfg.sample_steps)))
    y = acob.calibrated_target(acob.chunk_td_target(mb["reward"], q_next, mb["done"], cfg.gamma, fc.horizon),
                               mb["mc"], (mb["ref"] * mb["has_mc"]) > 0)
    y_v = jnp.minimum(*q(target, mb["obs"], sample(acting, fc, mb["obs"], k2, cfg.sample_steps)))
    return jnp.where(mc_phase, mb["mc"], y), jnp.where(mc_phase, mb["mc"], y_v)

  def critic_loss(params, mb, step_inputs):
    q1, q2 = q(params, mb["obs"], mb["chunk"])
    w = mb["mask"]
    err = w * ((q1 - mb["y"]) ** 2 + (q2 - mb["y"]) ** 2 + (v(params, mb["obs"]) - mb["y_v"]) ** 2)
    loss = jnp.sum(err) / jnp.maximum(step_inputs["num_rows"], 1.0)
    return loss, {"critic/loss": Metric(loss)}

  def actor_loss(params, mb, step_inputs):
    loss, m = acob.actor_loss(params, ref, fc, mb, step_inputs["beta"])
    return loss, {"loss": Metric(loss), **{k: Metric(x) for k, x in m.items()}}

  @jax.jit
  def actor_batch(critic, mb, key):
    adv = jnp.minimum(*q(critic, mb["obs"], mb["chunk"])) - v(critic, mb["obs"])
    k1, k2 = jax.random.split(key)
    return {"obs": mb["obs"], "actions": mb["chunk"], "s": jax.random.uniform(k1, (mb["obs"].shape[0],)),
            "eps": jax.random.normal(k2, mb["chunk"].shape),
            "weights": acob.weights(adv, cfg.lam, cfg.w_max, cfg.binary_weights)}

  @jax.jit
  def polyak(target, params):
    return jax.tree.map(lambda t, p: (1 - cfg.tau) * t + cfg.tau * p, target, params)
  return targets, critic_loss, actor_loss, actor_batch, polyak, q


BUFFER_FIELDS = ("obs", "chunk", "reward", "next_obs", "done", "ref", "mc", "has_mc", "success")


def _draw(buffer: dict, key, batch: int) -> dict:
  idx = jax.random.randint(key, (batch,), 0, jnp.maximum(buffer["size"], 1))
  return {k: buffer[k][idx] for k in BUFFER_FIELDS}


def _run(ctx, cfg, state, start: int, meta: dict):
  env, task = env_of(cfg)
  fc = flow_config(cfg, env)
  collect = chunk_collector(env, fc.horizon, cfg.num_envs, cfg.decisions, cfg.gamma,
                            lambda params, obs, key: sample(params, fc, obs, key, cfg.sample_steps))
  targets, critic_loss, actor_loss, actor_batch, polyak, q = update_fns(cfg, fc, state["ref"])
  gamma_h = cfg.gamma ** fc.horizon
  critic_step = make_update_step(critic_loss, make_optimizer(cfg.critic_optimizer, cfg.steps * cfg.critic_updates),
                                 1, lambda b: {"num_rows": jnp.sum(b["mask"])})
  actor_steps = {}

  def actor_step(scale: float):
    """The actor's update step at `scale` x its learning rate (the trip-wire halves it; rebuilt only then)."""
    if scale not in actor_steps:
      section = ml_collections.ConfigDict(cfg.optimizer.to_dict())
      section.lr = cfg.optimizer.lr * scale
      actor_steps[scale] = make_update_step(actor_loss, make_optimizer(section, cfg.steps * max(cfg.actor_updates, 1)),
                                            1, lambda b: {"num_rows": b["obs"].shape[0]})
    return actor_steps[scale]

  def success_of(params, step):
    return evaluate_expert(ctx, cfg, params, 1_000_000 + step, meta["stage_index"])["eval/success"]

  @jax.jit
  def gate_values(critic, target, acting, rows, key):
    y, _ = targets(target, acting, rows, key, False)
    qmin = jnp.minimum(*q(critic, rows["obs"], rows["chunk"]))
    end = rows["has_mc"]
    cal = jnp.sum(end * jnp.abs(qmin - rows["mc"])) / jnp.maximum(jnp.sum(end), 1.0)
    return jnp.mean((y - qmin) ** 2), cal, qmin

  def iteration(state, _, key, iterator, step):
    a = jax.device_get(state["acob"])
    phase, beta, scale = int(a["phase"]), float(a["beta"]), float(a["lr_scale"])
    k_col, k_upd, k_act, k_gate = jax.random.split(key, 4)
    acting = state["ref"] if phase < 3 else state["train"].params
    traj, obs, env_state = collect(acting, 0.0 if phase < 3 else cfg.explore_noise, state["obs"], state["env"], k_col,
                                   task)
    g, has_end, succ = episode_labels(traj, gamma_h)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])                 # noqa: E731 [D, E, ...] -> [D E, ...]
    rows = {"obs": flat(traj["obs"]), "chunk": flat(traj["chunk"]), "reward": flat(traj["reward"]),
            "next_obs": flat(traj["next_obs"]), "done": flat(traj["done"]).astype(jnp.float32),
            "ref": jnp.full(flat(g).shape, float(phase < 3)), "mc": flat(g), "has_mc": flat(has_end),
            "success": flat(succ)}
    buffer = ring_push(state["buffer"], rows)
    critic, target, skipped = state["critic"], state["target"], []
    metrics = {"acob/phase": phase, "reward": float(traj["reward"].mean()),
               "episodes": float(traj["done"].sum()),
               "success": float(traj["success"].sum()) / max(float(traj["done"].sum()), 1.0)}
    losses = []
    for u in range(cfg.critic_updates):
      ku = jax.random.fold_in(k_upd, u)
      mb = _draw(buffer, ku, cfg.batch_size)
      y, y_v = targets(target, acting, mb, jax.random.fold_in(ku, 1), phase == 1)
      mask = mb["has_mc"] * mb["ref"] if phase == 1 else jnp.ones_like(y)
      critic, m = critic_step(critic, {"obs": mb["obs"], "chunk": mb["chunk"], "y": y, "y_v": y_v, "mask": mask}, {})
      losses.append(float(m["critic/loss"].value))
      target = polyak(target, critic.params)
    metrics["critic/loss"] = float(np.mean(losses))
    train = state["train"]
    if phase == 3:
      for u in range(cfg.actor_updates):
        ku = jax.random.fold_in(k_act, u)
        batch = actor_batch(critic.params, _draw(buffer, ku, cfg.batch_size), jax.random.fold_in(ku, 1))
        train, m = actor_step(scale)(train, batch, {"beta": jnp.float32(beta)})
        skipped.append(int(m["skipped_updates"].value))
        d_ref = float(m["acob/d_ref"].value)
        if np.isfinite(cfg.d_max):
          beta = acob.dual_update(beta, d_ref, cfg.d_max, cfg.beta_lr, cfg.beta_max)
        metrics.update({"loss": float(m["loss"].value), "acob/d_ref": d_ref,
                        "acob/weighted_fm": float(m["acob/weighted_fm"].value),
                        "acob/weight_mean": float(batch["weights"].mean())})
    a = {**a, "beta": beta, "phase_steps": int(a["phase_steps"]) + 1}
    # Phase changes (module docstring).
    if phase == 1 and a["phase_steps"] >= cfg.calibrate_steps:
      a.update(phase=2 if cfg.td_steps else 3, phase_steps=0)
    elif phase == 2 and a["phase_steps"] >= cfg.td_steps and not int(a["gate_failed"]):
      td, cal, qmin = gate_values(critic.params, target, acting, rows, k_gate)
      end = np.asarray(rows["has_mc"]) > 0
      auc = acob.auc(np.asarray(qmin)[end], np.asarray(rows["success"])[end])
      gate = acob.calibration_gate(float(td), float(cal), auc, cfg.eps_td, cfg.eps_cal, cfg.auc_min)
      metrics.update({"acob/gate_passed": float(gate["passed"]),
                      **{f"acob/gate_{k}": gate[k]["value"] for k in ("td_error", "calibration_error", "success_auc")}})
      if gate["passed"] or not cfg.gate:
        a.update(phase=3, phase_steps=0)
      elif int(a["td_round"]) + 1 >= cfg.td_rounds:
        a.update(gate_failed=1, phase_steps=0)          # stays in phase 2: the actor never moves
      else:
        a.update(td_round=int(a["td_round"]) + 1, phase_steps=0)
    elif phase == 3 and a["phase_steps"] % cfg.check_every == 0:
      if float(a["ref_success"]) < 0:
        a["ref_success"] = success_of(state["ref"], step)
      now = success_of(train.params, step)
      tripped = acob.tripwire(now, float(a["ref_success"]), cfg.margin)
      metrics.update({"acob/check_success": now, "acob/ref_success": float(a["ref_success"]),
                      "acob/tripped": float(tripped)})
      if tripped:
        train = train._replace(params=jax.tree.map(jnp.asarray, a["good_actor"]))
        a["lr_scale"] = float(a["lr_scale"]) / 2
      else:
        a["good_actor"] = jax.device_get(train.params)    # a host copy: the next step donates the actor's buffers
    metrics.update({"acob/beta": float(a["beta"]), "acob/gate_failed": float(a["gate_failed"]),
                    "acob/lr_scale": float(a["lr_scale"])})
    new_a = {"phase": jnp.int32(a["phase"]), "phase_steps": jnp.int32(a["phase_steps"]),
             "td_round": jnp.int32(a["td_round"]), "beta": jnp.float32(a["beta"]),
             "lr_scale": jnp.float32(a["lr_scale"]), "good_actor": a["good_actor"],
             "ref_success": jnp.float32(a["ref_success"]), "gate_failed": jnp.int32(a["gate_failed"])}
    return ({**state, "train": train, "critic": critic, "target": target, "buffer": buffer, "obs": obs,
             "env": env_state, "acob": new_a}, metrics, skipped)

  return loop(ctx, cfg, state, start, meta, StepIterator(), iteration, ("reward", "success", "acob/phase"))


def evaluate(ctx, params, global_step: int, index: int, samples=None) -> dict:
  return evaluate_expert(ctx, ctx.config[ctx.config.stages[index]], params, global_step, index)


register_stage("acob", Stage(_init, _run, acob_defaults, validate, needs=(), evaluate=evaluate))
