"""experiments/acob: the arms differ in their ablated fields only and validate; the summary's verdicts follow
README's rules on hand-written runs; the driver stops at a failed gate before any other arm."""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs import acob as C  # noqa: E402
from experiments.acob import run as R  # noqa: E402
from experiments.acob import summarize as S  # noqa: E402
from experiments.gate import GATE_FAILED  # noqa: E402
from rlkit.cli import changed_keys  # noqa: E402
from tests.experiments.workdirs import write_workdir  # noqa: E402


def test_the_arms_differ_in_their_ablated_fields_only_and_validate():
  from rlkit.train.config_checks import validate
  ref = C.get_config("acob")
  for preset in C.PRESETS:
    c = C.get_config(preset)
    validate(c)
    changed = set(changed_keys(ref.to_dict(), c.to_dict()))
    if preset in C.ARMS:
      assert changed == {f"acob.{k}" for k in C.ARMS[preset]}, (preset, changed)
  assert C.get_config("stream").acob.stream.mode == "stream" and C.get_config("bc").stages == ("bc",)


def _run(evals, d_ref=0.01, tripped=0, rates=()):
  rows = [{"stage": "acob", "step": s, "eval/success": v} for s, v in evals]
  rows += [{"stage": "acob", "step": 150, "acob/d_ref": d_ref, "acob/tripped": float(i < tripped)} for i in range(3)]
  rows += [{"stage": "acob", "step": i + 1, "stream/decisions_per_s": r} for i, r in enumerate(rates)]
  return rows


def _write(root, name, rows):
  write_workdir(os.path.join(root, name), {"stages": ["acob"], "acob": {"steps": 150}}, rows)


def test_verdicts_follow_the_rules(tmp_path):
  root = str(tmp_path)
  steps = range(10, 160, 10)
  for seed in (0, 1, 2):
    with open(os.path.join(root, f"ref_s{seed}.json"), "w") as f:
      f.write('{"drifted": 0.5, "drift_free": 1.0}')
    _write(root, f"naive_s{seed}", _run([(s, 0.38 if s == 20 else 0.5) for s in steps]))
    _write(root, f"acob_s{seed}", _run([(s, 0.49 if s <= 30 else 0.55) for s in steps]))
    _write(root, f"acob_no_cal_s{seed}", _run([(s, 0.40 if s == 30 else 0.5) for s in steps]))
  _write(root, "sync_s0", _run([], rates=[1.0, 50.0, 52.0]))
  _write(root, "stream_s0", _run([], rates=[1.0, 90.0, 100.0]))
  refs, runs, tput = S.load_all(root, (0, 1, 2))
  assert runs["naive"][0]["dip"] == 0.5 - 0.38 and runs["acob"][0]["final"] == 0.55
  v = S.verdicts(runs, tput)
  assert all(v[h].startswith("supported") for h in ("H1", "H2", "H3", "H5")), v
  assert "acob_no_cal dips +0.090 more than acob: evidence" in v["H4"]
  _write(root, "stream_s0", _run([], rates=[1.0, 55.0, 55.0]))
  _write(root, "acob_s1", _run([(s, 0.30 if s <= 30 else 0.40) for s in steps]))
  _write(root, "acob_s2", _run([(s, 0.30 if s <= 30 else 0.40) for s in steps]))
  refs, runs, tput = S.load_all(root, (0, 1, 2))
  v = S.verdicts(runs, tput)
  assert all(v[h].startswith("not supported") for h in ("H2", "H3", "H5")), v
  assert "| naive | 3 | 0.380 (0.380-0.380) | 0.120 (0.120-0.120) |" in "\n".join(S.table(refs, runs))


def test_the_driver_stops_at_a_failed_gate(tmp_path, monkeypatch):
  launched = []

  def launch(root, path, config, args, *rest, **kw):
    launched.append(os.path.basename(path))
    write_workdir(path, {"stages": ["acob"], "acob": {"steps": 1}}, [{"stage": "acob", "step": 1, "eval/success": 0.5}])
    return 0
  monkeypatch.setattr(R, "launch", launch)
  monkeypatch.setattr(R, "reference", lambda args, seed: 0)
  monkeypatch.setattr(R, "gate", lambda args: False)
  assert R.main([f"--root={tmp_path}", "--archive="]) == GATE_FAILED
  assert launched == ["bc_s0", "acob_s0"]
