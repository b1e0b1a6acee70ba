"""experiments/accrue: the arms differ in their fields only and validate; the summary's measures and verdicts
follow README's rules on hand-written runs; the driver stops at a failed gate before any other arm."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs import accrue as C  # noqa: E402
from experiments.accrue import run as R  # noqa: E402
from experiments.accrue import summarize as S  # noqa: E402
from experiments.gate import GATE_FAILED  # noqa: E402
from rlkit.cli import changed_keys  # noqa: E402
from tests.experiments.workdirs import write_workdir  # noqa: E402

P, T = C.PER_TASK, len(C.TASKS)


def test_the_arms_differ_in_their_fields_only_and_validate():
  from rlkit.train.config_checks import validate
  ref = C.get_config("accrue")
  for preset in C.PRESETS:
    c = C.get_config(preset)
    validate(c)
    if preset in C.ARMS:
      assert set(changed_keys(ref.to_dict(), c.to_dict())) == {f"accrue.{k}" for k in C.ARMS[preset]}, preset
  assert C.get_config("bc").stages == ("bc",) and len(ref.accrue.tasks) == T


def _rows(reach: int, matrix):
  """Evaluations every 5 iterations: each task at 0.1 until `reach` iterations into it, then 0.9 (tasks 2-4);
  `matrix` the success rows at the task ends."""
  rows = [{"stage": "accrue", "step": s, "eval/task": (s - 1) // P,
           "eval/success": 0.9 if (s - 1) // P == 0 or (s - 1) % P + 1 >= reach else 0.1} for s in range(5, T * P + 1, 5)]
  rows += [{"stage": "accrue", "step": (k + 1) * P, **{f"accrue/success_t{j}": v for j, v in enumerate(row)}}
           for k, row in enumerate(matrix)]
  return rows


def _write(root, name, rows):
  write_workdir(os.path.join(root, name), {"stages": ["accrue"], "accrue": {"steps": T * P}}, rows)


def test_measures_and_verdicts_follow_the_rules(tmp_path):
  root = str(tmp_path)
  kept = [[0.9, 0.1, 0.1, 0.1], [0.9, 0.9, 0.1, 0.1], [0.8, 0.9, 0.9, 0.1], [0.8, 0.8, 0.9, 0.9]]
  lost = [[0.9, 0.1, 0.1, 0.1], [0.3, 0.9, 0.1, 0.1], [0.2, 0.3, 0.9, 0.1], [0.2, 0.2, 0.3, 0.9]]
  for seed in (0, 1, 2):
    _write(root, f"fresh_s{seed}", _rows(25, lost))
    _write(root, f"seqft_s{seed}", _rows(10, lost))
    _write(root, f"accrue_s{seed}", _rows(10, kept))
    _write(root, f"base_s{seed}", _rows(P + 1, [[0.1] * T] * T))
  runs = S.load_all(root, (0, 1, 2))
  assert runs["accrue"][0]["steps"] == 10 * S.ENV_STEPS_PER_ITERATION
  assert runs["base"][0]["censored"] == T - 1 and runs["base"][0]["steps"] == P * S.ENV_STEPS_PER_ITERATION
  assert abs(runs["seqft"][0]["forgetting"] - (0.7 + 0.7 + 0.6) / 3) < 1e-9
  assert abs(runs["accrue"][0]["forgetting"] - (0.1 + 0.1 + 0.0) / 3) < 1e-9
  v = S.verdicts(runs)
  assert v["H1"].startswith("supported") and v["H2"].startswith("supported"), v
  _write(root, "accrue_s1", _rows(25, lost))
  _write(root, "accrue_s2", _rows(25, lost))
  v = S.verdicts(S.load_all(root, (0, 1, 2)))
  assert v["H1"].startswith("not supported") and v["H2"].startswith("not supported"), v
  assert "| base | 3 |" in "\n".join(S.table(runs))


def test_the_driver_stops_at_a_failed_gate(tmp_path, monkeypatch):
  launched = []

  def launch(root, path, config, args, *rest, **kw):
    launched.append(os.path.basename(path))
    _write(os.path.dirname(path), os.path.basename(path), _rows(P + 1, [[0.1] * T] * T))
    return 0
  monkeypatch.setattr(R, "launch", launch)
  monkeypatch.setattr(R, "gate", lambda args: False)
  assert R.main([f"--root={tmp_path}", "--archive="]) == GATE_FAILED
  assert launched == ["bc_s0", "base_s0", "accrue_s0"]
