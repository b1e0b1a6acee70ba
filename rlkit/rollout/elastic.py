"""Elastic assignment of devices between rollout and training (QwenGyre, methods/systems.md §5), and a
discrete-event simulation that projects rollout/training schedules to clusters larger than this machine.

QwenGyre describes its scheduler at summary level only ("elastic cells" that switch between rollout and
training without interrupting live executions, driven by load), so the rule here is OUR DESIGN:

  QueueRule.decide(rollout, ready, batch)  ->  the rollout devices for the next learner step
      ready >= high x batch   the learner is the bottleneck (finished groups pile up): one device to training
      ready <  low x batch    the learner waits for samples: one device to rollout
      otherwise               unchanged; always within [min_rollout, devices - min_train]

On one machine `AsyncRollout.resize` applies it to the rollout workers (the learner's devices are fixed there);
`simulate` applies it to both sides of a cluster of `devices` devices:

  schedule "colocate"   every device generates the step's batch (synchronous: the step waits for its slowest
                        sample), then every device trains on it
  schedule "async"      a fixed split: `rollout` devices generate continuously, the others train; the learner
                        takes `batch` samples started at most `staleness` versions ago (older ones are discarded,
                        their work wasted)
  schedule "elastic"    async, with the split re-decided by `QueueRule` at every learner step

A device generates one sample at a time; a sample's generation time is drawn from a lognormal of mean
`gen_mean_s` and log-std `gen_sigma` (sigma > 1: the long tail of agent executions that synchronous steps wait
for); a learner step on d devices takes `train_s1 / d ** train_alpha + sync_s`. The result: samples trained per
second, the learner's idle fraction, the rollout devices' wasted fraction, the mean staleness of trained samples.
"""
from __future__ import annotations

import bisect
import dataclasses
import heapq
import math

import numpy as np

SCHEDULES = ("colocate", "async", "elastic")


@dataclasses.dataclass(frozen=True)
class QueueRule:
  devices: int
  high: float = 2.0
  low: float = 1.0
  min_rollout: int = 1
  min_train: int = 1

  def __post_init__(self):
    if self.devices < self.min_rollout + self.min_train:
      raise ValueError(f"elastic rule: {self.devices} devices cannot hold min_rollout={self.min_rollout} and "
                       f"min_train={self.min_train}.")
    if not 0 <= self.low <= self.high:
      raise ValueError(f"elastic rule: need 0 <= low ({self.low}) <= high ({self.high}).")

  def decide(self, rollout: int, ready: int, batch: int) -> int:
    if ready >= self.high * batch:
      rollout -= 1
    elif ready < self.low * batch:
      rollout += 1
    return int(min(max(rollout, self.min_rollout), self.devices - self.min_train))


@dataclasses.dataclass(frozen=True)
class Workload:
  batch: int = 64             # samples a learner step trains on
  gen_mean_s: float = 1.0     # mean generation time of one sample on one device
  gen_sigma: float = 0.5      # log-std of the lognormal generation time
  train_s1: float = 8.0       # a learner step on one device
  train_alpha: float = 0.9    # its scaling with devices: train_s1 / d ** alpha
  sync_s: float = 0.0         # weight sync per step


@dataclasses.dataclass(frozen=True)
class SimResult:
  throughput: float           # samples trained per second
  learner_idle: float         # fraction of the time the learner waited for samples (async, elastic)
  wasted: float               # fraction of generated samples discarded as stale
  staleness: float            # mean versions between a trained sample's start and its step
  staleness_max: int          # the largest
  rollout_mean: float         # mean rollout devices over the learner steps


def _gen_times(rng: np.random.Generator, w: Workload, n: int) -> np.ndarray:
  mu = math.log(w.gen_mean_s) - w.gen_sigma ** 2 / 2        # lognormal of mean gen_mean_s
  return rng.lognormal(mu, w.gen_sigma, n) if w.gen_sigma > 0 else np.full(n, w.gen_mean_s)


def _train_s(w: Workload, devices: int) -> float:
  return w.train_s1 / devices ** w.train_alpha + w.sync_s


def simulate(schedule: str, devices: int, w: Workload, steps: int = 50, rollout: int = 0, staleness: int = 1,
             rule: QueueRule | None = None, seed: int = 0) -> SimResult:
  """One schedule on `devices` devices for `steps` learner steps (module docstring). `rollout`: the async split
  and the elastic start (default half the devices)."""
  if schedule not in SCHEDULES:
    raise ValueError(f"simulate: schedule {schedule!r} is not one of {', '.join(SCHEDULES)}.")
  rng = np.random.default_rng(seed)
  if schedule == "colocate":
    t = 0.0
    for _ in range(steps):
      finish = [0.0] * devices                                 # each sample goes to the first free device
      for g in _gen_times(rng, w, w.batch):
        heapq.heappush(finish, heapq.heappop(finish) + float(g))
      t += max(finish) + _train_s(w, devices)
    return SimResult(steps * w.batch / t, 0.0, 0.0, 0.0, 0, float(devices))
  rollout = rollout or max(1, devices // 2)
  rule = rule or QueueRule(devices)
  r = min(max(rollout, rule.min_rollout), devices - rule.min_train)
  t, version, idle, generated, discarded = 0.0, 0, 0.0, 0, 0
  events = []                                                 # (finish time, device, version at start)
  ready: list = []                                            # versions at start of finished samples
  ends: list = []                                             # the learner steps' end times

  def start(device: int, now: float) -> None:
    nonlocal generated
    version_then = bisect.bisect_right(ends, now)             # steps finished by `now`
    heapq.heappush(events, (now + float(_gen_times(rng, w, 1)[0]), device, version_then))
    generated += 1

  for d in range(r):
    start(d, 0.0)
  trained_lag, splits = [], []

  def read(until: float) -> None:
    """Moves the samples finished by `until` into `ready`; their devices went on at their finish time."""
    while events and events[0][0] <= until:
      finish, device, v = heapq.heappop(events)
      ready.append(v)
      if device < r:                                          # a device moved to training stops after its sample
        start(device, finish)

  for _ in range(steps):
    read(t)                                                   # what finished while the learner trained
    if schedule == "elastic":                                 # on the fresh samples waiting for the learner
      r = rule.decide(r, sum(version - v <= staleness for v in ready), w.batch)
    splits.append(r)
    wait_from = t
    fresh = [v for v in ready if version - v <= staleness]    # drop stale, then wait for a batch
    discarded += len(ready) - len(fresh)
    ready = fresh
    while len(ready) < w.batch:
      t = max(t, events[0][0])                                # the learner waits for the next sample
      seen = len(ready)
      read(t)
      # The version is fixed while the learner waits, so only the samples just read can be stale.
      fresh = [v for v in ready[seen:] if version - v <= staleness]
      discarded += len(ready) - seen - len(fresh)
      del ready[seen:]
      ready.extend(fresh)
    idle += t - wait_from
    ready.sort(reverse=True)                                  # the freshest samples train first
    batch, ready = ready[:w.batch], ready[w.batch:]
    trained_lag += [version - v for v in batch]
    t += _train_s(w, devices - r)
    version += 1
    ends.append(t)
    running = {e[1] for e in events}
    for d in range(r):                                        # devices (re)assigned to rollout start generating
      if d not in running:
        start(d, t)
  return SimResult(steps * w.batch / t, idle / t, discarded / max(generated, 1), float(np.mean(trained_lag)),
                   int(max(trained_lag)), float(np.mean(splits)))
