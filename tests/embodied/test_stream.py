"""ACoB-Stream (rlkit/embodied/stream.py): in synchronous mode it is ACoB's plain loop number for number (the
stage's iteration, acob_loop.AcobLoop.iteration, with the same keys); in streaming mode the actor and the learner
run on two threads, every collection is learned from once, stale ones only by the critic."""
import json

import jax
import numpy as np
import pytest

from rlkit.embodied import acob_stage
from rlkit.embodied.acob_loop import AcobLoop
from rlkit.embodied.stream import run_stream
from tests.embodied.embodied_config import embodied_config


class _Ctx:
  key = jax.random.fold_in(jax.random.key(0), 2)


def _loop_and_state():
  cfg = embodied_config("acob_test").acob
  state = acob_stage._init(_Ctx(), cfg, None)                       # a fresh expert as pi_ref
  loop = AcobLoop(cfg, state["ref"], lambda params, step: 0.5)     # a fixed evaluation for the trip-wire
  return loop, state


def _plain(loop, state, key, steps):
  rows = []
  for i in range(steps):
    state, metrics, _ = loop.iteration(state, jax.random.fold_in(key, i), i)
    rows.append(metrics)
  return state, rows


def test_sync_mode_is_the_plain_loop():
  key = jax.random.key(3)
  loop, state = _loop_and_state()
  ref_state, ref_rows = _plain(loop, state, key, 4)
  loop, state = _loop_and_state()
  got_state, got_rows, stats = run_stream(loop, state, 4, key, mode="sync")
  plain = [{k: v for k, v in r.items() if not k.startswith("stream/")} for r in got_rows]
  assert json.dumps(plain) == json.dumps(ref_rows)                            # NaN (an undefined AUC) included
  assert [r["acob/phase"] for r in ref_rows] == [1, 2, 3, 3]                  # it walked every phase
  for a, b in zip(jax.tree.leaves(got_state["train"].params), jax.tree.leaves(ref_state["train"].params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  assert stats["collections"] == 4 and stats["staleness"] == {0: 4}


def test_stream_mode_learns_every_collection_once():
  loop, state = _loop_and_state()
  final, rows, stats = run_stream(loop, state, 5, jax.random.key(4), mode="stream", max_staleness=0)
  assert len(rows) == 5 and stats["collections"] == 5 and sum(stats["staleness"].values()) == 5
  assert all(r["stream/actor_used"] == float(r["stream/staleness"] <= 0) for r in rows)
  assert int(final["buffer"]["size"]) == 5 * loop.cfg.num_envs * loop.cfg.decisions
  with pytest.raises(ValueError, match="mode='async'"):
    run_stream(loop, final, 1, jax.random.key(5), mode="async")
