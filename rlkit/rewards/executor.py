"""Host-side per-row calls (a task's verifier) with a wall-time limit, in a worker process.

A reward's host-side code runs on model output, so it can raise, loop forever or hang in C code. `map(fn, rows)`
calls `fn(*row)` for every row and returns the values in row order, every failure counted by kind and logged, so
one pathological sample costs one row, never the run:

- a call that raises is a failure named by its exception type ("ZeroDivisionError"), valued `fallback`. The
  first message of each type in a call is logged (absl warning) with its row index and the count.
- a call that does not return within `timeout_s` is a "timeout". The worker arms a per-row SIGALRM timer
  (`signal.setitimer`) that interrupts pure-Python hangs (loops, `time.sleep`, regex backtracking): only that
  row is lost. The parent is the backstop for hangs the alarm cannot break (C code that never returns to the
  interpreter, a blocked signal): the worker stamps each row's start time in shared memory, and once a row has
  run `timeout_s + KILL_GRACE_S` the parent kills the worker. That row is a timeout, and the rest of the call
  continues in a fresh worker, at most `MAX_RESTARTS_PER_CALL` times per call (rows left after that are
  timeouts). A worker that dies (segfault, `os._exit`, the OOM killer) costs its row a "crash" the same way.
  So a call takes at most about rows * timeout_s; `call_timeout_s` caps a whole call (unfinished rows are
  timeouts), and is off by default.

Process model. The trainer is a multi-threaded JAX process, which must not `fork`: the worker is a "spawn"
process, started when the executor is built (its imports overlap the trainer's setup) and reused by every call;
it is replaced only after a kill or crash. A call sends its rows in one message (chunks of up to `_SLOTS` values),
and `fn` only when it differs from the last one sent; values and per-row status come back through shared
memory, so the rows a killed worker finished are kept. `fn` and the rows must pickle and `fn` must be importable
in the worker: a module-level function, a method of a (frozen dataclass) task, a functools.partial of those;
it must not use SIGALRM itself.
The worker imports what unpickling `fn` imports (for a task, `rlkit.data`, which today pulls in jax via
`rlkit.core`; only an import cost, jax is never initialised there) and, as any spawn child, re-imports the
launching script without running its `__main__` block.

`timeout_s=0` calls `fn` inline in the calling process: no time limit and no protection against hangs or
crashes, for debugging (pdb, profilers). Failures from exceptions are still counted and logged.

Overhead (256 arithmetic verifier rows, median on a 2-core CPU host): 1.3 ms a call in the worker, 0.6 ms
inline, 0.25 ms for a bare loop over `task.verify`; a worker start-up is ~0.2 s, plus ~1 s the first time it
unpickles a task (the jax import above).
"""
from __future__ import annotations

import functools
import math
import multiprocessing
import pickle
import signal
import threading
import time
import traceback
import weakref
from typing import Any, Callable, NamedTuple, Optional, Sequence

import numpy as np
from absl import logging

KILL_GRACE_S = 1.0          # how far past timeout_s a row may run before the parent assumes the alarm can't fire
START_TIMEOUT_S = 120.0     # worker start-up, and loading a call's message (its first unpickling imports modules)
MAX_RESTARTS_PER_CALL = 2   # workers killed (C hang) or crashed in one call before its remaining rows are given up
_SLOTS = 1 << 14            # float64 values per chunk in shared memory (a chunk holds _SLOTS // width rows)
_LOAD_POLL_S = 0.02         # how often the parent checks whether a loading worker started its first row
MESSAGE_CHARS = 500        # an exception message is cut to this length in the log

# Per-row status in shared memory: pending, done, alarm timeout, or the k-th exception type of the chunk.
_PENDING, _OK, _TIMEOUT, _ERROR = 0, 1, 2, 3


class RowResults(NamedTuple):
  """`map`'s result for N rows."""
  values: np.ndarray          # [N] float64 (or [N, W] for a W-value fallback); `fallback` on failed rows
  failed: np.ndarray          # [N] bool
  failures: dict[str, int]    # failure kind -> count: an exception type name, "timeout" or "crash"


class _RowTimeout(BaseException):
  """Raised by the worker's alarm; a BaseException so a verifier's `except Exception` does not swallow it."""


def _raise_row_timeout(signum, frame):
  raise _RowTimeout()


def _as_values(out: Any, width: int) -> Any:
  if width == 1:
    return float(out)
  values = [float(v) for v in out]
  if len(values) != width:
    raise ValueError(f"expected {width} values (the fallback's length), got {len(values)}")
  return values


def describe_exception(e: BaseException) -> str:
  message = str(e)
  if len(message) > MESSAGE_CHARS:
    message = message[:MESSAGE_CHARS] + "..."
  frames = traceback.extract_tb(e.__traceback__)
  return f"{message} (at {frames[-1].filename}:{frames[-1].lineno} in {frames[-1].name})" if frames else message


def _run_rows(fn, rows, width, alarm_s, values, status, stamp, report_new_type) -> None:
  """Scores `rows` into `values[i*width:(i+1)*width]` and `status[i]` (shared by the worker and inline mode).

  A new exception type is reported (`report_new_type(k, name, message, row)`) before its first status is
  written, so whoever reads a status of `_ERROR + k` can name it.
  """
  types: dict[str, int] = {}
  for i, args in enumerate(rows):
    stamp[0] = time.monotonic()
    try:
      if alarm_s:
        signal.setitimer(signal.ITIMER_REAL, alarm_s)
      try:
        out = fn(*args)
      finally:
        if alarm_s:
          signal.setitimer(signal.ITIMER_REAL, 0)
      values[i * width:(i + 1) * width] = _as_values(out, width)
      status[i] = _OK
    except _RowTimeout:
      status[i] = _TIMEOUT
    except BaseException as e:  # noqa: B036  (verifier code is untrusted: sys.exit is a row failure too)
      if isinstance(e, KeyboardInterrupt):
        raise
      name = type(e).__name__
      if name not in types:
        types[name] = len(types)
        report_new_type(types[name], name, describe_exception(e), i)
      status[i] = _ERROR + types[name]


def die_with_parent() -> None:
  """Linux: SIGKILL this worker when its parent dies, so no orphan outlives a killed trainer."""
  try:
    import ctypes
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)   # PR_SET_PDEATHSIG
  except (OSError, AttributeError):
    pass


def _worker_main(conn, values_buf, status_buf, stamp_buf) -> None:
  signal.signal(signal.SIGINT, signal.SIG_IGN)    # Ctrl-C is the parent's to handle; it then closes us
  signal.signal(signal.SIGALRM, _raise_row_timeout)
  die_with_parent()
  values = np.frombuffer(values_buf, np.float64)
  status = np.frombuffer(status_buf, np.int32)
  stamp = np.frombuffer(stamp_buf, np.float64)
  conn.send(("ready",))
  fn = None
  while True:
    try:
      payload = conn.recv_bytes()
    except (EOFError, OSError):   # the parent closed us, or died
      return
    try:
      new_fn, rows, width, alarm_s = pickle.loads(payload)
    except BaseException as e:  # noqa: B036
      conn.send(("load_error", f"{type(e).__name__}: {e}"))
      continue
    fn = fn if new_fn is None else new_fn
    _run_rows(fn, rows, width, alarm_s, values, status, stamp,
              lambda k, name, message, row: conn.send(("error", k, name, message, row)))
    conn.send(("done",))


def stop_worker(proc, conn) -> None:
  """Kills the worker: it holds no state, and a clean exit of a process that imported jax takes ~0.5 s."""
  try:
    conn.close()
  except OSError:
    pass
  proc.kill()
  proc.join(5.0)


def fn_label(fn) -> str:
  if isinstance(fn, functools.partial):
    return f"{fn_label(fn.func)}({', '.join(type(a).__name__ for a in fn.args)}, ...)"
  owner = getattr(fn, "__self__", None)
  if owner is not None and not isinstance(owner, type(functools)):
    return f"{type(owner).__name__}.{getattr(fn, '__name__', '?')}"
  return getattr(fn, "__qualname__", type(fn).__name__)


class VerifierExecutor:
  """Runs a per-row host function over a batch with a per-row wall-time limit (see the module docstring).

  >>> from rlkit.data.tasks import Arithmetic
  >>> with VerifierExecutor(timeout_s=5.0) as ex:
  ...   ex.map(Arithmetic().verify, [("3", "3"), ("4", "5")]).values
  array([1., 0.])
  """

  def __init__(self, timeout_s: float = 5.0, call_timeout_s: Optional[float] = None):
    """
    :param timeout_s: seconds one row may take; 0 runs inline with no limit (no protection, for debugging).
    :param call_timeout_s: seconds one `map` call may take in all (None: no cap beyond the per-row limit).
    """
    for name, value in (("timeout_s", timeout_s), ("call_timeout_s", call_timeout_s)):
      if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))
                                or not math.isfinite(value) or value < 0):
        raise ValueError(f"VerifierExecutor: {name} must be a finite number >= 0, got {value!r}.")
    if call_timeout_s is not None and timeout_s == 0:
      raise ValueError("VerifierExecutor: call_timeout_s needs a worker; it has no effect with timeout_s=0.")
    self.timeout_s = float(timeout_s)
    self.call_timeout_s = None if call_timeout_s is None else float(call_timeout_s)
    self._lock = threading.Lock()
    self._closed = False
    self._proc = None
    self._conn = None
    self._stop = None          # weakref.finalize of the live worker: runs at close, garbage collection or exit
    self._ready = False
    self._worker_fn = None     # the fn the live worker holds
    if self.timeout_s > 0:
      ctx = multiprocessing.get_context("spawn")
      self._values_buf = ctx.RawArray("d", _SLOTS)
      self._status_buf = ctx.RawArray("i", _SLOTS)
      self._stamp_buf = ctx.RawArray("d", 1)
      self._values = np.frombuffer(self._values_buf, np.float64)
      self._status = np.frombuffer(self._status_buf, np.int32)
      self._stamp = np.frombuffer(self._stamp_buf, np.float64)
      self._start_worker()

  # ---------------------------------------------------------------------------------------------- public

  def map(self, fn: Callable[..., Any], rows: Sequence[tuple], fallback: Any = 0.0) -> RowResults:
    """`fn(*row)` for every row, in row order, each as a float (or as W floats for a W-value `fallback`).

    A row that raises, times out or crashes the worker is a failure valued `fallback`; a return value that
    does not convert to float(s) is a failure named by the conversion error (TypeError, ValueError).
    """
    fallback = np.asarray(fallback, np.float64)
    if fallback.ndim > 1 or fallback.size == 0:
      raise ValueError(f"fallback must be a float or a non-empty sequence of floats, got {fallback.tolist()!r}.")
    width = fallback.size
    rows = list(rows)
    if any(isinstance(row, (str, bytes)) for row in rows):
      raise TypeError("VerifierExecutor.map: each row is the tuple of fn's arguments, got a string.")
    n = len(rows)
    values = np.zeros((n, width), np.float64)
    kinds: list[Optional[str]] = [None] * n
    first: dict[str, tuple[int, str]] = {}     # kind -> (row, message) of its first occurrence
    with self._lock:
      if self._closed:
        raise RuntimeError("VerifierExecutor.map called after close().")
      if n and self.timeout_s == 0:
        self._map_inline(fn, rows, width, values, kinds, first)
      elif n:
        self._map_in_worker(fn, rows, width, values, kinds, first)
    failed = np.array([k is not None for k in kinds], bool)
    values[failed] = fallback
    failures: dict[str, int] = {}
    for k in kinds:
      if k is not None:
        failures[k] = failures.get(k, 0) + 1
    for kind, count in failures.items():
      row, message = first[kind]
      logging.warning("%s: %d of %d rows failed with %s; first at row %d: %s",
                      fn_label(fn), count, n, kind, row, message)
    return RowResults(values[:, 0] if fallback.ndim == 0 else values, failed, failures)

  def close(self) -> None:
    """Stops the worker. Idempotent; also runs at garbage collection and interpreter exit."""
    with self._lock:
      self._closed = True
      self._discard_worker()

  def __enter__(self) -> "VerifierExecutor":
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  @property
  def worker_pid(self) -> Optional[int]:
    """The live worker's process id (None inline or before start); it changes when the worker is replaced."""
    return self._proc.pid if self._proc is not None else None

  # ---------------------------------------------------------------------------------------------- inline

  def _map_inline(self, fn, rows, width, values, kinds, first) -> None:
    status = np.zeros(len(rows), np.int32)
    names = {}

    def report(k, name, message, row):
      names[k] = name
      first.setdefault(name, (row, message))

    _run_rows(fn, rows, width, None, values.reshape(-1), status, np.zeros(1), report)
    for i, s in enumerate(status):
      kinds[i] = None if s == _OK else names[s - _ERROR]

  # ---------------------------------------------------------------------------------------------- worker

  def _start_worker(self) -> None:
    ctx = multiprocessing.get_context("spawn")
    parent_conn, child_conn = ctx.Pipe()
    proc = ctx.Process(target=_worker_main, name="rlkit-verifier", daemon=True,
                       args=(child_conn, self._values_buf, self._status_buf, self._stamp_buf))
    proc.start()
    child_conn.close()          # else the parent never sees EOF when the worker dies
    self._proc, self._conn, self._ready, self._worker_fn = proc, parent_conn, False, None
    self._stop = weakref.finalize(self, stop_worker, proc, parent_conn)

  def _discard_worker(self) -> None:
    if self._stop is not None:
      self._stop()
    self._proc = self._conn = self._stop = self._worker_fn = None
    self._ready = False

  def _kill_worker(self) -> None:
    self._proc.kill()
    self._proc.join(5.0)
    self._discard_worker()

  def _ensure_ready(self) -> None:
    if self._proc is not None and not self._proc.is_alive():
      self._discard_worker()
    if self._proc is None:
      self._start_worker()
    if self._ready:
      return
    try:
      ok = self._conn.poll(START_TIMEOUT_S) and self._conn.recv() == ("ready",)
    except (EOFError, OSError):
      ok = False
    if not ok:
      code = self._proc.exitcode
      self._kill_worker()
      raise RuntimeError(f"the verifier worker process did not start (exit code {code}; its error, if any, is "
                         f"printed above), or took over {START_TIMEOUT_S} s.")
    self._ready = True

  def _map_in_worker(self, fn, rows, width, values, kinds, first) -> None:
    n, start, restarts = len(rows), 0, 0
    call_deadline = math.inf if self.call_timeout_s is None else time.monotonic() + self.call_timeout_s
    chunk = _SLOTS // width
    while start < n:
      stop = min(n, start + chunk)
      before = time.monotonic()
      self._ensure_ready()
      call_deadline += time.monotonic() - before   # worker start-ups do not count against the call
      done, stopped = self._run_chunk(fn, rows, start, stop, width, values, kinds, first, call_deadline)
      if stopped is None:
        start = stop
        continue
      # The worker was killed (a hang it could not break, or the call's deadline) or died at row `done`.
      if stopped == "call_timeout":
        give_up, message = done, f"unfinished when the call reached call_timeout_s={self.call_timeout_s} s"
      else:
        kinds[done] = stopped
        first.setdefault(stopped, (done, f"ran past timeout_s + {KILL_GRACE_S} s without the alarm firing "
                                         "(a hang in C code); worker killed and restarted"
                                   if stopped == "timeout" else "the worker process died on this row"))
        restarts += 1
        give_up = done + 1 if restarts > MAX_RESTARTS_PER_CALL else n
        message = f"not scored: {restarts} worker restarts in this call"
      for i in range(give_up, n):
        kinds[i] = "timeout"
      if give_up < n:
        first.setdefault("timeout", (give_up, message))
        break
      start = done + 1

  def _run_chunk(self, fn, rows, start, stop, width, values, kinds, first, call_deadline):
    """Scores rows[start:stop] in the worker. Returns (index of the first unscored row, None if all were
    scored, else why the worker stopped: "timeout", "crash" or "call_timeout")."""
    m = stop - start
    self._status[:m] = _PENDING
    self._stamp[0] = 0.0        # 0: loading the message; then the start time of the row in flight
    send_fn = fn
    try:
      send_fn = None if fn is self._worker_fn or (hasattr(fn, "__self__") and fn == self._worker_fn) else fn
    except Exception:  # noqa: BLE001  (an exotic __eq__: just send fn again)
      pass
    try:
      payload = pickle.dumps((send_fn, rows[start:stop], width, self.timeout_s), pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001
      raise TypeError(f"VerifierExecutor: {fn_label(fn)} and its rows must pickle to run in the worker process "
                      f"({type(e).__name__}: {e}). Use a module-level function or a method of a frozen "
                      "dataclass, or timeout_s=0 to run inline.") from e
    try:
      self._conn.send_bytes(payload)
    except OSError:             # the worker died since the last call: send to a fresh one
      self._discard_worker()
      self._ensure_ready()
      payload = pickle.dumps((fn, rows[start:stop], width, self.timeout_s), pickle.HIGHEST_PROTOCOL)
      self._conn.send_bytes(payload)
    self._worker_fn = fn
    sent = time.monotonic()
    names: dict[int, str] = {}
    stopped = None

    def handle(message) -> bool:
      """Records an error type; True on "done"."""
      if message[0] == "error":
        _, k, name, text, row = message
        names[k] = name
        first.setdefault(name, (start + row, text))
      elif message[0] == "load_error":
        self._worker_fn = None
        raise TypeError(f"VerifierExecutor: the worker could not load {fn_label(fn)} or its rows "
                        f"({message[1]}); it must be importable there (defined at module level).")
      return message[0] == "done"

    while True:
      stamp = self._stamp[0]
      now = time.monotonic()
      if stamp == 0.0:          # loading: look again soon, since the first row's clock starts when it starts
        row_deadline = min(sent + START_TIMEOUT_S, now + _LOAD_POLL_S)
      else:
        row_deadline = stamp + self.timeout_s + KILL_GRACE_S
      wait = min(row_deadline, call_deadline) - now
      if wait > 0:
        try:
          if self._conn.poll(wait):
            if handle(self._conn.recv()):
              break
            continue
        except (EOFError, OSError):
          stopped = "crash"
      if stopped is None:
        now = time.monotonic()
        if now < call_deadline and (self._stamp[0] != stamp or (stamp == 0.0 and now < sent + START_TIMEOUT_S)):
          continue              # the worker moved on to another row meanwhile, or is still loading
        stopped = "call_timeout" if time.monotonic() >= call_deadline else "timeout"
      if self._stamp[0] == 0.0 and stopped != "call_timeout":
        code = self._proc.exitcode
        self._kill_worker()
        raise RuntimeError(f"the verifier worker {'died' if stopped == 'crash' else 'hung'} while loading a call "
                           f"to {fn_label(fn)} (exit code {code}).")
      self._proc.kill()
      self._proc.join(5.0)
      try:                      # error types it reported before it was killed name statuses written since
        while self._conn.poll(0):
          handle(self._conn.recv())
      except (EOFError, OSError):
        pass
      self._discard_worker()
      self._start_worker()      # start-up overlaps whatever the caller does next
      break
    status = self._status[:m].copy()
    pending = np.flatnonzero(status == _PENDING)
    scored = int(pending[0]) if pending.size else m
    values[start:start + scored] = self._values[:scored * width].reshape(scored, width)
    for i in np.flatnonzero(status[:scored] != _OK):
      if status[i] == _TIMEOUT:
        kinds[start + i] = "timeout"
        first.setdefault("timeout", (start + i, f"no result within timeout_s={self.timeout_s} s"))
      else:
        kinds[start + i] = names[status[i] - _ERROR]
    return (stop, None) if scored == m else (start + scored, stopped)
