"""docs/adding_a_method.md's examples run against the current code, so a stale example fails here.

Every ```python block of the page carries an HTML comment on the line after its closing fence:

  <!-- tested: module NAME.py -->   a module the page's other examples import (registers components)
  <!-- tested: run NAME.py -->      a script: run as __main__ (its own fresh namespace), in page order
  <!-- tested: import NAME.py -->   a script guarded by `if __name__ == "__main__":` (a full run): imported only
  <!-- signature -->               a registry's signature sketch, not code; it must import nothing

and a ```bash block marked `<!-- tested: shell -->` runs as written. Every file goes in one folder, the page's
`/tmp/my_method` (a fresh temporary folder here, substituted in the code), which is on PYTHONPATH beside the
repository root, as the page says to run them.

All examples run in one subprocess (`python tests/test_adding_a_method.py PAGE FOLDER`): the modules register
names (doc_*, old_kl, weighted_verifier, an RL config section) in rlkit's registries, and a registration made in
a pytest worker would stay in every later test of that worker (an extra `rl` section in every config, an extra
name in every "valid names" message). The subprocess compiles with XLA's optimisation passes off, as the stage
tests do (tests/fast_compile.py): the examples' checks do not depend on fusion choices.
"""
from __future__ import annotations

import json
import os
import re
import runpy
import subprocess
import sys
import tempfile
import time
import traceback

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGE = os.path.join(ROOT, "docs", "adding_a_method.md")
PLACEHOLDER = "/tmp/my_method"          # the page's example folder

# Every tested block of the page, in page order. A block that disappears from the page, or a new one, is a
# visible change here.
EXPECTED = [
    "module doc_brevity.py", "run check_brevity_section.py",
    "module doc_two_turn.py", "run check_two_turn.py",
    "run check_brevity_shaper.py",
    "module doc_best_copy.py", "run check_best_copy.py",
    "module doc_running.py", "run check_running.py",
    "module doc_segment_credit.py", "run check_segment_credit.py",
    "module doc_schedules.py", "run check_schedule.py",
    "module doc_gaussian.py", "run check_gaussian.py",
    "module doc_int8_tensor.py", "run check_int8_tensor.py",
    "module doc_stage.py", "run check_stage.py",
    "run make_data.py", "module my_method.py", "module my_config.py", "shell",
    "import run_my_method.py", "run check_old_kl.py",
]

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n(?:\n?(<!-- (?:tested: ([^>]*?)|signature) -->))?", re.M | re.S)


def blocks(text: str) -> list[dict]:
  """The page's fenced blocks: {lang, code, marker ("module x.py", "shell", "signature" or None), line}."""
  out = []
  for m in _FENCE.finditer(text):
    marker = m.group(4) if m.group(4) is not None else ("signature" if m.group(3) else None)
    out.append({"lang": m.group(1), "code": m.group(2), "marker": marker,
                "line": text.count("\n", 0, m.start()) + 1})
  return out


def marked_blocks(text: str) -> list[dict]:
  return [b for b in blocks(text) if b["marker"] not in (None, "signature")]


# ------------------------------------------------------------------------------------- the runner (subprocess)

def run_examples(page: str, folder: str) -> list[dict]:
  """Writes every tested block into `folder` (the page's example folder substituted), then runs the scripts and
  shell blocks in page order; returns one {name, ok, error, seconds} per tested block."""
  with open(page) as f:
    examples = marked_blocks(f.read())
  for b in examples:
    b["code"] = b["code"].replace(PLACEHOLDER, folder)
    kind, _, name = b["marker"].partition(" ")
    if kind in ("module", "run", "import"):
      with open(os.path.join(folder, name), "w") as f:
        f.write(b["code"])
  os.chdir(ROOT)
  sys.path[:0] = [ROOT, folder]
  results = []
  for b in examples:
    kind, _, name = b["marker"].partition(" ")
    t0, error = time.perf_counter(), ""
    try:
      if kind == "run":
        runpy.run_path(os.path.join(folder, name), run_name="__main__")
      elif kind == "import":
        runpy.run_path(os.path.join(folder, name), run_name=name[:-3])
      elif kind == "shell":
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, folder, os.environ.get("PYTHONPATH", "")]))
        out = subprocess.run(["bash", "-euo", "pipefail", "-c", b["code"]], cwd=ROOT, env=env,
                             capture_output=True, text=True, timeout=300)
        if out.returncode:
          error = f"exit {out.returncode}\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
      elif kind != "module":
        error = f"unknown marker {b['marker']!r}"
    except BaseException:           # noqa: BLE001  (a failing example is reported, the others still run)
      error = traceback.format_exc()
    results.append({"name": b["marker"], "line": b["line"], "ok": not error, "error": error,
                    "seconds": round(time.perf_counter() - t0, 2)})
  return results


# ------------------------------------------------------------------------------------------------------ tests

def _page() -> str:
  with open(PAGE) as f:
    return f.read()


@pytest.fixture(scope="module")
def results():
  with tempfile.TemporaryDirectory(prefix="rlkit-doc-examples-") as folder:
    env = dict(os.environ, JAX_DISABLE_MOST_OPTIMIZATIONS="1")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), PAGE, folder], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=900)
    lines = [l for l in out.stdout.splitlines() if l.startswith("{")]
    assert out.returncode == 0 and lines, f"the example runner failed:\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}"
    return {r["name"]: r for r in map(json.loads, lines)}


def test_every_python_block_is_tested_or_a_signature():
  for b in blocks(_page()):
    if b["lang"] == "python":
      assert b["marker"] is not None, (f"docs/adding_a_method.md:{b['line']}: a python block without a "
                                        "`<!-- tested: ... -->` or `<!-- signature -->` comment after it")
    if b["marker"] == "signature":
      assert not re.search(r"^\s*(import|from) ", b["code"], re.M), (
          f"docs/adding_a_method.md:{b['line']}: a signature sketch imports; mark it as a tested example")


def test_the_tested_blocks_are_the_expected_ones():
  assert [b["marker"] for b in marked_blocks(_page())] == EXPECTED


@pytest.mark.parametrize("name", EXPECTED)
def test_example(results, name):
  r = results.get(name)
  assert r is not None, f"{name} did not run"
  assert r["ok"], f"docs/adding_a_method.md:{r['line']}: {name} failed:\n{r['error']}"


if __name__ == "__main__":
  for result in run_examples(sys.argv[1], sys.argv[2]):
    print(json.dumps(result), flush=True)
