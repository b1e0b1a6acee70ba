"""experiments/mimo_graders: the arms differ in the grader and the estimator only and validate; the driver runs the
SFT, then the gate on it before any arm, and stops at a failed gate; the summary's verdicts follow README's rules
on hand-written runs."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs import mimo_graders as cfg_module  # noqa: E402
from experiments.gate import GATE_FAILED, read_gate  # noqa: E402
from experiments.mimo_graders import run as R  # noqa: E402
from experiments.mimo_graders import summarize as S  # noqa: E402
from rlkit.cli import changed_keys  # noqa: E402
from rlkit.train.stages import AT_STAGE_START  # noqa: E402
from tests.experiments.workdirs import write_workdir  # noqa: E402


def test_the_arms_differ_in_grader_and_estimator_only_and_validate():
  from rlkit.train.rl_stage import validate
  base = cfg_module.get_config("pass_fail")
  for arm in cfg_module.ARMS:
    c = cfg_module.get_config(arm)
    c.model.path = "x"
    validate(c.rl, "rl")
    assert set(changed_keys(base.to_dict(), c.to_dict())) <= {"model.path", "rl.reward.kwargs.grader",
                                                              "rl.advantage", "rl.gar.length_coef"}
  gate = cfg_module.get_config("gate")
  assert gate.rl.optimizer.frozen == "." and gate.rl.steps == cfg_module.GATE["steps"]
  assert {cfg_module.get_config(p).rl.temperature for p in ("gate", *cfg_module.ARMS)} == {cfg_module.TEMPERATURE}
  assert cfg_module.get_config("sft").task.kwargs.verbose_rate == cfg_module.VERBOSE


def _rows(passed, quality, length, audit=0.0, start=0.3, end=0.4, steps=12):
  rows = [{"stage": "rl", "step": 1, AT_STAGE_START: True, "eval/accuracy": start}]
  rows += [{"stage": "rl", "step": s, "step_s": 5.0, "reward/all_pass": passed, "reward/quality": quality,
            "response_len_correct": length, "response_len": length, "reward/audit_reset": audit}
           for s in range(1, steps + 1)]
  return rows + [{"stage": "rl", "step": steps, "eval/accuracy": end}]


def _write(root, name, rows):
  write_workdir(os.path.join(root, name), {"stages": ["rl"], "rl": {"steps": rows[-1]["step"]}}, rows)


def test_verdicts_follow_the_rules(tmp_path):
  root = str(tmp_path)
  for s in (0, 1):
    _write(root, f"pass_fail_s{s}", _rows(0.5, 0.70, 80.0, end=0.40))
    _write(root, f"grs_s{s}", _rows(0.5, 0.80, 75.0, end=0.38))
    _write(root, f"gar_s{s}", _rows(0.5, 0.85, 70.0, end=0.42))
    _write(root, f"gar_len_s{s}", _rows(0.5, 0.86, 60.0, end=0.39))
  v = S.verdicts(S.load_runs(root, S.ARMS, (0, 1), S.load), (0, 1))
  assert all(v[h].startswith("supported") for h in ("H1", "H2", "H3", "H4", "H5")), v
  _write(root, "gar_len_s1", _rows(0.5, 0.86, 60.0, end=0.10, audit=0.1))
  v = S.verdicts(S.load_runs(root, S.ARMS, (0, 1), S.load), (0, 1))
  assert v["H1"].startswith("not supported") and v["H5"].startswith("not supported")
  assert "| gar | 2 | 0.300 (0.300-0.300) | 0.420 (0.420-0.420) |" in S.render(root, (0, 1))


def test_the_driver_runs_sft_then_stops_at_a_failed_gate(tmp_path):
  calls = []

  def fake_launch(root, path, config, args, lock, dry_run, tag, **record):
    calls.append((os.path.basename(path), [a for a in args if a.startswith("--config.model.path")]))
    _write(root, os.path.basename(path), _rows(0.95, 0.99, 50.0, steps=3))   # everything passes: no room
    return 0
  code = R.main([f"--root={tmp_path}", "--archive="], launch_fn=fake_launch)
  sft = f"--config.model.path={os.path.join(str(tmp_path), 'sft_s0')}"
  assert code == GATE_FAILED
  assert calls == [("sft_s0", []), ("gate_s0", [sft]), ("gate_s1", [sft]), ("gate_s2", [sft])]
  gate = read_gate(str(tmp_path))
  assert gate["passed"] is False and [c["passed"] for c in gate["checks"]] == [False, False]
