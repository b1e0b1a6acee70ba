"""Rollout workers apart from the learner: an in-process backend for deterministic tests, and Ray actors.

A worker holds a generator (the policy's sampler, or a test's stand-in) built once by `factory()` in the
worker's own process, and answers one call at a time:

  worker.step(items, version, weights) -> items     continue each `WorkItem` by at most one chunk with the
                                                    policy of `version` (loading `weights` when its version
                                                    changed), and return the items as they are now

The scheduler (rlkit/rollout/async_rollout.py) owns the items: a worker keeps nothing between calls except the
loaded weights, so a worker that dies or hangs loses only its call in flight, which the scheduler re-queues
from the items' last returned state. Backends (registry `WORKER_BACKENDS`) make `WorkerHandle`s:

  inprocess  the call runs when it is started, in this process, in order: deterministic, no parallelism. A
             generator can simulate faults: raising `WorkerCrash` is a dying worker; returning `HANG` is one
             that never answers (the scheduler's timeout, on its injected clock, then kills it).
  ray        each worker is a Ray actor (one process); `ray.init` starts a local cluster on this machine
             (`address=""`), or joins an existing one (`address="auto"` or "ray://host:10001"). Weights go
             into Ray's object store once per version and every actor reads them from there. An actor that
             dies (killed, out of memory, its node lost) surfaces as `WorkerCrash` on its call.

A `WorkItem` is one trajectory in progress: its request id (`uid`, from the scheduler's generation cursor), the
payload the generator needs (a prompt, a seed), the tokens and log-probs produced so far, and the policy
version that produced each token (`versions`), so a trajectory carried across weight updates (a partial
rollout) says exactly which policy wrote what, and a correction can use it.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional, Protocol

from rlkit.core.registry import Registry

HANG = object()   # an in-process generator's answer for "this call never returns" (fault injection)


class WorkerCrash(RuntimeError):
  """The worker died during a call (its process exited, was killed, or raised)."""


@dataclasses.dataclass
class WorkItem:
  uid: int                                   # the request's number from the generation cursor (unique)
  payload: Any                               # what the generator needs to start (prompt, seed, ...)
  tokens: list = dataclasses.field(default_factory=list)      # generated so far
  logprobs: list = dataclasses.field(default_factory=list)    # the behaviour log-prob of each token
  versions: list = dataclasses.field(default_factory=list)    # the policy version that produced each token
  done: bool = False
  attempts: int = 0                          # calls that failed (crash or timeout) while it was in them
  group: int = 0                             # the group it belongs to (a prompt's samples are delivered together)
  group_size: int = 1
  extra: dict = dataclasses.field(default_factory=dict)       # generator-owned state carried between chunks

  def first_version(self) -> Optional[int]:
    return self.versions[0] if self.versions else None

  def to_dict(self) -> dict:
    return dataclasses.asdict(self)

  @staticmethod
  def from_dict(d: dict) -> "WorkItem":
    return WorkItem(**d)


class Generator(Protocol):
  """What a worker runs: `step(items, version, weights) -> items` (see the module docstring)."""

  def step(self, items: list, version: int, weights: Any) -> list: ...


class CountingGenerator(Generator):
  """A stand-in policy for tests, benchmarks and simulations of the scheduler (importable in any worker
  process, as Ray actors need): appends `chunk` tokens per call, token = weights["bias"] + position, log-prob
  -version / 10, done at payload["length"] tokens, after `work_s` seconds of sleep per token. Faults by payload:
  "crash": N raises WorkerCrash while the item's attempts < N; "hang": N never answers while attempts < N
  (in-process: HANG; elsewhere it sleeps for an hour)."""

  def __init__(self, chunk: int = 2, work_s: float = 0.0):
    self.chunk, self.work_s = chunk, work_s

  def step(self, items, version, weights):
    import time
    for item in items:
      if item.attempts < item.payload.get("crash", 0):
        raise WorkerCrash("injected crash")
      if item.attempts < item.payload.get("hang", 0):
        if self.work_s:
          time.sleep(3600)
        return HANG
    for item in items:
      for _ in range(min(self.chunk, item.payload["length"] - len(item.tokens))):
        time.sleep(self.work_s)
        item.tokens.append(weights["bias"] + len(item.tokens))
        item.logprobs.append(-version / 10)
        item.versions.append(version)
      item.done = len(item.tokens) >= item.payload["length"]
    return items


class WorkerHandle(Protocol):
  """The driver's view of one worker: start a call, ask whether it answered, read the answer (raising
  WorkerCrash if the worker died in the call), kill it."""

  def start(self, items: list, version: int, weights: Any) -> None: ...

  def ready(self) -> bool: ...

  def result(self) -> list: ...

  def kill(self) -> None: ...


class Backend(NamedTuple):
  make: Callable          # (factory, index, **options) -> WorkerHandle
  setup: Callable         # (**options) -> None: start or join the cluster (idempotent)
  put: Callable           # weights -> what `start` passes (a Ray object ref, or the weights)


WORKER_BACKENDS: Registry[Backend] = Registry("rollout worker backend")


class InProcessHandle(WorkerHandle):
  def __init__(self, factory: Callable[[], Generator], index: int = 0, **options):
    del options
    self.index, self.generator, self._answer, self._pending = index, factory(), None, False

  def start(self, items, version, weights):
    self._pending = True
    try:
      self._answer = self.generator.step([WorkItem.from_dict(i.to_dict()) for i in items], version, weights)
    except WorkerCrash as e:
      self._answer = e

  def ready(self):
    return self._pending and self._answer is not HANG

  def result(self):
    answer, self._answer, self._pending = self._answer, None, False
    if isinstance(answer, WorkerCrash):
      raise answer
    return answer

  def kill(self):
    self._answer, self._pending = None, False


WORKER_BACKENDS.add("inprocess", Backend(make=InProcessHandle, setup=lambda **options: None,
                                         put=lambda weights: weights))


# ----------------------------------------------------------------------------------------------------- Ray

def _ray():
  try:
    import ray
  except ImportError:
    raise RuntimeError("rollout worker backend 'ray' needs the ray package: pip install -e '.[ray]' (or "
                       "pip install ray), or use the 'inprocess' backend.") from None
  return ray


def ray_setup(address: str = "", cluster_cpus: int = 0, **options) -> None:
  """Starts a local Ray cluster (`address=""`, `cluster_cpus` CPUs, 0: all) or joins `address`; once per
  process. (`num_cpus` among `options` is each worker actor's reservation, `RayHandle`'s.)"""
  del options
  ray = _ray()
  if ray.is_initialized():
    return
  kwargs = dict(include_dashboard=False, log_to_driver=False, configure_logging=False)
  if address:
    ray.init(address=address, **kwargs)
  else:
    ray.init(num_cpus=cluster_cpus or None, **kwargs)


class _Actor:
  """The Ray actor's body: builds the generator in the actor's process and answers `step` calls."""

  def __init__(self, factory):
    self.generator = factory()

  def step(self, items, version, weights):
    return [i.to_dict() for i in self.generator.step([WorkItem.from_dict(d) for d in items], version, weights)]

  def pid(self):
    import os
    return os.getpid()


class RayHandle(WorkerHandle):
  def __init__(self, factory: Callable[[], Generator], index: int = 0, num_cpus: float = 1.0, **options):
    del options
    ray = _ray()
    self.index, self._ref = index, None
    self.actor = ray.remote(num_cpus=num_cpus, max_restarts=0)(_Actor).remote(factory)

  def start(self, items, version, weights):
    self._ref = self.actor.step.remote([i.to_dict() for i in items], version, weights)

  def ready(self):
    ray = _ray()
    return self._ref is not None and bool(ray.wait([self._ref], timeout=0)[0])

  def result(self):
    ray = _ray()
    ref, self._ref = self._ref, None
    try:
      return [WorkItem.from_dict(d) for d in ray.get(ref)]
    except (ray.exceptions.RayActorError, ray.exceptions.WorkerCrashedError) as e:
      cause = str(e).strip().splitlines()[-1][:300] if str(e).strip() else ""
      raise WorkerCrash(f"ray worker {self.index} died: {type(e).__name__} {cause}") from None
    except ray.exceptions.RayTaskError as e:
      raise WorkerCrash(f"ray worker {self.index} raised: {e.cause!r}") from None

  def kill(self):
    _ray().kill(self.actor, no_restart=True)
    self._ref = None


WORKER_BACKENDS.add("ray", Backend(make=RayHandle, setup=ray_setup, put=lambda weights: _ray().put(weights)))
