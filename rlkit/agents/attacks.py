"""Attacks a sandboxed program may try against its host, each with the host-side check of how it ended.

`run_attacks(sandbox)` runs every registered attack in a fresh sandbox and returns one `Outcome` per attack:
whether the host and the run were unaffected (`contained`), how the run ended, and what was observed. The
tests (tests/agents/test_sandbox_attacks.py) require every attack to be contained on the bwrap backend, and
`experiments/sandbox_security/` reports the outcomes. An attack is `Attack(job(ctx), check(result, ctx))`:
`ctx` holds what the host planted or watches (a secret in its environment and in a file, a listening socket,
a victim process, the host's pid), made by `host_context()` and released by `ctx.close()`.
"""
from __future__ import annotations

import dataclasses
import os
import socket
import subprocess
import sys
import tempfile
import time
from typing import Callable, NamedTuple

from rlkit.agents.sandbox import Job, Result, Sandbox
from rlkit.core.registry import Registry

SECRET_ENV = "RLKIT_SANDBOX_PROBE_SECRET"


class Attack(NamedTuple):
  job: Callable          # HostContext -> Job
  check: Callable        # (Result, HostContext) -> (contained: bool, observed: str)


class Outcome(NamedTuple):
  attack: str
  contained: bool
  ended: str             # how the run ended: "exit 0", "exit 1", "limit cpu", ...
  observed: str          # what the host checked and saw
  wall_s: float


@dataclasses.dataclass
class HostContext:
  secret: str
  secret_file: str       # a host file holding `secret`
  target_dir: str        # a host directory the attack tries to write into
  port: int              # a host TCP listener on 127.0.0.1
  listener: socket.socket
  victim: subprocess.Popen   # a host process the attack tries to kill
  host_pid: int

  def close(self) -> None:
    self.listener.close()
    self.victim.kill()
    self.victim.wait()
    for name in os.listdir(self.target_dir):
      os.remove(os.path.join(self.target_dir, name))
    os.rmdir(self.target_dir)
    os.remove(self.secret_file)
    os.environ.pop(SECRET_ENV, None)


def host_context() -> HostContext:
  """Plants the secrets and starts the listener and the victim (the caller's environment gains SECRET_ENV
  until `close`)."""
  secret = "s3cr3t-" + os.urandom(8).hex()
  os.environ[SECRET_ENV] = secret
  fd, secret_file = tempfile.mkstemp(prefix="rlkit-secret-")
  with os.fdopen(fd, "w") as f:
    f.write(secret)
  os.chmod(secret_file, 0o644)
  target_dir = tempfile.mkdtemp(prefix="rlkit-target-")
  os.chmod(target_dir, 0o777)
  listener = socket.socket()
  listener.bind(("127.0.0.1", 0))
  listener.listen(8)
  listener.setblocking(False)
  victim = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
  return HostContext(secret, secret_file, target_dir, listener.getsockname()[1], listener, victim, os.getpid())


def _ended(r: Result) -> str:
  return f"limit {r.limit}" if r.limit else f"exit {r.exit_code}"


def _accepted(listener: socket.socket) -> bool:
  try:
    listener.accept()[0].close()
    return True
  except BlockingIOError:
    return False


ATTACKS: Registry[Attack] = Registry("sandbox attack")
_py = Job.python


def _attack(name: str, job: Callable, check: Callable) -> None:
  ATTACKS.register(name)(Attack(job, check))


def _said(r: Result, word: str) -> list[str]:
  """The stdout lines of the attack that start with `word` (what it reports having done)."""
  return [line for line in r.stdout.splitlines() if line.startswith(word)]


def _check_fork_bomb(r, c):
  ok = _can_spawn()
  return ok, f"the host {'starts' if ok else 'cannot start'} a process afterwards"


def _check_memory_bomb(r, c):
  ok = "MemoryError" in r.stderr or r.limit in ("cpu", "wall")
  return ok, "MemoryError inside the sandbox" if "MemoryError" in r.stderr else f"ended: {_ended(r)}"


def _check_infinite_loop(r, c):
  return r.limit in ("cpu", "wall"), f"stopped by the {r.limit} limit" if r.limit else "not stopped by a limit"


def _check_output(r, c):
  return r.limit == "output" and len(r.stdout) <= 1 << 20, f"killed at the output limit, {len(r.stdout)} bytes kept"


def _check_network(r, c):
  reached = _accepted(c.listener)
  connected = _said(r, "connected")
  ok = not reached and not connected
  return ok, ("no connection reached the host listener or the internet" if ok else
              f"host listener reached: {reached}; {connected}")


def _check_write(r, c):
  wrote = os.listdir(c.target_dir) + [p for p in ("/pwned", "/usr/pwned") if os.path.exists(p)]
  return not wrote, "no file appeared on the host" if not wrote else f"host files written: {wrote}"


def _check_read(r, c):
  leaked = c.secret in r.stdout + r.stderr
  repo = "ATTACKS: Registry" in r.stdout
  ok = not leaked and not repo
  read = [what for what, seen in (("the secret file", leaked), ("the repository", repo)) if seen]
  return ok, "the secret file and the repository are unreadable" if ok else f"read: {', '.join(read)}"


def _check_environment(r, c):
  ok = c.secret not in r.stdout + r.stderr
  return ok, "the host's secret environment variable is not visible" if ok else "the host's secret leaked"


def _check_kill(r, c):
  alive = c.victim.poll() is None
  return alive, f"the host's victim process is {'alive' if alive else 'dead'}; the sandbox reports {_said(r, 'killed')}"


def _check_escape(r, c):
  left = _survivors(b"sleep\0" + _marker(c).encode())
  ok = r.limit in ("cpu", "wall") and not left
  return ok, (f"stopped by the {r.limit or 'no'} limit; " +
              ("no process of the run outlived it" if not left else f"{len(left)} detached process(es) survived"))


def _check_disk(r, c):
  stopped = _said(r, "stopped")
  ok = r.limit == "file_size" or bool(stopped)
  return ok, f"writes stopped: {(stopped or [r.limit])[0][:80]}" if ok else "writes did not stop"


_attack("fork_bomb", lambda c: _py("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n"
                                   "        pass\n"), _check_fork_bomb)
_attack("memory_bomb", lambda c: _py("blocks = []\nwhile True:\n    blocks.append(bytearray(64 << 20))\n"),
        _check_memory_bomb)
_attack("infinite_loop", lambda c: _py("while True:\n    pass\n"), _check_infinite_loop)
_attack("huge_output", lambda c: _py("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"), _check_output)
_attack("network_connect",
        lambda c: _py("import socket\nfor host, port in [('127.0.0.1', %d), ('1.1.1.1', 80), ('8.8.8.8', 53)]:\n"
                      "    try:\n        socket.create_connection((host, port), timeout=1).close()\n"
                      "        print('connected', host)\n    except OSError as e:\n        print('refused', host, e)\n"
                      % c.port), _check_network)
_attack("write_host_paths",
        lambda c: _py("import os\nfor path in [%r, '/usr/pwned', '/pwned']:\n    try:\n"
                      "        open(path, 'w').write('x')\n        print('wrote', path)\n"
                      "    except OSError as e:\n        print('denied', path, e)\n"
                      % os.path.join(c.target_dir, "pwned")), _check_write)
_attack("read_host_paths",
        lambda c: _py("import os\nfor path in [%r, %r, '/etc/shadow', '/etc/passwd']:\n    try:\n"
                      "        print(open(path).read()[:4000])\n    except OSError as e:\n        print('denied', e)\n"
                      % (c.secret_file, os.path.abspath(__file__))), _check_read)
_attack("read_parent_environment",
        lambda c: _py("import os, glob\nprint(dict(os.environ))\nfor p in glob.glob('/proc/*/environ') + "
                      "glob.glob('/proc/*/cmdline'):\n    try:\n        print(open(p, 'rb').read())\n"
                      "    except OSError:\n        pass\n"), _check_environment)
_attack("kill_parent",
        lambda c: _py("import os, signal\nfor pid in (%d, %d, os.getppid(), -1):\n    try:\n"
                      "        os.kill(pid, signal.SIGKILL)\n        print('killed', pid)\n"
                      "    except OSError as e:\n        print('denied', pid, e)\n" % (c.host_pid, c.victim.pid)),
        _check_kill)
_attack("escape_time_limit",
        lambda c: _py("import os, signal\nfor s in (signal.SIGTERM, signal.SIGXCPU, signal.SIGHUP):\n"
                      "    signal.signal(s, signal.SIG_IGN)\nif os.fork() == 0:\n    os.setsid()\n"
                      "    if os.fork() == 0:\n        os.execv('/bin/sleep', ['sleep', %r])\n    os._exit(0)\n"
                      "while True:\n    pass\n" % _marker(c)), _check_escape)
_attack("fill_disk",
        lambda c: _py("n = 0\ntry:\n    with open('big', 'wb') as f:\n        while True:\n"
                      "            f.write(b'0' * (1 << 20))\n            f.flush()\n            n += 1\n"
                      "except OSError as e:\n    print('stopped', n, e)\n"), _check_disk)


def _marker(c: HostContext) -> str:
  """A sleep duration no other process uses: the daemon's command line the host looks for."""
  return f"{300 + c.port % 97}.{c.port}"


def _can_spawn() -> bool:
  return subprocess.run([sys.executable, "-c", "pass"], timeout=60).returncode == 0


def _survivors(marker: bytes) -> list[int]:
  """Host pids whose command line contains `marker`."""
  found = []
  for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
      with open(f"/proc/{pid}/cmdline", "rb") as f:
        if marker in f.read():
          found.append(int(pid))
    except OSError:
      continue
  return found


def run_attacks(sandbox: Sandbox, names=None) -> list[Outcome]:
  """Every attack (or those named) in a fresh sandbox, with its host-side check."""
  ctx = host_context()
  try:
    outcomes = []
    for name in names or ATTACKS.names():
      attack = ATTACKS.get(name)
      # A token on the program's command line that only this run's processes carry: other sandboxes on the
      # machine (another test, an RL run's grader) also run /task/main.py and must not count as survivors.
      token = f"rlkit-attack-{os.getpid()}-{ctx.port}-{name}"
      job = attack.job(ctx)
      result = sandbox.run(job._replace(argv=tuple(job.argv) + (token,)))
      time.sleep(0.05)   # let a killed namespace finish dying before the host looks
      contained, observed = attack.check(result, ctx)
      left = _survivors(token.encode())
      if left:
        contained, observed = False, f"{observed}; {len(left)} of its processes outlived the run"
      outcomes.append(Outcome(name, bool(contained), _ended(result), observed, round(result.wall_s, 3)))
    return outcomes
  finally:
    ctx.close()
