"""Runs an environment's tool calls (user code on policy-written arguments) with a per-call wall-time limit.

A multi-turn environment (`rlkit.agents.envs`) executes what the policy asks for: parsed arguments into user
tool code, which can raise, loop forever, hang in C code or kill its process. `ToolRunner.map(calls)` runs each
`(fn, args)` as `fn(*args)` and returns one `ToolResult(value, error)` per call, in call order, so a bad call
costs one error observation, never the run:

- a call that raises gives `error = "<ExceptionType>: <message>"` (the message cut to `MESSAGE_CHARS`; the
  policy reads it, so no file paths: those go to the log). An exception is never raised to the caller.
- a call still running `timeout_s` after it started is a "timeout"; a worker that dies during a call (segfault,
  `os._exit`, the OOM killer) gives "crash". Either way the worker is killed and replaced by a fresh one, and
  the remaining calls of the `map` run there. A result that does not pickle is an error result naming that.
- the first error of each kind in a `map` is logged (absl warning) with its call index, count and location.

Process model. The trainer is a multi-threaded JAX process, which must not `fork`: the worker is one
persistent "spawn" process, started with the runner (its start-up overlaps the caller's setup) and reused by
every call, so a tool module is imported once per worker. Unlike `rlkit.rewards.executor` (floats through shared
memory, a SIGALRM per row), values are arbitrary picklable objects, so the worker answers each call on the pipe,
and the parent alone keeps time: it waits for each reply until the deadline of the call in flight (a reply
starts the next call's clock) and SIGKILLs the worker past it. That stops any hang, pure Python or C, at the
cost of a worker restart (~0.2 s plus re-importing the tool's modules). A `map` sends all its calls in one
message; the worker unpickles them all (imports are start-up, not the first call's time), acknowledges, then
runs them. The worker dies with its parent (`PR_SET_PDEATHSIG`), is a daemon (a tool may start subprocesses but
not multiprocessing children), and `fn` must be importable there: a module-level function, a method of a
picklable object, a `functools.partial` of those.

`timeout_s=0` runs the calls inline in the caller, for debugging (pdb, profilers): exceptions are still error
results, but there is no time limit, no protection against crashes and no pickling.
"""
from __future__ import annotations

import math
import multiprocessing
import os
import pickle
import signal
import threading
import time
import weakref
from typing import Any, Callable, NamedTuple, Optional, Sequence

from absl import logging

# The verifier executor's process hygiene and exception text, shared.
from rlkit.rewards.executor import (MESSAGE_CHARS, START_TIMEOUT_S, describe_exception, die_with_parent, fn_label,
                                    stop_worker)

_LOADED = pickle.dumps(("loaded",))


class ToolResult(NamedTuple):
  """One tool call's outcome."""
  value: Any               # the call's return value (None when it failed)
  error: Optional[str]     # None on success; "timeout", "crash", or "<ExceptionType>: <message>"


def _error_text(e: BaseException, what: str = "") -> str:
  """"<ExceptionType>: <what><message>", the message cut to `MESSAGE_CHARS`."""
  message = str(e)
  if len(message) > MESSAGE_CHARS:
    message = message[:MESSAGE_CHARS] + "..."
  return f"{type(e).__name__}: {what}{message}"


def _call_tool(fn: Callable, args: tuple) -> tuple[Any, Optional[str], Optional[str]]:
  """`fn(*args)` as (value, error, detail for the log), in the worker and inline alike."""
  try:
    return fn(*args), None, None
  except BaseException as e:  # noqa: B036  (tool code is untrusted: sys.exit is an error result too)
    if isinstance(e, KeyboardInterrupt):     # a Ctrl-C of the caller (the worker ignores SIGINT)
      raise
    return None, _error_text(e), describe_exception(e)


def _worker_main(conn, parent_pid: int) -> None:
  signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the parent's to handle; it then kills us
  die_with_parent()
  if os.getppid() != parent_pid:    # it died before the line above: its calls may already sit in the pipe
    return
  while True:
    try:
      payloads = pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):   # the parent closed us, or died
      return
    calls = []
    for i, payload in enumerate(payloads):
      try:
        calls.append(pickle.loads(payload))
      except BaseException as e:  # noqa: B036
        conn.send_bytes(pickle.dumps(("load_error", i, f"{type(e).__name__}: {e}")))
        break
    else:
      conn.send_bytes(_LOADED)
      for fn, args in calls:
        value, error, detail = _call_tool(fn, args)
        blob = None
        if error is None:
          try:
            blob = pickle.dumps(value, pickle.HIGHEST_PROTOCOL)
          except BaseException as e:  # noqa: B036  (pickling runs user __reduce__ code too)
            error = detail = _error_text(e, f"the result (a {type(value).__name__}) does not pickle: ")
        conn.send_bytes(pickle.dumps(("result", blob, error, detail), pickle.HIGHEST_PROTOCOL))


def _pickle_call(fn: Callable, args: tuple) -> bytes:
  try:
    return pickle.dumps((fn, args), pickle.HIGHEST_PROTOCOL)
  except Exception as e:  # noqa: BLE001
    raise TypeError(f"ToolRunner: the call to {fn_label(fn)} must pickle to run in the worker process "
                    f"({type(e).__name__}: {e}). Use a module-level function (not a lambda or a nested function) "
                    "and picklable arguments, or timeout_s=0 to run inline.") from e


def _log_failures(results: list[ToolResult], details: dict[int, str], fns: list[Callable]) -> None:
  """One warning per error kind (its count, and the first call's index and detail)."""
  first: dict[str, int] = {}
  counts: dict[str, int] = {}
  for i, r in enumerate(results):
    if r.error is not None:
      kind = r.error.split(":", 1)[0]
      first.setdefault(kind, i)
      counts[kind] = counts.get(kind, 0) + 1
  for kind, i in first.items():
    logging.warning("%s: %d of %d tool calls failed with %s; first at call %d: %s", fn_label(fns[i]),
                    counts[kind], len(results), kind, i, details.get(i, results[i].error))


class ToolRunner:
  """Runs tool calls in a worker process, each with a wall-time limit (see the module docstring).

  >>> with ToolRunner(timeout_s=5.0) as run:
  ...   [tuple(r) for r in run.map([(divmod, (7, 2)), (divmod, (1, 0))])]
  [((3, 1), None), (None, 'ZeroDivisionError: integer division or modulo by zero')]
  """

  def __init__(self, timeout_s: float = 5.0):
    """:param timeout_s: seconds one call may run; 0 runs calls inline with no limit (debugging)."""
    if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s) \
        or timeout_s < 0:
      raise ValueError(f"ToolRunner: timeout_s must be a finite number >= 0, got {timeout_s!r}.")
    self.timeout_s = float(timeout_s)
    self._lock = threading.Lock()
    self._closed = False
    self._proc = self._conn = self._stop = None
    if self.timeout_s > 0:
      self._start_worker()

  def map(self, calls: Sequence[tuple[Callable, tuple]]) -> list[ToolResult]:
    """`fn(*args)` for every `(fn, args)` in `calls`; one `ToolResult` per call, in call order."""
    calls = [tuple(call) for call in calls]
    for call in calls:
      if len(call) != 2 or not callable(call[0]) or not isinstance(call[1], (tuple, list)):
        raise TypeError(f"ToolRunner.map: each call is a (fn, args tuple) pair, got {call!r:.200}.")
    calls = [(fn, tuple(args)) for fn, args in calls]
    details: dict[int, str] = {}
    with self._lock:
      if self._closed:
        raise RuntimeError("ToolRunner.map called after close().")
      if self.timeout_s == 0:
        results = []
        for i, (fn, args) in enumerate(calls):
          value, error, detail = _call_tool(fn, args)
          results.append(ToolResult(value, error))
          if detail is not None:
            details[i] = detail
      else:
        results = self._map_in_worker([_pickle_call(fn, args) for fn, args in calls], details)
    _log_failures(results, details, [fn for fn, _ in calls])
    return results

  def close(self) -> None:
    """Stops the worker. Idempotent; also runs at garbage collection and interpreter exit."""
    with self._lock:
      self._closed = True
      if self._stop is not None:
        self._stop()
      self._proc = self._conn = self._stop = None

  def __enter__(self) -> "ToolRunner":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @property
  def worker_pid(self) -> Optional[int]:
    """The live worker's process id (None inline or after close); it changes when the worker is replaced."""
    return self._proc.pid if self._proc is not None else None

  # ---------------------------------------------------------------------------------------------- worker

  def _start_worker(self) -> None:
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_worker_main, name="rlkit-tools", daemon=True, args=(child_conn, os.getpid()))
    proc.start()
    child_conn.close()          # else the parent never sees EOF when the worker dies
    self._proc, self._conn = proc, parent_conn
    self._stop = weakref.finalize(self, stop_worker, proc, parent_conn)

  def _replace_worker(self) -> None:
    self._stop()
    self._start_worker()        # its start-up overlaps whatever the caller does next

  def _map_in_worker(self, payloads: list[bytes], details: dict[int, str]) -> list[ToolResult]:
    results: list[ToolResult] = []
    while len(results) < len(payloads):
      self._run_from(payloads, results, details)
    return results

  def _run_from(self, payloads: list[bytes], results: list[ToolResult], details: dict[int, str]) -> None:
    """Runs the calls after `results` in the current worker, appending their results until all are done or
    one times out or crashes (that one appended too; the worker is then replaced)."""
    if not self._proc.is_alive():   # it died between maps (killed from outside)
      self._replace_worker()
    message = pickle.dumps(payloads[len(results):], pickle.HIGHEST_PROTOCOL)
    try:
      self._conn.send_bytes(message)
    except OSError:                 # it died since the check above
      self._replace_worker()
      self._conn.send_bytes(message)
    loaded, deadline = False, time.monotonic() + START_TIMEOUT_S
    while len(results) < len(payloads):
      try:
        reply = None
        if self._conn.poll(max(0.0, deadline - time.monotonic())):
          reply = pickle.loads(self._conn.recv_bytes())
      except (EOFError, OSError):
        reply = ("crash",)
      if reply is None or reply[0] == "crash":
        proc = self._proc
        self._replace_worker()      # kills and reaps the old one, so its exit code is known
        if not loaded:
          raise RuntimeError(f"the tool worker process {'hung' if reply is None else 'died'} while starting or "
                             f"loading the calls (exit code {proc.exitcode}; its error, if any, is printed above).")
        details[len(results)] = (f"no result within timeout_s={self.timeout_s} s" if reply is None else
                                 f"the worker process died (exit code {proc.exitcode})") + "; worker replaced"
        results.append(ToolResult(None, "timeout" if reply is None else "crash"))
        return
      if reply[0] == "load_error":
        raise TypeError(f"ToolRunner: the worker could not load call {len(results) + reply[1]} ({reply[2]}); "
                        "its function must be importable there (defined at module level).")
      if reply[0] == "result":
        _, blob, error, detail = reply
        value = None
        if error is None:
          try:
            value = pickle.loads(blob)
          except Exception as e:  # noqa: BLE001  (a result class the parent cannot rebuild)
            error = detail = _error_text(e, "the result does not unpickle in the caller: ")
        if detail is not None:
          details[len(results)] = detail
        results.append(ToolResult(value, error))
      loaded = True
      deadline = time.monotonic() + self.timeout_s   # the next call's clock starts now
