"""The sandbox (rlkit/agents/sandbox.py): every attack of rlkit/agents/attacks.py is contained by bubblewrap; the
weaker rlimits backend contains the resource attacks and reports what it does not isolate; limits, files,
stdin, exit codes, parallel runs and the no-silent-fallback rule."""
import dataclasses
import os
import shutil

import pytest

from rlkit.agents import sandbox as sb
from rlkit.agents.attacks import ATTACKS, run_attacks
from rlkit.agents.sandbox import Job, Limits, Sandbox, SandboxUnavailable

LIMITS = Limits(cpu_s=1, wall_s=1.5, memory_mb=256, processes=16, output_bytes=4096, disk_mb=4)
# What the rlimits backend cannot stop: it does not isolate the filesystem or the network (module docstring).
NOT_ISOLATED_BY_RLIMITS = {"network_connect", "read_host_paths", "write_host_paths"}


def _open_python():
  """An interpreter every user can run (the rlimits backend as root runs programs as another user)."""
  for path in (sb.default_python(), shutil.which("python3") or "", "/usr/bin/python3"):
    try:
      sb.check_backend("rlimits", os.path.realpath(path))
      return os.path.realpath(path)
    except (SandboxUnavailable, OSError):
      continue
  return None


@pytest.fixture(scope="module")
def box():
  return Sandbox(LIMITS)


def test_every_attack_is_contained_by_bwrap(box):
  outcomes = run_attacks(box)
  assert {o.attack for o in outcomes} == set(ATTACKS.names())
  failed = [o for o in outcomes if not o.contained]
  assert not failed, failed
  ended = {o.attack: o.ended for o in outcomes}
  # The loop meets the CPU limit first on an idle machine, the wall limit on a loaded one (test_the_cpu_limit...).
  assert ended["infinite_loop"] in ("limit cpu", "limit wall") and ended["huge_output"] == "limit output"
  assert max(o.wall_s for o in outcomes) < LIMITS.wall_s + 1.0


def test_the_cpu_limit_stops_a_busy_loop():
  """With a wall limit far past it, the CPU limit is what stops a loop even on a loaded machine."""
  r = Sandbox(dataclasses.replace(LIMITS, wall_s=30)).run(Job.python("while True:\n    pass\n"))
  assert r.limit == "cpu", r


def test_rlimits_backend_contains_the_resource_attacks_and_says_what_it_does_not():
  python = _open_python()
  if python is None:
    pytest.skip("no interpreter here that another user can run (the rlimits backend's requirement as root)")
  box = Sandbox(LIMITS, backend="rlimits", python=python)
  outcomes = {o.attack: o for o in run_attacks(box)}
  uncontained = {name for name, o in outcomes.items() if not o.contained}
  assert uncontained <= NOT_ISOLATED_BY_RLIMITS, [outcomes[n] for n in uncontained - NOT_ISOLATED_BY_RLIMITS]
  assert box.python("print(1)").isolation == "rlimits"


def test_program_sees_its_files_stdin_and_a_scrubbed_environment(box, monkeypatch):
  monkeypatch.setenv("RLKIT_TEST_TOKEN", "leak")
  job = Job.python("import os, sys\nprint(open('/task/data.txt').read().strip(), sys.stdin.read().strip())\n"
                   "print(sorted(os.environ))\nprint(os.getcwd())\nopen('/task/data.txt', 'w')\n",
                   stdin=b"from stdin", files={"data.txt": "from a file"})
  r = box.run(job)
  lines = r.stdout.splitlines()
  assert lines[0] == "from a file from stdin"
  assert "RLKIT_TEST_TOKEN" not in lines[1] and "HOME" in lines[1]
  assert lines[2] == sb.WORKDIR
  assert r.exit_code == 1 and "Read-only file system" in r.stderr and r.isolation == "bwrap"


def test_exit_codes_and_output_limit_keep_the_first_bytes(box):
  assert box.python("import sys; sys.exit(3)").exit_code == 3
  assert box.shell("exit 0").ok
  r = box.python("import sys\nsys.stdout.write('abc' * 10000)\nsys.stdout.flush()\nimport time; time.sleep(5)")
  assert r.limit == "output" and r.exit_code is None and not r.ok
  assert len(r.stdout) == LIMITS.output_bytes and r.stdout.startswith("abcabc")


def test_wall_limit_stops_a_sleeping_program(box):
  r = box.python("import time; time.sleep(60)")
  assert r.limit == "wall" and r.exit_code is None and r.wall_s < LIMITS.wall_s + 1.0


def test_a_fork_bomb_does_not_starve_a_concurrent_run(box):
  bomb = Job.python("import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n")
  results = box.map([bomb, Job.python("import os; os.fork() or print('child'); os.wait()")], workers=2)
  assert results[1].ok and "child" in results[1].stdout


def test_parallel_map_keeps_job_order(box):
  results = box.map([Job.python(f"print({i} * {i})") for i in range(6)], workers=3)
  assert [r.stdout.strip() for r in results] == [str(i * i) for i in range(6)]


def test_no_silent_fallback_when_bwrap_is_missing(monkeypatch):
  monkeypatch.setattr(sb, "bwrap_binary", lambda: None)
  monkeypatch.setattr(sb, "_CHECKED", {})
  with pytest.raises(SandboxUnavailable, match="choose the weaker backend 'rlimits' explicitly"):
    Sandbox(LIMITS)


def test_bad_limits_and_file_names_are_clear_errors(box):
  with pytest.raises(ValueError, match="cpu_s=0 must be a positive number"):
    Limits(cpu_s=0)
  with pytest.raises(ValueError, match="plain file name"):
    box.run(Job.python("pass", files={"../x": "y"}))
  with pytest.raises(KeyError):
    Sandbox(LIMITS, backend="docker")
