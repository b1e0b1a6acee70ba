"""experiments/async_rollout: the arms' configs differ in the collector only and validate; the driver checks the
gate on sync seed 0 before any other run and stops when it fails; the summary's verdicts follow README's rules
on hand-written runs."""
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs import async_rollout as cfg_module  # noqa: E402
from experiments.async_rollout import run as R  # noqa: E402
from experiments.async_rollout import summarize as S  # noqa: E402
from experiments.gate import GATE_FAILED, read_gate  # noqa: E402
from rlkit.cli import changed_keys  # noqa: E402
from tests.experiments.workdirs import write_workdir  # noqa: E402


def test_the_arms_differ_in_the_collector_only_and_validate():
  from rlkit.train.rl_stage import validate
  sync = cfg_module.get_config("sync")
  for arm in cfg_module.ARMS:
    c = cfg_module.get_config(arm)
    validate(c.rl, "rl")
    changed = set(changed_keys(sync.to_dict(), c.to_dict()))
    assert changed <= {"rl.collector", "rl.async_rollout.prefetch", "rl.async_rollout.max_staleness",
                       "rl.async_rollout.fault_rate"}, (arm, changed)


def _rows(sample_s, update_s, staleness=0, crashes=0, steps=8, delivered=64):
  rows = []
  for s in range(1, steps + 1):
    row = {"stage": "rl", "step": s, "step_s": sample_s + update_s, "sample_s": sample_s, "update_s": update_s}
    if staleness is not None:
      row.update({"collect/async_staleness_max": staleness, "collect/async_delivered": delivered,
                  "collect/async_dropped_failed": 0, "collect/async_crashes": crashes if s == 2 else 0})
    rows.append(row)
  rows.append({"stage": "rl", "step": steps, "eval/accuracy": 0.9})
  return rows


def _write(root, arm, seed, rows):
  config = {"stages": ["rl"], "rl": {"steps": rows[-1]["step"]}}
  write_workdir(os.path.join(root, f"{arm}_s{seed}"), config, rows)


def test_verdicts_follow_the_rules(tmp_path, monkeypatch):
  monkeypatch.setattr(S, "CLUSTERS", (8,))                                 # the projection's smallest cluster
  root = str(tmp_path)
  for seed in (0, 1):
    _write(root, "sync", seed, _rows(1.0, 1.0, staleness=None))          # R(1) = 1.0, R(0) = 2.0
    _write(root, "async_s0", seed, _rows(1.0, 1.1))                      # slower than sync
    _write(root, "async_s1", seed, _rows(0.2, 1.3, staleness=1))         # 2.0 / 1.5 = 1.33
    _write(root, "async_s2", seed, _rows(0.2, 1.3, staleness=2))
    _write(root, "async_s4", seed, _rows(0.1, 1.3, staleness=3))
    _write(root, "async_s1_faults", seed, _rows(0.6, 1.3, staleness=1, crashes=2))
  runs = S.load_runs(root, S.ARMS, (0, 1), S.load)
  v = S.verdicts(runs, (0, 1))
  assert v["H1"].startswith("supported") and v["H2"].startswith("supported (2 of 2")
  assert v["H3"].startswith("supported") and v["H4"].startswith("supported") and v["H5"].startswith("supported")
  _write(root, "async_s1", 1, _rows(0.2, 1.3, staleness=2))              # past its bound in one seed
  _write(root, "async_s1_faults", 0, _rows(0.6, 1.3, staleness=1, crashes=0))
  v = S.verdicts(S.load_runs(root, S.ARMS, (0, 1), S.load), (0, 1))
  assert v["H1"].startswith("not supported") and "async_s1 s1" in v["H1"]
  text = S.render(root, (0, 1))
  assert "| async_s1 | 0 | 42.67 | 1.33 |" in text and "Projection" in text


def test_the_driver_stops_at_a_failed_gate(tmp_path, monkeypatch):
  calls = []

  def fake_launch(root, path, config, args, lock, dry_run, tag, **record):
    calls.append(os.path.basename(path))
    _write(root, record["name"], record["seed"], _rows(0.05, 2.0, staleness=None))   # sampling 2% of the time
    return 0
  code = R.main([f"--root={tmp_path}", "--archive="], launch_fn=fake_launch)
  assert code == GATE_FAILED and calls == ["sync_s0"]
  assert read_gate(str(tmp_path))["passed"] is False
  with pytest.raises(SystemExit):
    R.main([f"--root={tmp_path}", "--arms=async_s9"], launch_fn=fake_launch)
