"""Asynchronous rollout (rlkit/rollout/async_rollout.py, workers.py): exactly-once delivery through crashes,
hangs and resizes; the staleness bound; partial rollouts that record each token's policy version; a resumed
scheduler repeats the uninterrupted run; and the same on real Ray actors, one of them killed mid-call."""
import functools
import json

import pytest

from rlkit.rollout.async_rollout import AsyncRollout
from rlkit.rollout.workers import CountingGenerator as Counter


class FakeClock:
  def __init__(self):
    self.now = 0.0

  def __call__(self):
    self.now += 1.0          # every reading advances: a hung call passes its deadline after a few pumps
    return self.now


def _pool(**kw):
  kw.setdefault("workers", 2)
  kw.setdefault("items_per_call", 2)
  pool = AsyncRollout(Counter, **kw)
  pool.set_weights(0, {"bias": 100})
  return pool


def _lengths(n, length=4, **extra):
  return [{"length": length, **extra} for _ in range(n)]


def test_every_request_is_delivered_once_in_uid_order():
  pool = _pool()
  uids = pool.submit(_lengths(7))
  got = pool.take(7, poll_s=0)
  assert [i.uid for i in got] == uids == list(range(7))
  assert all(i.tokens == [100, 101, 102, 103] and i.versions == [0] * 4 and i.done for i in got)
  assert pool.counts["delivered"] == 7 and not pool.finished and not pool.queue
  with pytest.raises(RuntimeError, match="nothing queued or in flight"):
    pool.take(1, poll_s=0)


def test_a_crashed_worker_is_replaced_and_its_items_retried_never_twice():
  pool = _pool(max_attempts=3)
  pool.submit(_lengths(2) + _lengths(2, crash=1) + _lengths(2))
  got = pool.take(6, poll_s=0)
  assert sorted(i.uid for i in got) == list(range(6))
  assert pool.counts["crashes"] == 1 and pool.counts["replaced"] == 1
  assert [i.attempts for i in sorted(got, key=lambda i: i.uid)] == [0, 0, 1, 1, 0, 0]
  pool.submit(_lengths(2, crash=9))                     # always crashes: dropped after max_attempts
  with pytest.raises(RuntimeError, match="can ever be ready"):
    pool.take(1, poll_s=0)
  assert pool.counts["dropped_failed"] == 2 and pool.counts["crashes"] == 4


def test_groups_are_delivered_whole_and_a_failed_member_takes_its_group():
  pool = _pool(max_attempts=2)
  pool.submit([{"length": 4}, {"length": 4, "crash": 9}, {"length": 2}], group_size=2)
  got = pool.take(4, poll_s=0)
  assert [(i.uid, i.group) for i in got] == [(0, 0), (1, 0), (4, 2), (5, 2)]
  assert pool.counts["dropped_failed"] == 1             # group 1: both members, one count
  pool.submit([{"length": 2}], group_size=3)
  with pytest.raises(RuntimeError, match="whole number of groups"):
    pool.take(2, poll_s=0)


def test_a_stale_member_takes_its_group_and_the_group_is_requeued_whole():
  pool = _pool(workers=1, items_per_call=1, max_staleness=0)
  pool.submit([{"length": 4}], group_size=2)
  pool.pump()                                           # member 0: 2 tokens at version 0; member 1 untouched
  pool.set_weights(1, {"bias": 0})
  got = pool.take(2, poll_s=0)
  assert [(i.uid, i.group, i.versions) for i in got] == [(2, 1, [1] * 4), (3, 1, [1] * 4)]
  assert pool.counts["dropped_stale"] == pool.counts["requeued_stale"] == 1


def test_a_hung_worker_times_out_on_the_clock_and_is_replaced():
  pool = _pool(timeout_s=5.0, clock=FakeClock())
  pool.submit(_lengths(2, hang=1) + _lengths(2))
  got = pool.take(4, poll_s=0)
  assert sorted(i.uid for i in got) == [0, 1, 2, 3]
  assert pool.counts["timeouts"] == 1 and pool.counts["replaced"] == 1


def test_staleness_zero_delivers_only_current_policy_tokens_and_requeues_the_rest():
  pool = _pool(workers=1, items_per_call=1, max_staleness=0)
  pool.submit(_lengths(2, length=6))                    # three chunks each
  pool.pump()                                           # uid 0: 2 tokens at version 0
  pool.set_weights(1, {"bias": 200})                    # uid 0 can never be fresh: requeued as uid 2
  got = pool.take(2, poll_s=0)
  assert [i.uid for i in got] == [1, 2]
  assert all(i.versions == [1] * 6 and i.tokens == list(range(200, 206)) for i in got)
  assert pool.counts["dropped_stale"] == 1 and pool.counts["requeued_stale"] == 1
  assert pool.counts["submitted"] == 2                  # the requeue is the same request, not a new one


def test_partial_rollouts_carry_across_versions_within_the_bound():
  pool = _pool(workers=1, items_per_call=1, max_staleness=2, stale="drop")
  pool.submit(_lengths(1, length=6))
  for version in (1, 2):
    pool.pump()
    pool.set_weights(version, {"bias": 100 * (version + 1)})
  [item] = pool.take(1, poll_s=0)
  assert item.versions == [0, 0, 1, 1, 2, 2] and item.tokens == [100, 101, 202, 203, 304, 305]
  pool.submit(_lengths(1, length=8))
  for version in (3, 4, 5):
    pool.pump()
    pool.set_weights(version, {"bias": 0})
  pool.pump()                                           # its chunk at version 4 comes back: dropped
  assert pool.counts["dropped_stale"] == 1 and not pool.queue and pool.cursor == 2   # dropped, not requeued


def _loop(pool, steps, start=0, stop_at=None):
  delivered = []
  for step in range(start, steps):
    if step == stop_at:
      return delivered, pool.state_dict()
    pool.submit(_lengths(3, length=3 + step % 2))
    delivered += [(i.uid, i.tokens, i.versions) for i in pool.take(2, poll_s=0)]   # one left for later
    pool.set_weights(step + 1, {"bias": 10 * (step + 1)})
  return delivered, None


def test_a_resumed_scheduler_repeats_the_uninterrupted_run():
  whole, _ = _loop(_pool(max_staleness=1), 6)
  first, state = _loop(_pool(max_staleness=1), 6, stop_at=3)
  state = json.loads(json.dumps(state))                 # what a checkpoint keeps survives JSON
  resumed = _pool(max_staleness=1)
  resumed.load_state_dict(state)
  resumed.set_weights(3, {"bias": 30})
  rest, _ = _loop(resumed, 6, start=3)
  assert first + rest == whole
  uids = [u for u, _, _ in whole]
  assert len(uids) == len(set(uids)) == 12


def test_resizing_keeps_every_request():
  pool = _pool(workers=3, items_per_call=1)
  pool.submit(_lengths(9, length=6))
  pool.pump()
  pool.resize(1)                                        # two workers retire after their call
  pool.pump()
  pool.resize(2)
  got = pool.take(9, poll_s=0)
  assert sorted(i.uid for i in got) == list(range(9)) and len(pool.handles) == 2


def test_bad_settings_are_clear_errors():
  with pytest.raises(ValueError, match="stale='keep' is not one of requeue, drop"):
    AsyncRollout(Counter, stale="keep")
  with pytest.raises(ValueError, match="max_staleness=-1 must be an integer >= 0"):
    AsyncRollout(Counter, max_staleness=-1)
  with pytest.raises(RuntimeError, match="call set_weights"):
    AsyncRollout(Counter).take(1)


def test_ray_actors_deliver_exactly_once_when_one_is_killed_mid_call():
  ray = pytest.importorskip("ray")
  from rlkit.rollout.workers import ray_setup
  ray_setup(cluster_cpus=2)
  slow = functools.partial(Counter, work_s=0.05)          # a call takes 0.2 s: the kill lands inside it
  pool = AsyncRollout(slow, backend="ray", workers=2, items_per_call=2, max_staleness=1,
                      backend_options={"num_cpus": 0.5})
  try:
    pool.set_weights(0, {"bias": 100})
    pool.submit(_lengths(8, length=6))
    pool.pump()
    victim = pool.inflight[0][0]
    ray.kill(victim.actor, no_restart=True)             # dies with its call in flight
    got = pool.take(8, max_wait_s=120)
    assert sorted(i.uid for i in got) == list(range(8))
    assert all(i.tokens == list(range(100, 106)) for i in got)
    assert pool.counts["crashes"] >= 1 and pool.counts["replaced"] >= 1
  finally:
    pool.close()
    ray.shutdown()
