"""experiments/sandbox_security: the driver writes one line per (mode, attack, repetition), skips what is done,
records a mode that cannot run, and archives; the summary's verdicts follow README's rules."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from experiments.sandbox_security import run as R  # noqa: E402
from experiments.sandbox_security import summarize as S  # noqa: E402
from rlkit.agents.attacks import ATTACKS  # noqa: E402

RLIMITS_OPEN = S.NOT_ISOLATED_BY_RLIMITS


def _outcomes(uncontained=(), wall=0.5):
  return [{"attack": a, "contained": a not in uncontained, "ended": "exit 0", "observed": "checked",
           "wall_s": wall} for a in ATTACKS.names()]


def _rows(modes: dict) -> dict:
  rows = {}
  for mode, (uncontained, wall) in modes.items():
    for rep in range(3):
      for o in _outcomes(uncontained, wall):
        key = f"{mode}/{o['attack']}/{rep}"
        rows[key] = {"key": key, "type": "attack", "mode": mode, "rep": rep, **o}
  rows["h"] = {"key": "h", "type": "host", "mode": "bwrap_root", "limits": {"wall_s": 3.0}, "commit": "abc",
               "kernel": "k", "bwrap": "bubblewrap 0.11.0"}
  return rows


def test_verdicts_follow_the_rules():
  good = _rows({"bwrap_root": ((), 0.5), "bwrap_user": ((), 0.5), "rlimits_root": (RLIMITS_OPEN, 0.5)})
  v = S.verdicts(good, 3.0)
  assert v["H1"].startswith("supported: 33 of 33") and v["H2"].startswith("supported")
  assert v["H3"].startswith("supported") and v["H4"].startswith("supported")
  bad = _rows({"bwrap_root": (("fork_bomb",), 4.5), "rlimits_root": ((), 0.5)})
  v = S.verdicts(bad, 3.0)
  assert v["H1"] == "not supported: 30 of 33 contained; not contained: fork_bomb"
  assert v["H2"].startswith("not measured") and v["H3"].startswith("not supported: bwrap_root 4.50 s")
  assert v["H4"].startswith("not supported")      # rlimits isolating the network would be a surprise: reported
  assert "| `fork_bomb` | NOT contained 0/3" in S.render(bad)


def test_the_driver_writes_skips_records_unavailable_modes_and_archives(tmp_path, monkeypatch):
  calls = []
  monkeypatch.setattr(R, "outcomes_root", lambda backend: calls.append(backend) or _outcomes())
  monkeypatch.setattr(R, "outcomes_user", lambda: (_ for _ in ()).throw(RuntimeError("no user here")))
  root, archive = tmp_path / "root", tmp_path / "archive"
  R.main([f"--root={root}", f"--archive={archive}"])
  rows = S.load(str(root))
  assert calls == ["bwrap"] * 3 + ["rlimits"] * 3
  assert sum(r["type"] == "attack" for r in rows.values()) == 2 * 3 * len(ATTACKS.names())
  assert rows["bwrap_user/unavailable"]["reason"] == "no user here"
  R.main([f"--root={root}", f"--archive={archive}"])           # everything done: nothing runs again
  assert len(calls) == 6 + 0
  assert S.load(str(archive)).keys() == rows.keys()
  with pytest.raises(SystemExit, match="not one of"):
    R.main([f"--root={root}", "--modes=docker", "--archive="])
  text = json.dumps(S.verdicts(rows, 3.0))
  assert "not measured (no user here)" in text
