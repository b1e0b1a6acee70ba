"""configs/calif.py and experiments/calif: every preset validates on a stand-in for the base and each arm differs
only in its reward (and the KL arm in its KL weight), the driver's calibration gate stops the arms when it fails
and archives what ran, and the summary regenerates the tables and every verdict per seed from a synthetic archive
(no training)."""
import os

from configs import calif as C
from experiments.calif import run as R
from experiments.calif import summarize as S
from experiments import gate as G
from experiments.gate import GATE_FAILED, read_gate
from rlkit.train.config_checks import validate
from tests.experiments.test_prorubric_experiment import stand_in  # noqa: F401  (a fixture)
from tests.experiments.workdirs import no_training, write_workdir


def test_every_preset_validates_on_the_base_and_arms_differ_only_in_their_reward(stand_in):  # noqa: F811
  configs = {}
  for preset in C.PRESETS:
    c = C.get_config(preset)
    c.model.path = stand_in
    if preset == "calif":
      c.models.reference.path = stand_in
    validate(c)
    configs[preset] = c
  assert C.get_config("sft").model.path == C.BASE and configs["sft"].sft.steps == C.SFT_STEPS
  assert configs["constraints_plus_task"].rl.reward.name == "constraints_plus_task"
  assert configs["constraints_kl"].rl.kl_beta == C.KL_BETA and configs["constraints"].rl.kl_beta == 0.0

  def common(arm):
    d = configs[arm].to_dict()
    return dict(d, rl={**d["rl"], "reward": None, "kl_beta": None}, models=None)
  for arm in C.ARMS:
    assert common(arm) == common("constraints"), arm
    assert configs[arm].rl.steps == C.STEPS and configs[arm].rl.max_new_tokens == 8


SFT = {"eval/accuracy": 0.9, "eval/constraint/satisfied": 0.1, "eval/constraint/both": 0.1,
       "eval/constraint/content_len": 2.0}
FINAL = {  # made up: constraints drops the sum, calif keeps it, the KL arm in between, the additive control ties
    "constraints": {"eval/accuracy": 0.5, "eval/constraint/satisfied": 1.0, "eval/constraint/both": 0.5,
                    "eval/constraint/content_len": 1.9},
    "calif": {"eval/accuracy": 0.92, "eval/constraint/satisfied": 0.98, "eval/constraint/both": 0.9,
              "eval/constraint/content_len": 3.0},
    "constraints_kl": {"eval/accuracy": 0.8, "eval/constraint/satisfied": 1.0, "eval/constraint/both": 0.8,
                       "eval/constraint/content_len": 2.0},
    "constraints_plus_task": {"eval/accuracy": 0.91, "eval/constraint/satisfied": 0.98, "eval/constraint/both": 0.89,
                              "eval/constraint/content_len": 2.1},
}


def _synthetic_root(root, seeds=(0, 1, 2), arms=tuple(C.ARMS)):
  """Finished workdirs as run.py leaves them; in seed 1 calif beats the additive control on `both` by 5 points."""
  for seed in seeds:
    write_workdir(os.path.join(root, f"sft_s{seed}"), {"stages": ["sft"], "sft": {"kind": "sft", "steps": C.SFT_STEPS}},
           [{"stage": "sft", "step": 1, "eval/accuracy": 0.85, "at_stage_start": True},
            {"stage": "sft", "step": C.SFT_STEPS, **SFT}])
    for arm in arms:
      final = dict(FINAL[arm])
      if (arm, seed) == ("constraints_plus_task", 1):
        final["eval/constraint/both"] = 0.85
      train = [{"stage": "rl", "step": s, "step_s": 3.3, "reward": 0.5} for s in range(1, C.STEPS + 1)]
      evals = [{"stage": "rl", "step": 1, **SFT, "at_stage_start": True}] + [
          {"stage": "rl", "step": s, **final} for s in range(C.EVAL_EVERY, C.STEPS + 1, C.EVAL_EVERY)]
      write_workdir(os.path.join(root, f"{arm}_s{seed}"), {"stages": ["rl"], "rl": {"kind": "rl", "steps": C.STEPS}},
             train + evals)


def _measured(accuracy=0.9, follow=0.0, sampled_follow=0.3):
  return lambda path, seed: {"accuracy": accuracy, "follow": follow, "sampled_follow": sampled_follow}


def test_a_failed_gate_stops_before_the_arms(tmp_path, capsys, monkeypatch):
  no_training(monkeypatch, G)
  root, archive = str(tmp_path / "root"), str(tmp_path / "archive")
  _synthetic_root(root, arms=())
  assert R.main([f"--root={root}", f"--archive={archive}"], measure_fn=_measured(sampled_follow=0.01)) == GATE_FAILED
  out = capsys.readouterr().out
  assert "s2: SFT following rate (sampled) = 0.01 (>= 0.05, <= 0.95): FAIL" in out
  assert "s0: SFT following rate (greedy) = 0 (<= 0.9): ok" in out
  assert "calibration gate FAILED" in out and "configs/calif.py:calif" not in out
  assert not read_gate(archive)["passed"]


def test_a_dry_run_gives_calif_its_reference(tmp_path, capsys):
  assert R.main([f"--root={tmp_path}", "--dry_run", "--seeds=0"]) == 0
  lines = [line for line in capsys.readouterr().out.splitlines() if "launch.py" in line]
  assert len(lines) == 1 + len(C.ARMS)
  for line, arm in zip(lines[1:], C.ARMS):
    assert f"configs/calif.py:{arm} " in line and f"--config.model.path={tmp_path}/sft_s0" in line
    assert (f"--config.models.reference.path={tmp_path}/sft_s0" in line) == (arm == "calif")


def test_gate_archive_and_summary_with_verdicts_per_seed(tmp_path, capsys, monkeypatch):
  no_training(monkeypatch, G)
  root, archive = str(tmp_path / "root"), str(tmp_path / "archive")
  _synthetic_root(root)
  assert R.main([f"--root={root}", f"--archive={archive}"], measure_fn=_measured()) == 0
  assert read_gate(archive)["passed"] and read_gate(archive)["measured"]["2"]["sampled_follow"] == 0.3
  capsys.readouterr()
  S.main([f"--root={archive}", f"--out={tmp_path / 'curves.png'}"])
  out = capsys.readouterr().out
  assert "Calibration gate: **passed**" in out and os.path.exists(tmp_path / "curves.png")
  assert "| 1 | 0.100 | 0.500 | 0.900 | 0.800 | 0.850 |" in out                  # both, per seed
  rows = {line.split(":")[0][2:]: line for line in out.splitlines() if line.startswith("| P")}
  for name in ("P1", "P2", "P3", "P5", "P6"):
    assert "| yes | yes | yes | **supported** |" in rows[name], rows[name]
  assert "| no | no | no | **not supported** |" in rows["P4"]        # calif's content grows by 50%
  assert "| no | yes | no | **not supported** | on the mean and in >= 2 seeds |" in rows["P7"]
