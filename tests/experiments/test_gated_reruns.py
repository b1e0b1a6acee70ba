"""The reruns from the base with a calibration gate (issue 31): graft, tips, rquest. On synthetic workdirs: each
driver runs its gate's runs first, records the gate in gate.json, stops before the arms when it fails (exit 2)
and runs them when it passes, and archives what its summary reads; each summarize.py reads that archive and
prints the gate, the tables and the pre-registered verdicts. `launch` is replaced by a recorder that writes the
workdir a run would leave, so nothing trains."""
import json
import os

import pytest

from configs.graft import MODELS, OVERLAPS, STEPS as GRAFT_STEPS
from configs.rquest import ARMS as RQUEST_ARMS, GATE_STEPS, PROPOSER_SFT_STEPS, STEPS as RQUEST_STEPS
from configs.tips import RL_STEPS, START_STEPS, SUPERVISED_STEPS
from experiments import gate as gate_module
from experiments.driver import finished
from experiments.graft import run as graft_run, summarize as graft_summary
from experiments.rquest import run as rquest_run, summarize as rquest_summary
from experiments.tips import run as tips_run, summarize as tips_summary


def _workdir(path, stage, steps, rows):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump({"stages": [stage], stage: {"steps": steps}}, f)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps({"stage": stage, **r}) + "\n" for r in rows)


def _graft_sft(path, own, weak):
  acc = {"+": own, "-": weak} if "add" in path else {"-": own, "+": weak}
  evals = {f"eval/mixed/accuracy/{op}": v for op, v in acc.items()}
  _workdir(path, "sft", 150, [{"step": 1, "eval/accuracy": 0.0, "at_stage_start": True, **{k: 0.0 for k in evals}},
                              {"step": 150, "eval/accuracy": own, **evals}])


def _graft_arm(path, weak, kept, gain=0.05):
  """A graft-stage workdir: A (own '+') and B (own '-', `peer/`), weak skill `weak` at the end."""
  rows = []
  for s in range(1, GRAFT_STEPS + 1):
    reward = 0.3 + gain * s / GRAFT_STEPS
    row = {"step": s, "step_s": 1.0, "reward": reward, "peer/reward": reward, "grad_norm": 1.0, "peer/grad_norm": 1.0,
           "graft/rows": 4.0, "graft/rows_kept": kept, "peer/graft/rows": 4.0, "peer/graft/rows_kept": kept}
    if s % 20 == 0:
      row.update({"peer/eval/accuracy": 0.3, "peer/eval/accuracy/-": 0.5, "peer/eval/accuracy/+": weak})
      rows.append({"step": s, "eval/accuracy": 0.3, "eval/accuracy/+": 0.5, "eval/accuracy/-": weak})
    rows.append(row)
  _workdir(path, "graft", GRAFT_STEPS, rows)


class Launches:
  """Stands in for experiments.driver.launch: skips a finished workdir as it does, records the other runs and
  writes their workdirs with `make(name)`."""

  def __init__(self, make):
    self.names, self.args, self.make = [], {}, make

  def __call__(self, root, path, config, args, lock, dry_run, tag, **record):
    name = os.path.basename(path)
    if finished(path):
      return 0
    self.names.append(name)
    self.args[name] = list(args)
    if not dry_run:
      self.make(name, path)
      with open(os.path.join(root, "runs.jsonl"), "a") as f:
        f.write(json.dumps({"workdir": path, "rc": 0, "wall_s": 60.0}) + "\n")
    return 0


@pytest.mark.parametrize("weak_sub, passing", [(0.05, ["o10", "o30"]), (0.0, [])])
def test_graft_gate_per_overlap_then_arms_and_the_summary_of_the_archive(tmp_path, capsys, monkeypatch, weak_sub,
                                                                        passing):
  root, archive = tmp_path / "root", tmp_path / "archive"

  def make(name, path):
    if name.startswith("sft_"):
      _graft_sft(path, 0.6, weak_sub if "sub" in name else 0.1)
    else:
      _graft_arm(path, 0.1 if name.startswith("graft") else 0.05, kept=1.0)

  launches = Launches(make)
  monkeypatch.setattr(graft_run, "launch", launches)
  rc = graft_run.main([f"--root={root}", f"--archive={archive}"])
  gate = json.loads((archive / "gate.json").read_text())
  assert gate["overlaps_passed"] == passing and gate["passed"] == bool(passing)
  sfts = [f"sft_{m}_{t}" for t in OVERLAPS for m in MODELS]
  if not passing:                      # B's weak skill is 0: G1 fails at both overlaps, no RL run at all
    assert rc == gate_module.GATE_FAILED and launches.names == sfts
    return
  assert rc == 0 and launches.names[:5] == sfts + ["independent_o10_s0"]
  assert len(launches.names) == 4 + 2 * 2 * 3 and sorted(os.listdir(archive))[:3] == ["gate.json",
                                                                                      "graft_o10_s0", "graft_o10_s1"]
  graft_summary.main([f"--root={archive}"])
  out = capsys.readouterr().out
  assert "Calibration gate: **passed**" in out
  assert "| o10 | add | 0.9 '+', 0.1 '-' | 0.000 | 0.000 | 0.600 | 0.100 |" in out
  assert "| o10 | 0.250 | s0 +0.050, s1 +0.050, s2 +0.050 | supported |" in out
  assert "H1 (GRAFT keeps >= 5% of grafted rows at every overlap run, more at o30 than o10): not supported" in out
  assert (archive / "accuracy.png").exists()


def test_graft_g2_fails_when_independent_training_does_not_move(tmp_path, monkeypatch):
  def make(name, path):
    if name.startswith("sft_"):
      _graft_sft(path, 0.6, 0.1)
    else:
      _graft_arm(path, 0.05, kept=1.0, gain=0.0)

  monkeypatch.setattr(graft_run, "launch", Launches(make))
  assert graft_run.main([f"--root={tmp_path}", "--archive="]) == gate_module.GATE_FAILED
  checks = {c["name"]: c for c in json.loads((tmp_path / "gate.json").read_text())["checks"]}
  assert not checks["o10: independent s0 reward gain (mean of A, B)"]["passed"]


def _tips_run(path, stage, steps, f1_start, f1_end):
  def ev(f1):
    return {"eval/accuracy": f1 / 100, "eval/processbench/f1": f1, "eval/processbench_nontrap/f1": f1,
            "eval/processbench_traps/accuracy": 0.1}
  train = [{"step": s, "step_s": 5.0, "reward": 0.5, "informative_groups": 0.25 * (s % 2)} for s in range(1, steps + 1)]
  _workdir(path, stage, steps, [{"step": 1, "at_stage_start": True, **ev(f1_start)}, *train,
                                {"step": steps, **ev(f1_end)}])


@pytest.mark.parametrize("supervised_f1, passed", [(60.0, True), (30.0, False)])
def test_tips_gate_is_the_supervised_verifier_above_both_floors(tmp_path, capsys, monkeypatch, supervised_f1,
                                                                passed):
  root, archive = tmp_path / "root", tmp_path / "archive"
  monkeypatch.setattr(tips_run, "final_answer_metrics", lambda seed: {"seed": seed, "eval/processbench/f1": 27.0,
                                                                      "eval/processbench_nontrap/f1": 33.0})

  def make(name, path):
    if name.startswith("start"):
      _tips_run(path, "sft", START_STEPS, 5.0, 80.0)
    elif name.startswith("supervised"):
      _tips_run(path, "sft", SUPERVISED_STEPS, 20.0, supervised_f1)
    else:
      _tips_run(path, "rl", RL_STEPS, 20.0, 45.0)

  launches = Launches(make)
  monkeypatch.setattr(tips_run, "launch", launches)
  rc = tips_run.main([f"--root={root}", f"--archive={archive}"])
  assert launches.names[:4] == ["start_s0", "supervised_s0", "supervised_s1", "supervised_s2"]
  assert json.loads((archive / "gate.json").read_text())["passed"] == passed
  if not passed:
    assert rc == gate_module.GATE_FAILED and len(launches.names) == 4
    return
  assert rc == 0 and launches.names[4:] == ["outcome_s0", "outcome_s1", "outcome_s2"]
  assert launches.args["start_s0"] == ["--config.seed=0"]       # from the base; both arms from the start policy
  assert launches.args["outcome_s2"] == ["--config.seed=2", f"--config.model.path={root / 'start_s0'}"]
  assert (archive / "final_answer_s2.json").exists()
  tips_summary.main([f"--root={archive}"])
  out = capsys.readouterr().out
  assert "| s0: supervised F1 - final-answer F1 | 33 | >= 10 | ok |" in out
  assert "| 0 | 0.750 | +18.0 | +25.0 | +0.000 |" in out
  assert "2. outcome's non-trap F1 >= 0.8 x supervised's (means over seeds): ratio 0.750, not met" in out
  assert "| start policy's F1 on its running-sum chains | 80 | >= 50 | ok |" in out
  assert f"| 2 | {RL_STEPS} | 0.5000 | 0.1250 | {RL_STEPS // 2} |" in out      # the outcome arm's signal
  assert "3. outcome above the final-answer baseline by > 10 points (mean) and above the start in every seed: " \
         "+18.0 points, above the start in every seed: supported" in out


def _rquest_run(path, steps, acc_end, invalid, label_correct=0.5):
  rows = [{"step": 1, "at_stage_start": True, "eval/accuracy": 0.4}]
  for s in range(1, steps + 1):
    rows.append({"step": s, "step_s": 5.0 if s > 1 else 60.0, "reward": 0.5, "rquest/invalid": invalid,
                 "rquest/duplicate": 0.9, "rquest/hidden_duplicate": 0.5, "rquest/unique": s,
                 "rquest/label_correct": label_correct, "rquest/solver_rows": 0.8})
  rows.append({"step": steps, "eval/accuracy": acc_end})
  _workdir(path, "rquest", steps, rows)


@pytest.mark.parametrize("label_correct, passed", [(0.6, True), (0.97, False)])
def test_rquest_gate_then_the_four_arms_and_the_verdicts(tmp_path, capsys, monkeypatch, label_correct, passed):
  root, archive = tmp_path / "root", tmp_path / "archive"
  final = {"rquest": 0.35, "rzero": 0.3, "rquest_checker": 0.5, "rzero_checker": 0.45}

  def make(name, path):
    if name.startswith("proposer_sft"):
      _workdir(path, "sft", PROPOSER_SFT_STEPS, [{"step": 1, "eval/accuracy": 0.0, "at_stage_start": True},
                                                 {"step": PROPOSER_SFT_STEPS, "eval/accuracy": 0.66}])
    elif name.startswith("gate"):
      _rquest_run(path, GATE_STEPS, 0.4, 0.3, label_correct)
    else:
      arm = name.rsplit("_s", 1)[0]
      _rquest_run(path, RQUEST_STEPS, final[arm], 0.1 if arm.startswith("rquest") else 0.4)

  launches = Launches(make)
  monkeypatch.setattr(rquest_run, "launch", launches)
  rc = rquest_run.main([f"--root={root}", f"--archive={archive}"])
  gate = json.loads((archive / "gate.json").read_text())
  assert launches.names[:2] == ["proposer_sft_s0", "gate_s0"] and gate["passed"] == passed
  m = gate["measures"]
  assert m["step_s"] == 5.0 and m["valid"] == pytest.approx(0.7) and m["proposer_greedy"] == 0.66
  assert m["sft_s"] == 60.0
  if not passed:
    assert rc == gate_module.GATE_FAILED and launches.names == ["proposer_sft_s0", "gate_s0"]
    return
  assert rc == 0 and len(launches.names) == 2 + (1 + len(RQUEST_ARMS)) * 3 - 1
  assert launches.names[2:8] == ["rquest_s0", "rzero_s0", "rquest_checker_s0", "rzero_checker_s0",
                                 "proposer_sft_s1", "rquest_s1"]
  rquest_summary.main([f"--root={archive}"])
  out = capsys.readouterr().out
  assert "The base solver's held-out accuracy (seeds 0,1,2): 0.400 (0.400-0.400)" in out
  assert "The SFT proposer's valid share, greedy on held-out bindings (seeds 0,1,2): 0.660 (0.660-0.660)" in out
  assert "| R1a: checker labels beat majority labels (rquest proposer) | s0 +0.150, s1 +0.150, s2 +0.150 | " \
         "supported |" in out
  assert "| R2: rquest ends below the base in every seed | s0 -0.050, s1 -0.050, s2 -0.050 | supported |" in out
  assert "| R4: rquest's invalid share below rzero's in every seed (last window) | s0 +0.300, s1 +0.300, " \
         "s2 +0.300 | supported |" in out


@pytest.mark.parametrize("driver", [graft_run, tips_run, rquest_run])
def test_a_dry_run_prints_every_command_and_archives_nothing(tmp_path, capsys, driver):
  archive = tmp_path / "archive"
  assert driver.main([f"--root={tmp_path / 'root'}", f"--archive={archive}", "--dry_run"]) == 0
  out = capsys.readouterr().out
  assert "dry run: the gate is checked here" in out and "launch.py" in out and not archive.exists()


def test_rquest_verdict_bounds_are_inclusive_despite_float_rounding():
  """Accuracies are k/500: a difference of exactly 0.02 (0.03 - 0.01 < 0.02 in floats) meets the 0.02 bound."""
  assert 0.03 - 0.01 < rquest_summary.GAIN_MIN
  assert rquest_summary.paired_verdict({0: 0.03 - 0.01, 1: 0.03 - 0.01}) == "supported"
  assert rquest_summary.paired_verdict({0: 0.018, 1: 0.018}) == "inconclusive"


def test_tips_start_signal_scores_groups_as_the_outcome_reward_pays():
  """start_signal's shares: malformed verdicts earn nothing and give a group no spread; a group whose verdicts
  disagree on "some step is wrong" is informative."""
  from configs.tips import RL_GROUP
  from experiments.tips.start_signal import score_groups
  wrong_final = {"answer": "1/2", "final_answer_correct": False}       # step 1 of 2 is wrong, so is the answer
  right_final = {"answer": "-1/2", "final_answer_correct": True}
  flag, clean, bad = "38+14=52:52+28+10=39:38-", "++", "38+14=52:"
  texts = [flag] * RL_GROUP + [bad] * RL_GROUP + [clean] + [flag] * (RL_GROUP - 1)
  formed, paid, informative = score_groups([wrong_final, wrong_final, right_final], texts)
  assert sum(formed) == 2 * RL_GROUP and paid[:RL_GROUP] == [1.0] * RL_GROUP and sum(paid[RL_GROUP:]) == 1.0
  assert informative == [0.0, 0.0, 1.0]
