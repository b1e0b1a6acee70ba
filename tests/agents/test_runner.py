"""ToolRunner: results in call order, exceptions as error results (logged once per kind), timeouts and crashes
that replace the worker while the rest of the call goes on, unpicklable results, inline mode, and shutdown.

The tools are this module's functions: the spawn worker imports them by reference, from the sys.path it
inherits (pytest puts this folder on it)."""
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from rlkit.agents.runner import ToolResult, ToolRunner

TIMEOUT_S = 0.5
MARGIN_S = 1.0     # scheduling slack on a loaded 2-core machine


def echo(x):
  return x


def add(a, b):
  return a + b


def pid():
  return os.getpid()


def divide(a, b):
  return a / b


def hang():
  time.sleep(60)


def die():
  os._exit(3)


def make_closure():
  return lambda: 1


@pytest.fixture(scope="module")
def runner():
  with ToolRunner(timeout_s=TIMEOUT_S) as run:
    yield run


def test_values_come_back_in_call_order(runner):
  calls = [(echo, (f"s{i}",)) if i % 3 == 0 else (add, (i, 1)) if i % 3 == 1 else (echo, ({"i": [i]},))
           for i in range(64)]
  results = runner.map(calls)
  assert [r.value for r in results] == [f"s{i}" if i % 3 == 0 else i + 1 if i % 3 == 1 else {"i": [i]}
                                        for i in range(64)]
  assert all(r.error is None for r in results)
  (worker,) = runner.map([(pid, ())])
  assert worker.value == runner.worker_pid != os.getpid()
  assert runner.map([]) == []


def test_an_exception_is_an_error_result_and_the_next_call_works(runner, caplog):
  worker = runner.worker_pid
  with caplog.at_level(logging.WARNING):
    results = runner.map([(divide, (1, 0)), (divide, (6, 3)), (divide, (2, 0)), (divide, ("a", 1))])
  assert results[0] == ToolResult(None, "ZeroDivisionError: division by zero")
  assert results[1] == ToolResult(2.0, None)
  assert results[2].error.startswith("ZeroDivisionError") and results[3].error.startswith("TypeError: ")
  assert runner.worker_pid == worker                       # an exception costs no restart
  assert "2 of 4 tool calls failed with ZeroDivisionError; first at call 0" in caplog.text
  assert caplog.text.count("ZeroDivisionError") == 1       # the first of each kind only, with where it raised
  assert "test_runner.py" in caplog.text and "failed with TypeError; first at call 3" in caplog.text


def test_a_hang_times_out_and_the_rest_run_in_a_fresh_worker(runner):
  runner.map([(echo, (0,))])                               # a started worker, so only the hang is timed
  start = time.monotonic()
  results = runner.map([(echo, (1,)), (hang, ())])
  assert time.monotonic() - start < TIMEOUT_S + MARGIN_S
  assert results == [ToolResult(1, None), ToolResult(None, "timeout")]
  old = runner.worker_pid
  results = runner.map([(hang, ()), (pid, ()), (add, (2, 3))])
  assert [r.error for r in results] == ["timeout", None, None]
  assert results[1].value == runner.worker_pid != old and results[2].value == 5


def test_a_crash_replaces_the_worker_and_later_calls_succeed(runner):
  old = runner.map([(pid, ())])[0].value
  results = runner.map([(echo, ("before",)), (die, ()), (pid, ()), (echo, ("after",))])
  assert [r.error for r in results] == [None, "crash", None, None]
  assert results[0].value == "before" and results[3].value == "after"
  assert results[2].value == runner.worker_pid != old
  assert not _alive(old)


def test_an_unpicklable_result_is_an_error_result(runner):
  worker = runner.worker_pid
  results = runner.map([(make_closure, ()), (echo, ("next",))])
  assert results[0].value is None and "does not pickle" in results[0].error and "function" in results[0].error
  assert results[1] == ToolResult("next", None) and runner.worker_pid == worker


def test_unpicklable_calls_and_bad_arguments_are_clear_errors(runner):
  with pytest.raises(TypeError, match="must pickle"):
    runner.map([(lambda: 1, ())])
  with pytest.raises(TypeError, match=r"\(fn, args tuple\) pair"):
    runner.map([(echo, "not a tuple")])
  for bad in (-1.0, float("inf"), True, "5"):
    with pytest.raises(ValueError, match="timeout_s"):
      ToolRunner(timeout_s=bad)


def test_inline_mode_runs_in_the_caller_and_catches_exceptions(caplog):
  with ToolRunner(timeout_s=0) as run:
    assert run.worker_pid is None
    with caplog.at_level(logging.WARNING):
      results = run.map([(pid, ()), (divide, (1, 0)), (make_closure, ()), (add, (1, 2))])
  assert results[0].value == os.getpid() and results[3] == ToolResult(3, None)
  assert results[1] == ToolResult(None, "ZeroDivisionError: division by zero")
  assert results[2].value() == 1                           # no pickling inline
  assert "failed with ZeroDivisionError" in caplog.text


def test_close_is_idempotent_and_stops_the_worker():
  run = ToolRunner(timeout_s=TIMEOUT_S)
  worker = run.worker_pid
  assert _alive(worker)
  run.close()
  run.close()
  assert not _alive(worker) and run.worker_pid is None
  with pytest.raises(RuntimeError, match="after close"):
    run.map([(echo, (1,))])


def test_the_worker_dies_with_its_parent(tmp_path):
  """A caller SIGKILLed (no exit hooks run) mid-call: the worker goes with it, by its parent-death signal."""
  script = textwrap.dedent("""
      import os, signal, threading, time
      from rlkit.agents.runner import ToolRunner
      if __name__ == "__main__":
        run = ToolRunner(timeout_s=300.0)
        print(run.worker_pid, flush=True)
        threading.Thread(target=run.map, args=([(time.sleep, (300,))],), daemon=True).start()
        time.sleep(0.3)
        os.kill(os.getpid(), signal.SIGKILL)
  """)
  (tmp_path / "leave.py").write_text(script)
  env = dict(os.environ, PYTHONPATH=os.getcwd())
  # An orphan would also hold the pipes open, so run() would wait for it: the timeout fails the test too.
  done = subprocess.run([sys.executable, str(tmp_path / "leave.py")], capture_output=True, text=True,
                        timeout=30, env=env, cwd=os.getcwd())
  assert done.returncode == -signal.SIGKILL, done.stderr
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
