"""XLA flags of the test run (tests/conftest.py sets them for the whole run; tests that start `launch.py` in a
subprocess with XLA_FLAGS of their own add `FAST_COMPILE`).

`FAST_COMPILE` compiles the CPU backend's elementwise fusions with its classic emitters instead of the newer
fusion emitters: measured on the 2-core EPYC, the `test` preset's 80 compilations took 22.8 s with the fusion
emitters and 8.7 s without, the whole run 40 -> 27 CPU-seconds. The tests compile many small programs and run each
briefly. A claim that two different programs give bit-identical numbers is checked under the default emitters
(`default_emitters`); the README's main job (tests/train/test_main_job.py) runs as users run it, without it. No jax import here: conftest reads this before
jax starts."""
import functools
import os
import subprocess
import sys
import tempfile
from xml.etree import ElementTree

FAST_COMPILE = "--xla_cpu_use_fusion_emitters=false"

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


_CHILD_RESULTS: dict = {}      # test file -> {node id: failure text or ""}, from one child run per file


def _run_in_child(path: str, names: list) -> dict:
  """Runs the functions `names` of test file `path` (every parametrisation) in one fresh pytest under the default
  emitters: {node id: "" if it passed, else its failure report}."""
  env = dict(os.environ, XLA_FLAGS=" ".join(os.environ.get("XLA_FLAGS", "").replace(FAST_COMPILE, "").split()))
  env.pop("PYTEST_XDIST_WORKER", None)
  with tempfile.TemporaryDirectory() as folder:
    report = os.path.join(folder, "report.xml")
    child = subprocess.run([sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider",
                            f"--junitxml={report}", *(f"{path}::{name}" for name in names)],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    if not os.path.exists(report):
      raise AssertionError(f"the child pytest under the default emitters ran nothing:\n{child.stdout[-3000:]}"
                           f"{child.stderr[-3000:]}")
    results = {}
    for case in ElementTree.parse(report).iter("testcase"):
      problems = [e.get("message", "") + "\n" + (e.text or "") for e in case if e.tag in ("failure", "error")]
      results[f"{path}::{case.get('name')}"] = "\n".join(problems)
  return results


def default_emitters(test):
  """Runs the decorated test under XLA's default CPU emitters, in a fresh interpreter when this one compiles with
  `FAST_COMPILE`: for claims that two *different* programs give bit-identical numbers (the v2 step and v1's, a
  sharded and a plain init), which the classic emitters do not keep (measured: 1-ulp differences in 4-29% of
  the elements, where the fusion emitters give none). One child pytest per test file runs every decorated test of
  the file (its first decorated test starts it); each test reports its own outcome there."""
  test.default_emitters = True

  @functools.wraps(test)
  def wrapper(*args, **kwargs):
    if FAST_COMPILE not in os.environ.get("XLA_FLAGS", ""):
      return test(*args, **kwargs)
    node = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]
    path = node.split("::")[0]
    if path not in _CHILD_RESULTS:
      module = sys.modules[test.__module__]
      names = [name for name, f in vars(module).items() if getattr(f, "default_emitters", False)]
      _CHILD_RESULTS[path] = _run_in_child(path, names)
    assert node in _CHILD_RESULTS[path], f"{node} did not run in the child pytest under the default emitters"
    assert not _CHILD_RESULTS[path][node], f"{node} under the default emitters:\n{_CHILD_RESULTS[path][node]}"
  return wrapper
