"""The tuned-malloc re-exec: the command runs again once, with the tunables set, and refuses to override."""
import os
import platform
import subprocess
import sys

import pytest
from tests.xla_flags import FAST_COMPILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPT = ("import sys; print('start', flush=True); "
          "from rlkit.parallel.host_memory import reexec_with_tuned_malloc, tuned_malloc_active; "
          "reexec_with_tuned_malloc(); print('active', tuned_malloc_active(), sys.argv[1:])")

glibc_only = pytest.mark.skipif(sys.platform != "linux" or platform.libc_ver()[0] != "glibc",
                                reason="the tunables are glibc's")


def _env_without_tunables(**extra):
  return dict({k: v for k, v in os.environ.items() if k != "GLIBC_TUNABLES"}, **extra)


def _run(env_extra):
  env = _env_without_tunables(**env_extra, PYTHONPATH=ROOT)
  return subprocess.run([sys.executable, "-c", SCRIPT, "--flag", "x"], env=env, capture_output=True, text=True,
                        timeout=120)


@glibc_only
def test_reexec_runs_the_command_again_once_with_the_tunables():
  r = _run({})
  assert r.returncode == 0, r.stderr
  # The first run prints "start" and is replaced; the second, with the variable set, runs through.
  assert r.stdout.splitlines() == ["start", "start", "active True ['--flag', 'x']"]


@glibc_only
def test_an_existing_setting_is_not_overridden():
  r = _run({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
  assert r.returncode != 0
  assert "already set" in r.stderr and "glibc.malloc.arena_max=2" in r.stderr


@glibc_only
def test_launch_reruns_itself_and_still_validates_first(tmp_path):
  # launch.py --tuned_malloc re-executes before validating; the rerun (flags parsed again) reports the typo.
  workdir = tmp_path / "run"
  cmd = [sys.executable, os.path.join(ROOT, "launch.py"), "--tuned_malloc",
         f"--config={os.path.join(ROOT, 'configs', 'grpo_arith.py')}:test", "--config.rl.advantage=grpoo",
         f"--workdir={workdir}"]
  r = subprocess.run(cmd, cwd=ROOT, env=_env_without_tunables(XLA_FLAGS=FAST_COMPILE, JAX_PLATFORMS="cpu"),
                     capture_output=True, text=True, timeout=120)
  assert r.returncode == 2 and "grpoo" in r.stderr, r.stderr[-2000:]
  assert not workdir.exists()
