"""ACoB's iteration (rlkit/embodied/acob_stage.py has the stage and the method's description) as an object with an
actor side and a learner side, so one code path serves the stage's plain loop and ACoB-Stream
(rlkit/embodied/stream.py):

  snapshot(state) -> what acting needs: the acting params (pi_ref in phases 1-2, the actor in 3), the exploration
                     noise, the phase
  collect(snapshot, obs, env state, key) -> (rows, stats, obs, env state): one collection, labelled
  learn(state, rows, stats, keys, step, actor_ok) -> (state, metrics, skipped): push the rows, the critic steps, the
                     actor steps (phase 3, when `actor_ok`: ACoB-Stream withholds too stale rows from the actor),
                     the phase changes, the gate, dual ascent and the trip-wire
  iteration(state, key, step) = collect(snapshot(state), ...) then learn(...): the stage's loop

`success_of(params, step)` is the trip-wire's evaluation (the stage passes its evaluation of the expert).
`learn_steps(section)` is how many learn steps the stage takes (what its optimizers' schedules span).
"""
from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.core.types import Metric
from rlkit.embodied import acob
from rlkit.embodied.bc_stage import env_of, flow_config
from rlkit.embodied.episodes import chunk_collector, episode_labels, ring_push
from rlkit.embodied.flow_rl_stage import Critic
from rlkit.models.flow import sample
from rlkit.optim.optimizers import make_optimizer
from rlkit.train.steps import make_update_step


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


def learn_steps(cfg) -> int:
  """The stage's learn steps: one per iteration, or `stream.block` per iteration in a stream mode."""
  return cfg.steps * (cfg.stream.block if cfg.stream.mode != "off" else 1)


class AcobLoop:
  """The jitted pieces of ACoB's iteration for one stage section (module docstring)."""

  def __init__(self, cfg, ref, success_of: Callable):
    self.cfg, self.success_of = cfg, success_of
    self.env, self.task = env_of(cfg)
    fc = self.fc = flow_config(cfg, self.env)
    self.collector = chunk_collector(self.env, fc.horizon, cfg.num_envs, cfg.decisions, cfg.gamma,
                                     lambda params, obs, key: sample(params, fc, obs, key, cfg.sample_steps))
    (self.targets, critic_loss, self.actor_loss, self.actor_batch, self.polyak, self.q) = update_fns(cfg, fc, ref)
    self.gamma_h = cfg.gamma ** fc.horizon
    self.critic_step = make_update_step(critic_loss, make_optimizer(cfg.critic_optimizer,
                                                                    learn_steps(cfg) * cfg.critic_updates),
                                        1, lambda b: {"num_rows": jnp.sum(b["mask"])})
    self._actor_steps = {}
    q = self.q

    @jax.jit
    def gate_values(critic, target, acting, rows, key):
      y, _ = self.targets(target, acting, rows, key, False)
      qmin = jnp.minimum(*q(critic, rows["obs"], rows["chunk"]))
      end = rows["has_mc"]
      cal = jnp.sum(end * jnp.abs(qmin - rows["mc"])) / jnp.maximum(jnp.sum(end), 1.0)
      return jnp.mean((y - qmin) ** 2), cal, qmin
    self.gate_values = gate_values

  def actor_step(self, scale: float):
    """The actor's update step at `scale` x its learning rate (the trip-wire halves it; rebuilt only then)."""
    if scale not in self._actor_steps:
      cfg = self.cfg
      section = ml_collections.ConfigDict(cfg.optimizer.to_dict())
      section.lr = cfg.optimizer.lr * scale
      self._actor_steps[scale] = make_update_step(self.actor_loss, make_optimizer(section, learn_steps(cfg) * max(
          cfg.actor_updates, 1)), 1, lambda b: {"num_rows": b["obs"].shape[0]})
    return self._actor_steps[scale]

  def snapshot(self, state) -> dict:
    phase = int(jax.device_get(state["acob"]["phase"]))
    return {"params": state["ref"] if phase < 3 else state["train"].params, "phase": phase,
            "noise": 0.0 if phase < 3 else self.cfg.explore_noise}

  def collect(self, snap: dict, obs, env_state, key):
    """One collection by the snapshot's policy: (rows [D E, ...] for the buffer, stats, obs, env state)."""
    traj, obs, env_state = self.collector(snap["params"], snap["noise"], obs, env_state, key, self.task)
    g, has_end, succ = episode_labels(traj, self.gamma_h)
    flat = lambda x: x.reshape((-1,) + x.shape[2:])               # noqa: E731 [D, E, ...] -> [D E, ...]
    rows = {"obs": flat(traj["obs"]), "chunk": flat(traj["chunk"]), "reward": flat(traj["reward"]),
            "next_obs": flat(traj["next_obs"]), "done": flat(traj["done"]).astype(jnp.float32),
            "ref": jnp.full(flat(g).shape, float(snap["phase"] < 3)), "mc": flat(g), "has_mc": flat(has_end),
            "success": flat(succ)}
    episodes = float(traj["done"].sum())
    stats = {"reward": float(traj["reward"].mean()), "episodes": episodes,
             "success": float(traj["success"].sum()) / max(episodes, 1.0)}
    return rows, stats, obs, env_state

  def learn(self, state, rows: dict, stats: dict, keys, step: int, actor_ok: bool = True):
    """`keys` = (critic updates, actor updates, gate) keys; the module docstring says the rest."""
    cfg, (k_upd, k_act, k_gate) = self.cfg, keys
    a = jax.device_get(state["acob"])
    phase, beta, scale = int(a["phase"]), float(a["beta"]), float(a["lr_scale"])
    acting = state["ref"] if phase < 3 else state["train"].params
    buffer = ring_push(state["buffer"], rows)
    critic, target, skipped = state["critic"], state["target"], []
    metrics, losses = {"acob/phase": phase, **stats}, []
    for u in range(cfg.critic_updates):
      ku = jax.random.fold_in(k_upd, u)
      mb = _draw(buffer, ku, cfg.batch_size)
      y, y_v = self.targets(target, acting, mb, jax.random.fold_in(ku, 1), phase == 1)
      mask = mb["has_mc"] * mb["ref"] if phase == 1 else jnp.ones_like(y)
      critic, m = self.critic_step(critic, {"obs": mb["obs"], "chunk": mb["chunk"], "y": y, "y_v": y_v,
                                            "mask": mask}, {})
      losses.append(float(m["critic/loss"].value))
      target = self.polyak(target, critic.params)
    metrics["critic/loss"] = float(np.mean(losses))
    train = state["train"]
    if phase == 3 and actor_ok:
      for u in range(cfg.actor_updates):
        ku = jax.random.fold_in(k_act, u)
        batch = self.actor_batch(critic.params, _draw(buffer, ku, cfg.batch_size), jax.random.fold_in(ku, 1))
        train, m = self.actor_step(scale)(train, batch, {"beta": jnp.float32(beta)})
        skipped.append(int(m["skipped_updates"].value))
        d_ref = float(m["acob/d_ref"].value)
        if np.isfinite(cfg.d_max):
          beta = acob.dual_update(beta, d_ref, cfg.d_max, cfg.beta_lr, cfg.beta_max)
        metrics.update({"loss": float(m["loss"].value), "acob/d_ref": d_ref,
                        "acob/weighted_fm": float(m["acob/weighted_fm"].value),
                        "acob/weight_mean": float(batch["weights"].mean())})
    a = {**a, "beta": beta, "phase_steps": int(a["phase_steps"]) + 1}
    train = self._phase_change(state, a, phase, train, critic, target, acting, rows, k_gate, step, metrics)
    metrics.update({"acob/beta": float(a["beta"]), "acob/gate_failed": float(a["gate_failed"]),
                    "acob/lr_scale": float(a["lr_scale"])})
    new_a = {"phase": jnp.int32(a["phase"]), "phase_steps": jnp.int32(a["phase_steps"]),
             "td_round": jnp.int32(a["td_round"]), "beta": jnp.float32(a["beta"]),
             "lr_scale": jnp.float32(a["lr_scale"]), "good_actor": a["good_actor"],
             "ref_success": jnp.float32(a["ref_success"]), "gate_failed": jnp.int32(a["gate_failed"])}
    return ({**state, "train": train, "critic": critic, "target": target, "buffer": buffer, "acob": new_a},
            metrics, skipped)

  def _phase_change(self, state, a: dict, phase: int, train, critic, target, acting, rows, k_gate, step,
                    metrics: dict):
    """The phase changes, the gate and the trip-wire (acob_stage's docstring); updates `a` and `metrics`, returns
    the actor's TrainState (rolled back when the trip-wire fires)."""
    cfg = self.cfg
    if phase == 1 and a["phase_steps"] >= cfg.calibrate_steps:
      a.update(phase=2 if cfg.td_steps else 3, phase_steps=0)
    elif phase == 2 and a["phase_steps"] >= cfg.td_steps and not int(a["gate_failed"]):
      td, cal, qmin = self.gate_values(critic.params, target, acting, rows, k_gate)
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
        a["ref_success"] = self.success_of(state["ref"], step)
      now = self.success_of(train.params, step)
      tripped = acob.tripwire(now, float(a["ref_success"]), cfg.margin)
      metrics.update({"acob/check_success": now, "acob/ref_success": float(a["ref_success"]),
                      "acob/tripped": float(tripped)})
      if tripped:
        train = train._replace(params=jax.tree.map(jnp.asarray, a["good_actor"]))
        a["lr_scale"] = float(a["lr_scale"]) / 2
      else:
        a["good_actor"] = jax.device_get(train.params)    # a host copy: the next step donates the actor's buffers
    return train

  def iteration(self, state, key, step: int):
    """The stage's iteration: collect with the state's own policy, then learn."""
    k_col, k_upd, k_act, k_gate = jax.random.split(key, 4)
    rows, stats, obs, env_state = self.collect(self.snapshot(state), state["obs"], state["env"], k_col)
    state, metrics, skipped = self.learn(state, rows, stats, (k_upd, k_act, k_gate), step)
    return {**state, "obs": obs, "env": env_state}, metrics, skipped
