"""The asynchronous collector (`rl.collector=async`, section `rl.async_rollout`): rollout workers apart from the
learner (rlkit/rollout/workers.py: in-process, or Ray actors) generate while it trains; the learner takes whole
groups no older than `max_staleness` policy versions (rlkit/rollout/async_rollout.py).

Every call of the collector is one policy version: it hands the workers the current weights, submits the step's
prompts (`group_size` samples each), and takes `prompts x group_size` finished samples, oldest groups first, so
with `prefetch` > 0 (batches submitted ahead at the first call) the workers generate step t+1's groups while
the learner trains on step t's: one-step-off-policy training at `prefetch=1, max_staleness=1`. `chunk_tokens`
> 0 makes rollouts partial: a sample is continued chunk by chunk, each under the version current then, and
the `Rollout` carries the version of every token (`extras["policy_version"]`, [N, R] int32) for corrections.
`prefetch=0, max_staleness=0` is synchronous: each step's own groups, sampled by the current policy.

The pool's queue, finished buffer, generation cursor and version go into the checkpoint with the data
iterator's state (rl_stage wraps the iterator for any collector with `get_state`), so a resumed run loses and
duplicates nothing. Single-process runs only (the workers serve one learner process).
"""
from __future__ import annotations

import dataclasses
import functools
import os

import jax
import ml_collections
import numpy as np

from rlkit.core.registry import choice
from rlkit.core.sections import RL_SECTIONS, Section
from rlkit.core.types import ROW_SOURCE, Rollout
from rlkit.models.tokenizer import left_padded_batches, pad_right
from rlkit.rollout.async_rollout import STALE_RULES, AsyncRollout
from rlkit.rollout.elastic import QueueRule
from rlkit.rollout.sampler import SamplingConfig, generate
from rlkit.rollout.workers import WORKER_BACKENDS, Generator, WorkerCrash
from rlkit.train.phases.collect import COLLECTORS, CollectorSpec, Samples


def async_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.backend = "inprocess"    # collector=async: the workers (WORKER_BACKENDS): inprocess (deterministic) | ray
  c.workers = 2              # collector=async: rollout workers
  c.items_per_call = 8       # collector=async: samples a worker continues per call (its decode batch)
  c.chunk_tokens = 0         # collector=async: tokens per call and sample (0: the whole rl.max_new_tokens, no
                             # partial rollouts); smaller chunks let a sample continue under newer weights
  c.max_staleness = 0        # collector=async: the learner's version minus a sample's oldest token's, at most
  c.prefetch = 0             # collector=async: batches of prompts submitted ahead of the learner
  c.stale = "requeue"        # collector=async: a group past the bound is dropped; requeue: sampled again
  c.timeout_s = 600.0        # collector=async: a worker call's wall limit, then the worker is replaced
  c.max_attempts = 3         # collector=async: calls a sample may fail (crash, timeout) before its group drops
  c.address = ""             # collector=async, backend=ray: "" starts a local cluster; "auto" or
                             # "ray://host:10001" joins an existing one
  c.num_cpus = 1.0           # collector=async, backend=ray: CPUs each worker actor reserves
  c.fault_rate = 0.0         # collector=async: fault injection for tests and experiments: each worker call dies with
                             # this probability (seeded by its first item's uid and attempt): an in-process
                             # worker raises WorkerCrash, a Ray actor's process exits
  c.elastic = False          # collector=async: resize the workers every step by rlkit/rollout/elastic.QueueRule
                             # (the samples waiting for the learner against the batch), in [1, max_workers]
  c.max_workers = 4          # collector=async, elastic: the most workers
  c.elastic_low = 1.0        # collector=async, elastic: fewer fresh samples waiting than low x batch: one more
  c.elastic_high = 2.0       # collector=async, elastic: at least high x batch waiting: one fewer
  return c


class PolicyGenerator(Generator):
  """A worker's policy: continues each item by at most `chunk` tokens with the KV-cache sampler under the
  weights of `version`. Keys: fold_in(seed, first uid of the call, its tokens so far), so a call is a function
  of its items, version and weights (a resumed in-process run repeats the uninterrupted one)."""

  def __init__(self, model, sampling: SamplingConfig, chunk: int, batch: int, seed: int, fault_rate: float = 0.0,
               exit_on_fault: bool = False):
    self.model, self.sampling, self.chunk, self.batch, self.seed = model, sampling, chunk, batch, seed
    self.fault_rate, self.exit_on_fault = fault_rate, exit_on_fault

  def step(self, items, version, weights):
    if self.fault_rate and np.random.default_rng([self.seed, items[0].uid, items[0].attempts,
                                                  len(items[0].tokens)]).random() < self.fault_rate:
      if self.exit_on_fault:   # a Ray actor: its process dies, as a lost node or the OOM killer would do it
        os._exit(1)
      raise WorkerCrash("injected fault (rl.async_rollout.fault_rate)")
    rows = [list(i.payload["prompt_ids"]) + list(i.tokens) for i in items]
    cfg = dataclasses.replace(self.sampling, max_new_tokens=self.chunk)
    key = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(self.seed), items[0].uid), len(items[0].tokens))
    for start, tokens, mask in left_padded_batches(rows, self.batch, self.sampling.pad_id):
      out = jax.device_get(generate(self.model, weights, tokens, mask, jax.random.fold_in(key, start), cfg))
      for j, item in enumerate(items[start:start + self.batch]):
        room = self.sampling.max_new_tokens - len(item.tokens)
        n = min(int(out.lengths[j]), room)
        item.tokens += [int(t) for t in out.response[j, :n]]
        item.logprobs += [float(x) for x in out.logprobs[j, :n]]
        item.versions += [int(version)] * n
        stopped = bool(out.finished[j]) and n == int(out.lengths[j])   # its stop token is in this chunk
        item.extra["finished"] = stopped
        item.done = stopped or len(item.tokens) >= self.sampling.max_new_tokens
    return items


class AsyncCollector:
  """The collect function of `rl.collector=async` (module docstring), with `get_state` / `set_state` for the
  checkpoint and `attach(iterator)` for prefetching."""

  def __init__(self, cfg, env):
    self.cfg, self.section = cfg, cfg.async_rollout
    self.pool, self.version, self.iterator, self._state, self.seed = None, 0, None, None, None

  def attach(self, iterator) -> None:
    self.iterator = iterator

  def _build(self, model, sampling: SamplingConfig, seed: int) -> AsyncRollout:
    factory, kwargs = pool_arguments(self.section, model, sampling, seed)
    pool = AsyncRollout(factory, **kwargs)
    if self._state is not None:
      pool.load_state_dict(self._state["pool"])
    return pool

  def __call__(self, model, params, batch, key, sampling, group_size, put_batch, first_group_id=0, perturb=None):
    if perturb is not None:
      raise ValueError("rl.collector='async' does not simulate an inference engine (rl.rollout_mismatch); "
                       "turn one of them off.")
    first = self.pool is None
    if first:   # the workers' seed: drawn at the run's first call, then kept in the state (a resume reuses it)
      self.seed = self._state["seed"] if self._state else int(jax.random.randint(key, (), 0, 2 ** 31 - 1))
      self.pool = self._build(model, sampling, self.seed)
    self.version += 1
    self.pool.set_weights(self.version, params if self.section.backend == "inprocess" else jax.device_get(params))
    before = dict(self.pool.counts)
    self.pool.submit(_payloads(batch), group_size)
    if first and self._state is None:
      for _ in range(int(self.section.prefetch)):
        self.pool.submit(_payloads(next(self.iterator)), group_size)
    n = len(batch["answer"]) * group_size
    if self.section.elastic:
      self.pool.resize(elastic_workers(self.section, len(self.pool.handles), self.pool.ready_count(), n))
    items = self.pool.take(n)
    samples = _samples(items, sampling, group_size, first_group_id, batch["prompt_tokens"].shape[1], put_batch)
    lag = [self.version - i.first_version() for i in items if i.versions]
    samples.metrics.update({f"async_{k}": self.pool.counts[k] - before[k] for k in before},
                           async_staleness_max=max(lag, default=0), async_staleness_sum=sum(lag),
                           async_workers=len(self.pool.handles))
    return samples

  def get_state(self) -> dict:
    if self.pool is None:
      return self._state or {"version": 0, "pool": None}
    return {"version": self.version, "seed": self.seed, "pool": self.pool.state_dict()}

  def set_state(self, state: dict) -> None:
    self.version = int(state["version"])
    self._state = state if state.get("pool") is not None else None


def pool_arguments(a, model, sampling: SamplingConfig, seed: int) -> tuple:
  """(the workers' generator factory, AsyncRollout's keyword arguments) of an `rl.async_rollout` section."""
  chunk = int(a.chunk_tokens) or sampling.max_new_tokens
  factory = functools.partial(PolicyGenerator, model, sampling, chunk, int(a.items_per_call), seed,
                              float(a.fault_rate), a.backend == "ray")
  options = {"address": a.address, "num_cpus": float(a.num_cpus)} if a.backend == "ray" else {}
  return factory, dict(backend=a.backend, workers=int(a.workers), items_per_call=int(a.items_per_call),
                       max_staleness=int(a.max_staleness), timeout_s=float(a.timeout_s),
                       max_attempts=int(a.max_attempts), stale=a.stale, backend_options=options)


def elastic_workers(a, workers: int, ready: int, n: int) -> int:
  """The workers for the next take under `rl.async_rollout.elastic`: QueueRule over the learner (one "device")
  and at most `max_workers` workers, from the `ready` samples waiting against the `n` the learner takes."""
  rule = QueueRule(int(a.max_workers) + 1, float(a.elastic_high), float(a.elastic_low))
  return rule.decide(workers, ready, n)


def _payloads(batch) -> list:
  return [{"prompt_ids": [int(t) for t in batch["prompt_tokens"][i][batch["prompt_mask"][i]]],
           "example": {"prompt": batch["prompt"][i], "answer": batch["answer"][i],
                       "demonstration": batch["demonstration"][i],
                       "fields": batch["fields"][i] if "fields" in batch else {}}}
          for i in range(len(batch["answer"]))]


def _samples(items, sampling: SamplingConfig, group_size: int, first_group_id: int, prompt_len: int,
             put_batch) -> Samples:
  """The taken items as `Samples` (groups in order; group ids from `first_group_id`)."""
  pad = sampling.pad_id
  width = sampling.max_new_tokens
  prompt = np.full((len(items), prompt_len), pad, np.int32)
  prompt_mask = np.zeros((len(items), prompt_len), bool)
  for r, item in enumerate(items):
    ids = item.payload["prompt_ids"]
    prompt[r, prompt_len - len(ids):], prompt_mask[r, prompt_len - len(ids):] = ids, True
  response, mask = pad_right([i.tokens for i in items], width, pad)
  logprobs = pad_right([[0] * len(i.tokens) for i in items], width, 0)[0].astype(np.float32)
  versions = pad_right([i.versions for i in items], width, -1)[0].astype(np.int32)
  for r, item in enumerate(items):
    logprobs[r, :len(item.logprobs)] = item.logprobs
  groups = (first_group_id + np.arange(len(items)) // group_size).astype(np.int32)
  host = dict(prompt=prompt, prompt_mask=prompt_mask, response=response, response_mask=mask, logprobs=logprobs,
              lengths=mask.sum(1).astype(np.int32),
              finished=np.array([bool(i.extra.get("finished")) for i in items]), group_ids=groups,
              policy_version=versions)
  dev = put_batch(host)
  rollout = Rollout(**{k: dev[k] for k in host if k != "policy_version"},
                    extras={"policy_version": dev["policy_version"]})
  examples = [i.payload["example"] for i in items]
  return Samples(rollout, examples, np.full(len(items), ROW_SOURCE["policy"], np.int32), np.ones(len(items), bool))


def _check(stage, name: str) -> None:
  a, where = stage.async_rollout, f"{name}.async_rollout"
  choice(a.backend, WORKER_BACKENDS, f"{where}.backend")
  if a.stale not in STALE_RULES:
    raise ValueError(f"{where}.stale={a.stale!r} is not one of {', '.join(STALE_RULES)}.")
  for key, low in (("workers", 1), ("items_per_call", 1), ("chunk_tokens", 0), ("max_staleness", 0),
                   ("prefetch", 0), ("max_attempts", 1)):
    value = a[key]
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
      raise ValueError(f"{where}.{key}={value!r} must be an integer >= {low}.")
  if not 0.0 <= float(a.fault_rate) < 1.0:
    raise ValueError(f"{where}.fault_rate={a.fault_rate} must be in [0, 1).")
  if a.elastic and (not isinstance(a.max_workers, int) or a.max_workers < 1 or
                    not 0 <= float(a.elastic_low) <= float(a.elastic_high)):
    raise ValueError(f"{where}: elastic needs max_workers >= 1 and 0 <= elastic_low <= elastic_high, got "
                     f"{a.max_workers}, {a.elastic_low}, {a.elastic_high}.")
  if a.prefetch > a.max_staleness:
    raise ValueError(f"{where}.prefetch={a.prefetch} submits batches the learner takes {a.prefetch} versions "
                     f"later, past max_staleness={a.max_staleness}: they would be dropped; raise max_staleness "
                     "to at least prefetch.")
  if jax.process_count() > 1:
    raise ValueError(f"{name}.collector='async' runs on one process so far; run single-process.")
  if stage.sync.kind and any(int(v) for v in stage.sync.mesh.values()):
    raise ValueError(f"{name}.collector='async' samples on its workers, not on a sampler mesh: unset "
                     f"{name}.sync.mesh.")


COLLECTORS.add("async", CollectorSpec(AsyncCollector, _check))
RL_SECTIONS.add("async_rollout", Section(async_defaults, lambda stage, name: None,
                                         doc="the asynchronous collector's workers (collector=async)"))
