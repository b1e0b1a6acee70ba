"""VerifierExecutor: row order, failures by kind (logged), per-row timeouts that never hang the caller, worker
restarts after a hang in C code or a crash, inline mode, chunking, and clean shutdown."""
import logging
import os
import pickle
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from rlkit.data.jsonl import JsonlTask
from rlkit.data.tasks import Arithmetic, Countdown
from rlkit.rewards import VerifierExecutor
from rlkit.rewards import executor as executor_lib
from tests.rewards import _verifiers as V
from tests.rewards.conftest import TIMEOUT_S

MARGIN_S = 1.0     # scheduling slack on a loaded 2-core machine


def test_values_keep_row_order(executor):
  rows = [(str(i), str(i % 7)) for i in range(300)]
  out = executor.map(V.value_of, rows)
  np.testing.assert_array_equal(out.values, [i * 10 + i % 7 for i in range(300)])
  assert out.values.dtype == np.float64 and not out.failed.any() and out.failures == {}


def test_multi_value_rows_and_chunks_beyond_shared_memory(executor):
  """More rows than one chunk of shared memory holds (3 values a row), and a return of the wrong width."""
  n = executor_lib._SLOTS // 3 + 5
  rows = [(i,) for i in range(n)] + [("short",)]
  out = executor.map(triple, rows, fallback=(-1.0, -1.0, -1.0))
  assert out.values.shape == (n + 1, 3)
  np.testing.assert_array_equal(out.values[:n], np.stack([np.arange(n), -np.arange(n), np.full(n, 7.0)], 1))
  np.testing.assert_array_equal(out.values[n], [-1, -1, -1])
  assert out.failures == {"ValueError": 1} and out.failed.sum() == 1 and out.failed[n]


def triple(i):
  return (i, -i, 7) if i != "short" else (1, 2)


def test_raising_rows_are_counted_by_type_and_logged(executor, caplog):
  rows = [("1", "0"), ("zero", "0"), ("2", "0"), ("key", "0"), ("zero", "0"), ("none", "0")]
  with caplog.at_level(logging.WARNING):
    out = executor.map(V.misbehave, rows, fallback=-5.0)
  np.testing.assert_array_equal(out.values, [1, -5, 2, -5, -5, -5])
  np.testing.assert_array_equal(out.failed, [False, True, False, True, True, True])
  assert out.failures == {"ZeroDivisionError": 2, "KeyError": 1, "TypeError": 1}
  text = caplog.text
  assert "2 of 6 rows failed with ZeroDivisionError; first at row 1: division by zero" in text
  assert "failed with KeyError; first at row 3: 'missing'" in text
  assert "_verifiers.py" in text        # where it raised, to find the bug
  assert text.count("ZeroDivisionError") == 1    # the first message of a type only


def test_hangs_time_out_and_the_other_rows_are_scored(executor):
  rows = [("1", "0"), ("sleep", "0"), ("2", "0"), ("spin", "0"), ("swallow", "0"), ("3", "0")]
  executor.map(V.value_of, [("0", "0")])     # worker up
  pid = executor.worker_pid
  t0 = time.monotonic()
  out = executor.map(V.misbehave, rows)
  elapsed = time.monotonic() - t0
  assert out.failures == {"timeout": 3}
  np.testing.assert_array_equal(out.values, [1, 0, 2, 0, 0, 3])
  np.testing.assert_array_equal(out.failed, [False, True, False, True, True, False])
  assert elapsed < 3 * TIMEOUT_S + MARGIN_S, elapsed
  assert executor.worker_pid == pid       # the alarm broke them: no restart needed


def test_hang_in_c_code_and_crash_restart_the_worker(executor, caplog):
  """A hang the alarm cannot break is killed by the parent, a dying worker is replaced; both lose their row
  only, and the next call works."""
  executor.map(V.value_of, [("0", "0")])
  pid = executor.worker_pid
  rows = [("1", "0"), ("c_hang", "0"), ("2", "0"), ("exit", "0"), ("3", "0")]
  t0 = time.monotonic()
  with caplog.at_level(logging.WARNING):
    out = executor.map(V.misbehave, rows)
  elapsed = time.monotonic() - t0
  assert out.failures == {"timeout": 1, "crash": 1}
  np.testing.assert_array_equal(out.values, [1, 0, 2, 0, 3])
  assert "a hang in C code" in caplog.text and "died on this row" in caplog.text
  # the C hang waits timeout + grace; then two worker start-ups (a few seconds on a loaded machine)
  assert elapsed < TIMEOUT_S + executor_lib.KILL_GRACE_S + 10.0, elapsed
  assert executor.worker_pid not in (None, pid)
  again = executor.map(V.value_of, [("4", "1"), ("5", "2")])
  np.testing.assert_array_equal(again.values, [41, 52])
  assert again.failures == {}


def test_restarts_per_call_are_bounded(executor, monkeypatch):
  """After MAX_RESTARTS_PER_CALL restarts, the rest of the call is given up as timeouts instead of paying a
  hang and a start-up per row."""
  monkeypatch.setattr(executor_lib, "MAX_RESTARTS_PER_CALL", 0)
  out = executor.map(V.misbehave, [("1", "0"), ("exit", "0"), ("2", "0"), ("3", "0")])
  assert out.failures == {"crash": 1, "timeout": 2}
  np.testing.assert_array_equal(out.values, [1, 0, 0, 0])


def test_call_timeout_caps_a_call(executor, monkeypatch):
  monkeypatch.setattr(executor, "timeout_s", 5.0)
  monkeypatch.setattr(executor, "call_timeout_s", 0.5)
  executor.map(V.value_of, [("0", "0")])    # a worker start-up does not count against the call
  t0 = time.monotonic()
  out = executor.map(V.misbehave, [("1", "0"), ("sleep", "0"), ("2", "0")])
  elapsed = time.monotonic() - t0
  assert out.failures == {"timeout": 2}
  np.testing.assert_array_equal(out.values, [1, 0, 0])
  assert elapsed < 0.5 + MARGIN_S, elapsed


def test_inline_mode_runs_in_process_without_pickling(caplog):
  with VerifierExecutor(timeout_s=0) as ex:
    assert ex.worker_pid is None
    assert ex.map(V.pid, [()]).values[0] == os.getpid()
    out = ex.map(lambda t, a: V.misbehave(t, a), [("1", "0"), ("zero", "0"), ("2", "0")])
  np.testing.assert_array_equal(out.values, [1, 0, 2])
  assert out.failures == {"ZeroDivisionError": 1}
  assert "first at row 1: division by zero" in caplog.text


def test_worker_runs_in_another_process_and_unpicklable_fn_is_a_clear_error(executor):
  assert executor.map(V.pid, [()]).values[0] == executor.worker_pid != os.getpid()
  with pytest.raises(TypeError, match="must pickle.*timeout_s=0"):
    executor.map(lambda t, a: 0.0, [("1", "0")])
  assert executor.map(V.value_of, [("1", "1")]).values[0] == 11      # still usable


@pytest.mark.parametrize("bad", [-1.0, float("nan"), float("inf"), "1", True])
def test_timeout_must_be_a_finite_non_negative_number(bad):
  with pytest.raises(ValueError, match="timeout_s must be a finite number >= 0"):
    VerifierExecutor(timeout_s=bad)


def test_tasks_pickle_and_verify_in_the_worker(executor, tmp_path):
  path = tmp_path / "data.jsonl"
  path.write_text('{"prompt": "q", "answer": "steps #### 42"}\n')
  cases = [(Arithmetic(), "357", "357"), (Countdown(), "7*3+5", "7 3 5>26"),
           (JsonlTask(path=str(path)), "#### 42", "42")]
  for task, good, answer in cases:
    assert pickle.loads(pickle.dumps(task)) == task
    out = executor.map(task.verify, [(good, answer), ("nope", answer)])
    np.testing.assert_array_equal(out.values, [1, 0])


def test_close_stops_the_worker():
  ex = VerifierExecutor(timeout_s=TIMEOUT_S)
  ex.map(V.value_of, [("1", "1")])
  proc = ex._proc
  ex.close()
  ex.close()                                  # idempotent
  assert not proc.is_alive()
  with pytest.raises(RuntimeError, match="after close"):
    ex.map(V.value_of, [("1", "1")])


@pytest.mark.parametrize("ending", ["exit", "sigkill"])
def test_no_orphan_worker_outlives_its_process(tmp_path, ending):
  """A process that ends without close(), its worker busy in a hang: a normal exit runs the atexit hook, and
  a SIGKILL (no hooks run) takes the worker down through its parent-death signal."""
  script = textwrap.dedent(f"""
      import os, signal, threading, time
      from rlkit.rewards.executor import VerifierExecutor
      from tests.rewards import _verifiers as V
      if __name__ == "__main__":
        ex = VerifierExecutor(timeout_s=300.0)
        ex.map(V.value_of, [("1", "1")])
        print(ex.worker_pid, flush=True)
        threading.Thread(target=ex.map, args=(V.misbehave, [("sleep", "0")]), daemon=True).start()
        time.sleep(0.2)
        if {ending!r} == "sigkill":
          os.kill(os.getpid(), signal.SIGKILL)
  """)
  (tmp_path / "leave.py").write_text(script)
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  # An orphan would also hold the pipes open, so run() would wait for it: the timeout fails the test too.
  done = subprocess.run([sys.executable, str(tmp_path / "leave.py")], capture_output=True, text=True,
                        timeout=30, env=env, cwd=os.getcwd())
  assert done.returncode == (0 if ending == "exit" else -9), done.stderr
  worker = int(done.stdout.split()[0])
  deadline = time.monotonic() + 5.0
  while time.monotonic() < deadline and _alive(worker):
    time.sleep(0.05)
  assert not _alive(worker)


def _alive(pid: int) -> bool:
  try:
    with open(f"/proc/{pid}/stat") as f:
      return f.read().split(") ")[1][0] != "Z"
  except FileNotFoundError:
    return False
