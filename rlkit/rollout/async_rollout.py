"""Asynchronous rollout: a scheduler that keeps rollout workers (rlkit/rollout/workers.py) generating while the
learner trains, and hands the learner finished trajectories no older than a staleness bound.

  pool = AsyncRollout(factory, backend="ray", workers=2, max_staleness=2)
  pool.set_weights(0, weights)             # version 0
  uids = pool.submit(payloads, group_size=4)   # 4 samples of each payload; the cursor numbers every request
  batch = pool.take(4 * len(payloads))     # whole groups of finished WorkItems, oldest token <= 2 versions old
  ... train ...; pool.set_weights(1, new_weights)

Guarantees, each tested:
- **Whole groups.** The samples of one payload (a group, for group-relative advantages) are delivered together
  or not at all: `take` returns complete eligible groups only, and a member that is dropped takes its group
  with it.
- **Exactly once.** A request lives in one place at a time: the queue, one worker's call in flight, or the
  finished buffer; `take` removes what it returns. A worker that crashes (`WorkerCrash`) or misses its deadline
  (`timeout_s` on `clock`) is killed and replaced; the items of its call go back to the queue from their last
  returned state (`attempts` + 1), or are dropped after `max_attempts` (counted). A late answer of a killed
  worker is never read.
- **Staleness.** An item is eligible when `version - first_version <= max_staleness` (its oldest token's policy);
  one past the bound can never become eligible, so its group is dropped the moment that is known (on
  `set_weights`, when a chunk returns) and, with `stale="requeue"`, its payload is submitted again as a new group
  (new uids: the stale ones are never delivered). The learner never trains on data older than the bound.
- **Partial rollouts.** An unfinished item returns to the queue after each chunk and continues under whatever
  version is current then; `versions` records the policy of every token.
- **Checkpointable.** `state_dict()` holds the cursor, the version, the queue (items in flight as of their last
  returned state), the finished buffer and the counters; `load_state_dict` restores them into fresh workers, so
  a resumed run loses and duplicates nothing (with the in-process backend and a generator that is a function of
  the item, version and weights, it repeats the uninterrupted run exactly).

Scheduling is FIFO, one call per worker at a time, `items_per_call` items per call, workers served in index
order: deterministic on the in-process backend. `pump()` is one scheduling round; `take` pumps until it can
answer. `resize(n)` changes the number of workers (QwenGyre-style elastic assignment, rlkit/rollout/elastic.py):
new workers start at once, retired ones finish their call first.
"""
from __future__ import annotations

import collections
import time
from typing import Any, Callable, Optional, Sequence

from rlkit.rollout.workers import WORKER_BACKENDS, WorkerCrash, WorkItem

STALE_RULES = ("requeue", "drop")
COUNTERS = ("submitted", "delivered", "crashes", "timeouts", "replaced", "dropped_failed", "dropped_stale",
            "requeued_stale", "calls")   # dropped_* and requeued_stale count groups; the rest count items


class AsyncRollout:
  def __init__(self, factory: Callable, *, backend: str = "inprocess", workers: int = 2, items_per_call: int = 4,
               max_staleness: int = 0, timeout_s: float = 600.0, max_attempts: int = 3, stale: str = "requeue",
               clock: Callable[[], float] = time.monotonic, backend_options: Optional[dict] = None):
    if stale not in STALE_RULES:
      raise ValueError(f"async rollout: stale={stale!r} is not one of {', '.join(STALE_RULES)}.")
    for name, value, low in (("workers", workers, 1), ("items_per_call", items_per_call, 1),
                             ("max_staleness", max_staleness, 0), ("max_attempts", max_attempts, 1)):
      if not isinstance(value, int) or isinstance(value, bool) or value < low:
        raise ValueError(f"async rollout: {name}={value!r} must be an integer >= {low}.")
    self.factory, self.options = factory, dict(backend_options or {})
    self.backend = WORKER_BACKENDS.get(backend)
    self.backend.setup(**self.options)
    self.items_per_call, self.max_staleness, self.timeout_s = items_per_call, max_staleness, float(timeout_s)
    self.max_attempts, self.stale, self.clock = max_attempts, stale, clock
    self.cursor, self.groups, self.version, self._weights = 0, 0, None, None
    self.dead: set = set()            # groups dropped while members were in flight (their answers are discarded)
    self.queue: collections.deque = collections.deque()
    self.finished: list = []
    self.counts = dict.fromkeys(COUNTERS, 0)
    self._made = 0
    self.handles = [self._new_handle() for _ in range(workers)]
    self.inflight: dict = {}          # handle index in self.handles -> (handle, items as sent, deadline)
    self._retiring: list = []         # handles past a resize that finish their call first

  # ------------------------------------------------------------------------------------------ the learner

  def set_weights(self, version: int, weights: Any) -> None:
    """The policy every later chunk uses; items that can no longer become eligible leave at once."""
    if self.version is not None:
      self._collect()
    self.version, self._weights = int(version), self.backend.put(weights)
    for item in list(self.finished) + list(self.queue):
      if item.group not in self.dead and not self._fresh(item):
        self._drop_group(item, stale=True)

  def submit(self, payloads: Sequence[Any], group_size: int = 1) -> list[int]:
    """Queues `group_size` requests per payload (one group); returns their uids (the cursor's next numbers)."""
    uids = [uid for payload in payloads for uid in self._enqueue(payload, group_size)]
    self.counts["submitted"] += len(uids)
    return uids

  def ready_count(self) -> int:
    """Items in complete, eligible groups."""
    return sum(len(members) for members in self._ready_groups().values())

  def take(self, n: int, *, poll_s: float = 0.01, max_wait_s: float = float("inf")) -> list:
    """`n` finished, eligible items, lowest uid first; pumps until there are. Raises RuntimeError if nothing
    could ever produce them (empty queue and no call in flight) or after `max_wait_s`. Between rounds it sleeps
    `poll_s` (the learner must not spin on the cores its workers sample on)."""
    if self.version is None:
      raise RuntimeError("async rollout: call set_weights(version, weights) before take().")
    start = self.clock()
    while self.ready_count() < n:
      self.pump()
      if self.ready_count() >= n:
        break
      if not self.queue and not self.inflight and not self._retiring:
        raise RuntimeError(f"async rollout: {n} items requested, {self.ready_count()} can ever be ready "
                           f"(nothing queued or in flight); submit more requests.")
      if self.clock() - start > max_wait_s:
        raise RuntimeError(f"async rollout: {n} items not ready after {max_wait_s} s.")
      if poll_s:
        time.sleep(poll_s)
    eligible = []
    for _, members in sorted(self._ready_groups().items()):
      if len(eligible) + len(members) > n:
        break
      eligible += sorted(members, key=lambda i: i.uid)
    if len(eligible) != n:
      raise RuntimeError(f"async rollout: take({n}) must be a whole number of groups; the next groups hold "
                         f"{len(eligible)} items up to it.")
    taken = {i.uid for i in eligible}
    self.finished = [i for i in self.finished if i.uid not in taken]
    self.counts["delivered"] += len(eligible)
    return eligible

  # ---------------------------------------------------------------------------------------- scheduling

  def pump(self) -> None:
    """One round: read answers, enforce deadlines, then give every idle worker a call."""
    self._collect()
    for index, handle in enumerate(self.handles):
      if index in self.inflight or not self.queue or self.version is None:
        continue
      items = [self.queue.popleft() for _ in range(min(self.items_per_call, len(self.queue)))]
      self.counts["calls"] += 1
      self.inflight[index] = (handle, items, self.clock() + self.timeout_s)
      handle.start(items, self.version, self._weights)

  def _collect(self) -> None:
    """Reads every answer that is in and enforces deadlines, dispatching nothing. Run before a weight update
    and a checkpoint too, so answers already in are placed the same whether or not a checkpoint is taken (the
    in-process backend's answers are in at once: a resumed run then repeats the uninterrupted one)."""
    now = self.clock()
    for index in sorted(self.inflight):
      handle, sent, deadline = self.inflight[index]
      if handle.ready():
        del self.inflight[index]
        try:
          self._absorb(handle.result())
        except WorkerCrash:
          self.counts["crashes"] += 1
          self._fail(index, handle, sent)
      elif now > deadline:
        del self.inflight[index]
        self.counts["timeouts"] += 1
        self._fail(index, handle, sent)
    self._pump_retiring()

  def resize(self, workers: int) -> None:
    """Elastic assignment: `workers` workers from now on (retired ones finish their call in flight first)."""
    if workers < 1:
      raise ValueError(f"async rollout: resize({workers}) needs at least one worker.")
    while len(self.handles) < workers:
      self.handles.append(self._new_handle())
    while len(self.handles) > workers:
      index = len(self.handles) - 1
      handle = self.handles.pop()
      if index in self.inflight:
        self._retiring.append(self.inflight.pop(index))
      else:
        handle.kill()

  def close(self) -> None:
    for handle in self.handles + [h for h, _, _ in self._retiring]:
      handle.kill()
    self.handles, self.inflight, self._retiring = [], {}, []

  # ---------------------------------------------------------------------------------------- checkpoints

  def state_dict(self) -> dict:
    """The scheduler's state (with its number of workers, which `resize` may have changed); answers already in
    are read first (`_collect`), calls still running are saved as their items before the call (regenerated
    after a restore)."""
    if self.version is not None:
      self._collect()
    in_flight = [i for _, items, _ in list(self.inflight.values()) + self._retiring for i in items]
    queue = sorted(in_flight + list(self.queue), key=lambda i: i.uid)
    queue = [i for i in queue if i.group not in self.dead]
    return {"cursor": self.cursor, "groups": self.groups, "version": self.version, "workers": len(self.handles),
            "queue": [i.to_dict() for i in queue], "finished": [i.to_dict() for i in self.finished],
            "counts": dict(self.counts)}

  def load_state_dict(self, state: dict) -> None:
    """Restores a `state_dict` (weights come with the next `set_weights`): calls in flight are abandoned and
    their items regenerated from the saved state."""
    for handle, _, _ in list(self.inflight.values()) + self._retiring:
      handle.kill()
    self.handles = [self._new_handle() if i in self.inflight else h for i, h in enumerate(self.handles)]
    self.inflight, self._retiring = {}, []
    self.resize(int(state["workers"]))
    self.cursor, self.groups, self.version = int(state["cursor"]), int(state["groups"]), state["version"]
    self.dead = set()
    self.queue = collections.deque(WorkItem.from_dict(d) for d in state["queue"])
    self.finished = [WorkItem.from_dict(d) for d in state["finished"]]
    self.counts = {**dict.fromkeys(COUNTERS, 0), **state["counts"]}

  # ---------------------------------------------------------------------------------------- internals

  def _enqueue(self, payload, group_size: int) -> list[int]:
    uids = list(range(self.cursor, self.cursor + group_size))
    self.queue.extend(WorkItem(uid=u, payload=payload, group=self.groups, group_size=group_size) for u in uids)
    self.cursor += group_size
    self.groups += 1
    return uids

  def _new_handle(self):
    self._made += 1
    return self.backend.make(self.factory, self._made - 1, **self.options)

  def _fresh(self, item: WorkItem) -> bool:
    """Whether the item can still be eligible: its oldest token at most `max_staleness` versions old."""
    first = item.first_version()
    return first is None or self.version - first <= self.max_staleness

  def _ready_groups(self) -> dict:
    """{group: members} of the groups whose every member is finished and fresh."""
    groups = collections.defaultdict(list)
    for item in self.finished:
      groups[item.group].append(item)
    return {g: ms for g, ms in groups.items() if len(ms) == ms[0].group_size and all(map(self._fresh, ms))}

  def _drop_group(self, item: WorkItem, stale: bool) -> None:
    """Drops `item`'s whole group (its queued and finished members now, its members in flight when they
    return); a stale group is submitted again as a new group under `stale="requeue"`."""
    self.dead.add(item.group)
    self.queue = collections.deque(i for i in self.queue if i.group != item.group)
    self.finished = [i for i in self.finished if i.group != item.group]
    self.counts["dropped_stale" if stale else "dropped_failed"] += 1
    if stale and self.stale == "requeue":   # the same request again, under new uids: never delivered twice
      self.counts["requeued_stale"] += 1
      self._enqueue(item.payload, item.group_size)

  def _absorb(self, items: list) -> None:
    for item in items:
      if item.group in self.dead:
        continue
      if not self._fresh(item):
        self._drop_group(item, stale=True)
        continue
      (self.finished.append if item.done else self.queue.append)(item)

  def _fail(self, index: Optional[int], handle, sent: list) -> None:
    """A call crashed or timed out: kill its worker (replace it, unless it was retiring) and put its items back
    at the head of the queue in their order, each one attempt further (dropped at `max_attempts`)."""
    handle.kill()
    if index is not None:
      self.handles[index] = self._new_handle()
      self.counts["replaced"] += 1
    back = []
    for item in sent:
      item.attempts += 1
      if item.group in self.dead:
        continue
      if item.attempts >= self.max_attempts:
        self._drop_group(item, stale=False)
      else:
        back.append(item)
    self.queue.extendleft(reversed([i for i in back if i.group not in self.dead]))

  def _pump_retiring(self) -> None:
    keep = []
    for handle, sent, deadline in self._retiring:
      if handle.ready():
        try:
          self._absorb(handle.result())
          handle.kill()
        except WorkerCrash:
          self.counts["crashes"] += 1
          self._fail(None, handle, sent)
      elif self.clock() > deadline:
        self.counts["timeouts"] += 1
        self._fail(None, handle, sent)
      else:
        keep.append((handle, sent, deadline))
    self._retiring = keep
