"""Every experiment's results.md is regenerated from runs archived in the repository: its regenerate command
(`python experiments/<name>/summarize.py --root=experiments/<name>/runs ...`, written in results.md) is run
over the archive, and every data-table row of results.md must be printed by it, cell for cell. The verdict
tables (a `verdict` or `met?` column) are exempt: they are written from the numbers above them.

An experiment without an archive yet is listed in PENDING with the reason; the list only shrinks."""
import contextlib
import glob
import io
import os
import re
import runpy
import shlex
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# Experiments whose runs left no archive yet, each with why (empty since every rerun of issue 31 archived).
PENDING: dict = {}


def _experiments():
  return sorted(os.path.basename(os.path.dirname(p))
                for p in glob.glob(os.path.join(REPO, "experiments", "*", "results.md")))


def _command(name):
  text = open(os.path.join(REPO, "experiments", name, "results.md")).read()
  m = re.search(rf"python (experiments/{name}/summarize\.py --root=experiments/{name}/runs[^`\n]*)", text)
  return (shlex.split(m.group(1)), text) if m else (None, text)


def _data_rows(text):
  rows, verdict_table = [], False
  for line in text.splitlines():
    if not line.startswith("|"):
      verdict_table = False
      continue
    cells = [c.strip() for c in line.strip("|").split("|")]
    if set(line) <= set("|-: "):
      continue
    if not rows or not verdict_table:
      verdict_table = verdict_table or any(c in ("verdict", "met?") for c in cells)
    if not verdict_table:
      rows.append(line)
  return rows


def test_every_experiment_is_archived_or_pending():
  for name in _experiments():
    command, _ = _command(name)
    assert (command is not None) != (name in PENDING), (
        f"experiments/{name}: results.md must name its regenerate command over experiments/{name}/runs, or the "
        f"experiment must be in PENDING with why (and not both)")


@pytest.mark.parametrize("name", [n for n in _experiments() if n not in PENDING])
def test_results_md_is_regenerated_from_the_archive(name, tmp_path, monkeypatch):
  (script, *args), text = _command(name)
  monkeypatch.chdir(REPO)
  monkeypatch.setattr(sys, "argv", [script, *args, f"--out={tmp_path}"])
  out = io.StringIO()
  with contextlib.redirect_stdout(out):
    try:
      runpy.run_path(os.path.join(REPO, script), run_name="__main__")
    except SystemExit as e:
      assert not e.code, f"{script} exited with {e.code}"
  printed = out.getvalue()
  missing = [row for row in _data_rows(text) if row not in printed]
  assert not missing, f"rows of experiments/{name}/results.md its summary does not print: {missing[:3]}"
