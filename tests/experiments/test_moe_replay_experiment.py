"""experiments/moe_replay: the arms differ in their one field and validate; the summary's verdicts follow
README's rules on hand-written runs; the driver checks the gate on the frozen no_replay run before any arm and
stops when it fails."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs import moe_replay as cfg_module  # noqa: E402
from experiments.gate import GATE_FAILED, read_gate  # noqa: E402
from experiments.moe_replay import run as R  # noqa: E402
from experiments.moe_replay import summarize as S  # noqa: E402
from rlkit.cli import changed_keys  # noqa: E402
from tests.experiments.workdirs import write_workdir  # noqa: E402


def test_the_arms_differ_in_their_field_only_and_validate():
  from rlkit.train.config_checks import validate
  replay = cfg_module.get_config("replay")
  for preset in cfg_module.PRESETS:
    c = cfg_module.get_config(preset)
    validate(c)
    changed = set(changed_keys(replay.to_dict(), c.to_dict()))
    allowed = {"rl.replay_routing", "rl.moe.replay_weights", "rl.optimizer.frozen"}
    if preset == "gate":
      allowed |= {"rl.steps", "rl.eval_every"}
    assert changed <= allowed, (preset, changed)


def _rows(dlogp, flip, cv_first, cv_last, steps=30):
  rows = [{"stage": "rl", "step": s, "step_s": 3.0, "reward": 0.5, "mismatch/mean": dlogp, "moe/flip_rate": flip,
           "moe/load_cv": cv_first if s <= 10 else cv_last, "moe/cold_fraction": 0.0} for s in range(1, steps + 1)]
  rows.append({"stage": "rl", "step": steps, "eval/accuracy": 0.6})
  return rows


def _write(root, name, rows):
  write_workdir(os.path.join(root, name), {"stages": ["rl"], "rl": {"steps": rows[-1]["step"]}}, rows)


def test_verdicts_follow_the_rules(tmp_path):
  root = str(tmp_path)
  for seed in (0, 1):
    _write(root, f"no_replay_s{seed}", _rows(0.02, 0.03, 0.2, 0.3))
    _write(root, f"replay_s{seed}", _rows(0.008, 0.0, 0.2, 0.26))
    _write(root, f"replay_weights_s{seed}", _rows(0.006, 0.0, 0.2, 0.26))
    _write(root, f"replay_frozen_s{seed}", _rows(0.008, 0.0, 0.2, 0.21))
  v = S.verdicts(S.load_runs(root, S.ARMS, (0, 1), S.load), (0, 1))
  assert all(v[h].startswith("supported") for h in ("H1", "H2", "H3")), v
  assert v["H4"].startswith("descriptive") and "s0 0.0300 (+0.0000)" in v["H4"]
  _write(root, "replay_s1", _rows(0.012, 0.0, 0.2, 0.2))             # > 0.5x no_replay; its load did not move
  v = S.verdicts(S.load_runs(root, S.ARMS, (0, 1), S.load), (0, 1))
  assert v["H1"].startswith("not supported") and v["H3"].startswith("not supported") and v["H2"].startswith("supp")
  assert "| no_replay | 2 | 0.0200 (0.0200-0.0200) | 0.0300 (0.0300-0.0300) |" in S.render(root, (0, 1))


def test_the_driver_stops_at_a_failed_gate(tmp_path):
  calls = []

  def fake_launch(root, path, config, args, lock, dry_run, tag, **record):
    calls.append(os.path.basename(path))
    _write(root, os.path.basename(path), _rows(0.01, 0.0, 0.2, 0.2, steps=3))     # both paths route alike
    return 0
  code = R.main([f"--root={tmp_path}", "--archive="], launch_fn=fake_launch)
  assert code == GATE_FAILED and calls == ["gate_s0"]
  assert read_gate(str(tmp_path))["passed"] is False
