"""experiments/trace_fp4: the arms differ in the FP4 fields only and validate; the summary's verdicts follow
README's rules on hand-written runs; the driver checks the gate on the frozen fp4_rtn run before any arm and stops
when it fails."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs import trace_fp4 as cfg_module  # noqa: E402
from experiments.gate import GATE_FAILED, read_gate  # noqa: E402
from experiments.trace_fp4 import run as R  # noqa: E402
from experiments.trace_fp4 import summarize as S  # noqa: E402
from rlkit.cli import changed_keys  # noqa: E402
from tests.experiments.workdirs import write_workdir  # noqa: E402


def test_the_arms_differ_in_the_fp4_fields_only_and_validate():
  from rlkit.train.config_checks import validate
  bf16 = cfg_module.get_config("bf16")
  for preset in cfg_module.PRESETS:
    c = cfg_module.get_config(preset)
    validate(c)
    changed = set(changed_keys(bf16.to_dict(), c.to_dict()))
    allowed = {"model.expert_quant", "rl.sync.quantizer", "rl.moe.trace"}
    if preset == "gate":
      allowed |= {"rl.steps", "rl.eval_every", "rl.optimizer.frozen"}
    assert changed <= allowed, (preset, changed)


def _rows(mismatch, dlogp, reward, final, steps=30):
  rows = [{"stage": "rl", "step": 1, "eval/accuracy": 0.5, "at_stage_start": True}]
  rows += [{"stage": "rl", "step": s, "step_s": 3.0, "reward": reward, "mismatch/mean": dlogp,
            "moe/codeword_mismatch": mismatch, "moe/flip_rate": 0.0} for s in range(1, steps + 1)]
  rows.append({"stage": "rl", "step": steps, "eval/accuracy": final})
  return rows


def _write(root, name, rows):
  write_workdir(os.path.join(root, name), {"stages": ["rl"], "rl": {"steps": rows[-1]["step"]}}, rows)


def test_verdicts_follow_the_rules(tmp_path):
  root = str(tmp_path)
  for seed, (reward, final) in enumerate(((0.60, 0.70), (0.64, 0.74))):
    _write(root, f"bf16_s{seed}", _rows(0.0, 0.001, reward, final))
    _write(root, f"fp4_rtn_s{seed}", _rows(0.13, 0.03, reward - 0.05, final - 0.04))
    _write(root, f"fp4_trace_s{seed}", _rows(0.001, 0.002, reward + 0.01, final))
  v = S.verdicts(S.load_runs(root, S.ARMS, (0, 1), S.load), (0, 1))
  assert all(v[h].startswith("supported") for h in ("H1", "H2", "H3")), v
  assert v["H4"].startswith("descriptive") and "reward -0.050" in v["H4"]
  _write(root, "fp4_trace_s1", _rows(0.02, 0.002, 0.30, 0.74))        # 15% of RTN's mismatch, reward far below
  v = S.verdicts(S.load_runs(root, S.ARMS, (0, 1), S.load), (0, 1))
  assert v["H1"].startswith("not supported") and v["H3"].startswith("not supported") and v["H2"].startswith("supp")
  assert "| fp4_rtn | 2 | 0.1300 (0.1300-0.1300) |" in S.render(root, (0, 1))


def test_the_driver_stops_at_a_failed_gate(tmp_path):
  calls = []

  def fake_launch(root, path, config, args, lock, dry_run, tag, **record):
    calls.append(os.path.basename(path))
    _write(root, os.path.basename(path), _rows(0.001, 0.001, 0.5, 0.5, steps=3))    # no gap for TRACE to close
    return 0
  code = R.main([f"--root={tmp_path}", "--archive="], launch_fn=fake_launch)
  assert code == GATE_FAILED and calls == ["gate_s0"]
  gate = read_gate(str(tmp_path))
  assert gate["passed"] is False and [c["passed"] for c in gate["checks"]] == [False, True]
