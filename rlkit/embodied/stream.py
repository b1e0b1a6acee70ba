"""ACoB-Stream (methods/embodied.md §3.3; DESIGN): the actor side and the learner side of ACoB's iteration
(rlkit/embodied/acob_loop.py) on their own threads, so neither waits for the other.

  worker   takes the latest published snapshot (the acting params, noise, phase) with its version v, infers (an
           emulated `infer_s` delay around the jitted policy, standing in for a large model's inference), executes
           (`exec_s` per chunk, standing in for a robot's execution), labels the collection and queues it with v
  learner  takes the queued collections in order; each carries its staleness (the learner's version now - v);
           the critic learns from every one (off-policy), the actor only from those with staleness <= max_staleness;
           every `publish_every` learn steps it publishes its params (the version advances)

`mode="sync"` runs the same calls in one thread in the plain loop's order (collect with the learner's current
policy, then learn; publish after every step): with publish_every = 1 it *is* the stage's iteration (acob_loop's
`iteration`), number for number, which the tests check; `mode="stream"` overlaps them and is not deterministic.
Throughput model: per chunk, synchronous ~ t_inf + t_exec + t_learn; streaming ~ max(t_inf + t_exec, t_learn),
capped by the cores (2 here: threads share them with XLA).

`run_stream` returns the learner's state, its metric rows (one per learn step, with `stream/staleness` and
`stream/actor_used`) and the run's counts and rates (collections, learn steps, seconds, decisions/s, learns/s,
the staleness histogram, the learn steps' skipped-update flags). The acob stage runs it one block of learn steps
per iteration (`acob.stream`, configs); `block_metrics` is such an iteration's metrics row.
"""
from __future__ import annotations

import queue
import threading
import time

import jax
import jax.numpy as jnp


STREAM_MODES = ("off", "sync", "stream")     # the acob stage's `stream.mode` ("off": its plain loop)


class Published:
  """The learner's latest snapshot and its version, swapped atomically."""

  def __init__(self, snap: dict):
    self._lock = threading.Lock()
    self._snap, self.version = snap, 0

  def get(self) -> tuple[dict, int]:
    with self._lock:
      return self._snap, self.version

  def publish(self, snap: dict) -> None:
    with self._lock:
      self._snap, self.version = snap, self.version + 1


def _keys(key, i: int):
  """The plain loop's keys of iteration i: (collect, (critic updates, actor updates, gate))."""
  k_col, k_upd, k_act, k_gate = jax.random.split(jax.random.fold_in(key, i), 4)
  return k_col, (k_upd, k_act, k_gate)


def run_stream(loop, state: dict, steps: int, key, mode: str = "sync", publish_every: int = 1,
               max_staleness: int = 1, infer_s: float = 0.0, exec_s: float = 0.0, start: int = 0):
  """`steps` learn steps of `loop` (an AcobLoop) from `state` (module docstring); iteration i's keys are those of
  the stage's iteration `start + i` under `key` (the stage's key)."""
  if mode not in ("sync", "stream"):
    raise ValueError(f"run_stream: mode={mode!r}; use 'sync' or 'stream'.")
  rows, staleness, flags = [], {}, []
  t0 = time.perf_counter()
  decisions = loop.cfg.num_envs * loop.cfg.decisions
  if mode == "sync":
    for i in range(steps):
      k_col, k_learn = _keys(key, start + i)
      time.sleep(infer_s)
      batch, stats, obs, env_state = loop.collect(loop.snapshot(state), state["obs"], state["env"], k_col)
      time.sleep(exec_s * loop.cfg.decisions)
      state, metrics, skipped = loop.learn(state, batch, stats, k_learn, start + i)
      flags += [int(x) for x in skipped]
      state = {**state, "obs": obs, "env": env_state}
      rows.append({**metrics, "stream/staleness": 0, "stream/actor_used": 1.0})
      staleness[0] = staleness.get(0, 0) + 1
    collections = steps
  else:
    # A published snapshot holds copies: the learner's actor step donates its own buffers while the worker acts.
    owned = lambda snap: {**snap, "params": jax.tree.map(jnp.copy, snap["params"])}   # noqa: E731
    published = Published(owned(loop.snapshot(state)))
    todo: queue.Queue = queue.Queue(maxsize=2)
    stop = threading.Event()
    errors = []
    env = {"obs": state["obs"], "env": state["env"]}

    def worker():
      n = 0
      try:
        while not stop.is_set():
          snap, version = published.get()
          time.sleep(infer_s)
          k_col, _ = _keys(jax.random.fold_in(key, 0x5EED), n)
          batch, stats, env["obs"], env["env"] = loop.collect(snap, env["obs"], env["env"], k_col)
          time.sleep(exec_s * loop.cfg.decisions)
          while not stop.is_set():
            try:
              todo.put((version, batch, stats), timeout=0.1)
              break
            except queue.Full:
              continue
          n += 1
      except Exception as e:                                         # noqa: BLE001 (re-raised by the learner)
        errors.append(e)

    thread = threading.Thread(target=worker, daemon=True)
    thread.start()
    collections, since = 0, 0
    try:
      for i in range(steps):
        while True:
          if errors:
            raise errors[0]
          try:
            version, batch, stats = todo.get(timeout=0.1)
            break
          except queue.Empty:
            continue
        collections += 1
        lag = published.version - version
        staleness[lag] = staleness.get(lag, 0) + 1
        _, k_learn = _keys(key, start + i)
        state, metrics, skipped = loop.learn(state, batch, stats, k_learn, start + i, actor_ok=lag <= max_staleness)
        flags += [int(x) for x in skipped]
        rows.append({**metrics, "stream/staleness": lag, "stream/actor_used": float(lag <= max_staleness)})
        since += 1
        if since >= publish_every:
          published.publish(owned(loop.snapshot(state)))
          since = 0
    finally:
      stop.set()
      thread.join(timeout=30)
    state = {**state, **env}
  seconds = time.perf_counter() - t0
  return state, rows, {"collections": collections, "learn_steps": steps, "seconds": seconds,
                       "decisions_per_s": collections * decisions / seconds, "learns_per_s": steps / seconds,
                       "staleness": dict(sorted(staleness.items())), "skipped": flags}


def block_metrics(rows: list, stats: dict) -> dict:
  """One stage iteration's metrics from a block of learn steps: each metric's mean over the block (the acob/*
  state, e.g. the phase and beta, as at the block's end), plus the block's decisions/s, learns/s and mean
  staleness."""
  out = {}
  for key in {k for r in rows for k in r}:
    values = [float(r[key]) for r in rows if key in r]
    out[key] = values[-1] if key.startswith("acob/") else sum(values) / len(values)
  lags = stats["staleness"]
  out.update({"stream/decisions_per_s": stats["decisions_per_s"], "stream/learns_per_s": stats["learns_per_s"],
              "stream/staleness": sum(k * n for k, n in lags.items()) / max(sum(lags.values()), 1)})
  return out
