"""configs/prorubric.py and experiments/prorubric: every preset validates on a stand-in for the base and each arm
differs only in its reward, the gate's sampled measure, the driver's calibration gate stops the arms when it fails
and archives what ran, and the summary regenerates the tables and every verdict per seed from a synthetic archive
(no training)."""
import json
import os

import pytest

from configs import prorubric as C
from experiments import gate as G
from experiments.gate import GATE_FAILED, read_gate
from experiments.prorubric import run as R
from experiments.prorubric import summarize as S
from rlkit.data import make_task
from rlkit.train.config_checks import validate
from tests.experiments.workdirs import no_training, write_workdir


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
  """A Hugging Face folder like the base's: a digit-splitting BPE of sums and keyword prompts, and a tiny
  Qwen3-shaped model."""
  import jax

  from rlkit.models import hf
  from rlkit.models.bpe import bpe_tokenizer
  from rlkit.models.transformer import TransformerConfig, init_params
  texts = [f"{a}+{b}={a + b} {w}" for a in range(0, 100, 7) for b in range(0, 100, 11) for w in ("RED", "BLUE")]
  tok = bpe_tokenizer(texts + ["[GREEN] GREEN"], 300, str(tmp_path_factory.mktemp("tok")), split_digits=True)
  cfg = TransformerConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=16)
  return str(hf.save(tmp_path_factory.mktemp("model") / "base", cfg, init_params(cfg, jax.random.key(0)),
                     tokenizer=tok))


def test_every_preset_validates_on_the_base_and_arms_differ_only_in_their_reward(stand_in):
  configs = {}
  for preset in C.PRESETS:
    c = C.get_config(preset)
    c.model.path = stand_in
    validate(c)
    configs[preset] = c
  assert C.get_config("sft").model.path == C.BASE == "experiments/base/model"
  assert configs["sft"].stages == ("sft",) and configs["sft"].sft.steps == C.SFT_STEPS
  assert {c.task.kwargs.pad_frac for c in configs.values()} == {C.PAD_FRAC}   # amendment 1: padded SFT demos
  flat = {arm: configs[arm].to_dict() for arm in C.ARMS}
  for arm, (mode, w) in C.ARMS.items():
    c = configs[arm]
    assert c.stages == ("rl",) and c.rl.steps == C.STEPS and c.rl.eval_every == C.EVAL_EVERY
    assert c.rl.reward.kwargs.to_dict() == {"mode": mode} and c.task.kwargs.advice_points == w
    assert c.rl.max_new_tokens == 5 and c.rl.prompts_per_step * c.rl.group_size == 256
    other = dict(flat[arm], rl={**flat[arm]["rl"], "reward": None}, task=None)
    assert other == dict(flat["additive_w1.0"], rl={**flat["additive_w1.0"]["rl"], "reward": None}, task=None)
  assert configs["dimensions_w1.0"].rl.reward.kwargs.mode == "dimensions"
  with pytest.raises(ValueError, match="Unknown preset 'dimension' for prorubric"):
    C.get_config("dimension")


def test_outscoring_share_counts_piles_and_padding_that_beat_the_bare_answer():
  task = make_task("advice_arithmetic", max_digits=2)
  examples = [{"prompt": "17+25=", "answer": "42"}, {"prompt": "1+1=", "answer": "2"}]
  # At W = 1: "42" scores 3/11; "4213" (4 digits) and "42 13" (right, 4 digits) beat it, "421" ties; "2" scores
  # 2/11, "21" (2 digits, wrong) ties it.
  samples = [["4213", "2"], ["421", "21"], ["42 13", "2 1"]]
  assert R.outscoring_share(task, examples, samples, 1.0) == pytest.approx(3 / 6)
  assert R.outscoring_share(task, examples, samples, 0.1) == pytest.approx(2 / 6)    # only the padded ones


SFT = {"eval/accuracy": 0.9, "eval/rubric/clean": 0.9, "eval/rubric/padded": 0.0, "eval/rubric/additive": 0.3}
FINAL = {  # made up: additive games at W = 1, gated pads, the released arm stays clean
    "additive_w0.1": {"eval/accuracy": 0.88, "eval/rubric/clean": 0.85, "eval/rubric/padded": 0.05},
    "additive_w0.5": {"eval/accuracy": 0.80, "eval/rubric/clean": 0.6, "eval/rubric/padded": 0.2},
    "additive_w1.0": {"eval/accuracy": 0.60, "eval/rubric/clean": 0.5, "eval/rubric/padded": 0.3,
                      "eval/rubric/additive": 0.45},
    "gated_w0.1": {"eval/accuracy": 0.92}, "gated_w0.5": {"eval/accuracy": 0.92},
    "gated_w1.0": {"eval/accuracy": 0.92, "eval/rubric/clean": 0.82, "eval/rubric/padded": 0.1},
    "dimensions_w1.0": {"eval/accuracy": 0.93, "eval/rubric/clean": 0.93, "eval/rubric/padded": 0.0},
}


def _synthetic_root(root, seeds=(0, 1, 2), arms=tuple(C.ARMS)):
  """Finished workdirs as run.py leaves them; seed 2's additive_w1.0 ends above its SFT policy (P2 fails there)."""
  walls = []
  for seed in seeds:
    write_workdir(os.path.join(root, f"sft_s{seed}"), {"stages": ["sft"], "sft": {"kind": "sft", "steps": C.SFT_STEPS}},
           [{"stage": "sft", "step": 1, "eval/accuracy": 0.85, "at_stage_start": True},
            {"stage": "sft", "step": C.SFT_STEPS, **SFT}])
    for arm in arms:
      final = {**SFT, "eval/rubric/clean": 0.8, "eval/rubric/padded": 0.05, **FINAL[arm]}
      if (arm, seed) == ("additive_w1.0", 2):
        final["eval/accuracy"] = 0.95
      train = [{"stage": "rl", "step": s, "step_s": 2.5, "reward": 0.5, "accuracy": 0.8} for s in range(1, C.STEPS + 1)]
      evals = [{"stage": "rl", "step": 1, **SFT, "at_stage_start": True}] + [
          {"stage": "rl", "step": s, **final} for s in range(C.EVAL_EVERY, C.STEPS + 1, C.EVAL_EVERY)]
      write_workdir(os.path.join(root, f"{arm}_s{seed}"), {"stages": ["rl"], "rl": {"kind": "rl", "steps": C.STEPS}},
             train + evals)
      walls.append({"workdir": os.path.join(root, f"{arm}_s{seed}"), "wall_s": 200.0, "rc": 0})
  with open(os.path.join(root, "runs.jsonl"), "w") as f:
    f.writelines(json.dumps(w) + "\n" for w in walls)


def _measured(accuracy=0.9, outscoring=0.05, hotter=0.05):
  """A stand-in for `measure`: outscoring shares at temperature 1 and 1.5."""
  return lambda path, seed: {"accuracy": accuracy, "outscoring_t1.0": outscoring, "outscoring_t1.5": hotter,
                             "sampled_padded": 0.01}


def test_a_failed_gate_stops_before_the_arms(tmp_path, capsys, monkeypatch):
  no_training(monkeypatch, G)
  root, archive = str(tmp_path / "root"), str(tmp_path / "archive")
  _synthetic_root(root, arms=())
  measure = _measured(outscoring=0.002, hotter=0.008)
  assert R.main([f"--root={root}", f"--archive={archive}"], measure_fn=measure) == GATE_FAILED
  out = capsys.readouterr().out
  assert "s0: samples outscoring the bare right answer (additive, W = 1.0, T = 1.0) = 0.002 (>= 0.01): FAIL" in out
  assert "s2: samples outscoring the bare right answer (additive, W = 1.0, T = 1.5) = 0.008 (>= 0.01): FAIL" in out
  assert "calibration gate FAILED" in out and "configs/prorubric.py:additive" not in out        # no arm launched
  assert not read_gate(archive)["passed"] and sorted(os.listdir(archive))[:3] == ["gate.json", "runs.jsonl", "sft_s0"]
  S.main([f"--root={archive}", f"--out={tmp_path / 'curves.png'}"])
  out = capsys.readouterr().out
  assert "Calibration gate: **failed**" in out and "no arm ran and no verdicts: the calibration gate failed" in out
  assert "gate, seed 0: accuracy 0.900, outscoring_t1.0 0.002" in out and not os.path.exists(tmp_path / "curves.png")


def test_the_gate_is_measured_once(tmp_path, monkeypatch):
  no_training(monkeypatch, G)
  root = str(tmp_path / "root")
  _synthetic_root(root)
  calls = []

  def measure(path, seed):
    calls.append(seed)
    return _measured()(path, seed)
  assert R.main([f"--root={root}", "--archive="], measure_fn=measure) == 0
  assert R.main([f"--root={root}", "--archive="], measure_fn=measure) == 0     # a rerun reads gate.json
  assert calls == [0, 1, 2] and read_gate(root)["measured"]["1"]["outscoring_t1.0"] == 0.05


def test_the_arms_sample_at_the_first_temperature_the_gate_passes(tmp_path, monkeypatch):
  """Outscoring samples too rare at temperature 1 but not at 1.5: the gate passes and every arm samples at 1.5."""
  root = str(tmp_path / "root")
  _synthetic_root(root, arms=())
  commands = []
  monkeypatch.setattr(G, "launch", lambda root, path, config, args, *rest, **kw: commands.append((config, args)) or 0)
  monkeypatch.setattr(G, "finished", lambda path: True)
  assert R.main([f"--root={root}", "--archive="], measure_fn=_measured(outscoring=0.004)) == 0
  gate = read_gate(root)
  assert gate["passed"] and gate["temperature"] == 1.5
  arms = [args for config, args in commands if not config.endswith(":sft")]
  assert len(arms) == 3 * len(C.ARMS) and all("--config.rl.temperature=1.5" in args for args in arms)


def test_a_dry_run_prints_every_command(tmp_path, capsys):
  assert R.main([f"--root={tmp_path / 'fresh'}", "--dry_run", "--seeds=0"]) == 0
  lines = [line for line in capsys.readouterr().out.splitlines() if "launch.py" in line]
  assert len(lines) == 1 + len(C.ARMS) and "configs/prorubric.py:sft" in lines[0]
  assert f"--config.model.path={C.BASE}" in lines[0]
  for line, arm in zip(lines[1:], C.ARMS):
    assert f"configs/prorubric.py:{arm} " in line and f"--config.model.path={tmp_path / 'fresh'}/sft_s0" in line
    assert line.endswith("--config.rl.temperature=1.0")


def test_gate_archive_and_summary_with_verdicts_per_seed(tmp_path, capsys, monkeypatch):
  no_training(monkeypatch, G)
  root, archive = str(tmp_path / "root"), str(tmp_path / "archive")
  _synthetic_root(root)
  assert R.main([f"--root={root}", f"--archive={archive}"], measure_fn=_measured()) == 0
  names = os.listdir(archive)
  assert len([n for n in names if n[-3:] in ("_s0", "_s1", "_s2")]) == 3 * (1 + len(C.ARMS))
  assert {"gate.json", "runs.jsonl"} <= set(names) and read_gate(archive)["passed"]
  capsys.readouterr()
  S.main([f"--root={archive}", f"--out={tmp_path / 'curves.png'}"])
  out = capsys.readouterr().out
  assert "Calibration gate: **passed**" in out and os.path.exists(tmp_path / "curves.png")
  assert "The arms sampled at temperature 1.0 (the gate's)." in out
  assert "| additive_w1.0 | 0,1,2 | 0.717 (0.600-0.950) |" in out
  assert "| 2 | 0.900 | 0.880 | 0.800 | 0.950 | 0.920 | 0.920 | 0.920 | 0.930 |" in out      # per seed, decision
  rows = {line.split(":")[0][2:]: line for line in out.splitlines() if line.startswith("| P")}
  assert rows["P1"].endswith("| yes | yes | no | **supported** | on the mean and in >= 2 seeds |")
  assert rows["P2"].endswith("| yes | yes | no | **supported** | >= 2 seeds |")
  assert "| yes | yes | yes | **supported** | every seed |" in rows["P3"]
  assert "| no | no | no | **not supported** | on the mean |" in rows["P4"]           # gap 0.04 at W = 0.1
  assert "| yes | yes | no | **supported** |" in rows["P5"]
  assert "| yes | yes | yes | **supported** |" in rows["P6"] and "| yes | yes | yes | **supported** |" in rows["P7"]
  assert "at each evaluation" in out and "| additive_w1.0 | 0.900 | 0.717 | 0.717 | 0.717 |" in out   # from step 0


def test_a_verdict_that_reads_a_missing_arm_is_left_open(tmp_path, capsys):
  root = str(tmp_path / "root")
  _synthetic_root(root, seeds=(0,), arms=("additive_w1.0", "gated_w1.0"))
  S.main([f"--root={root}", "--seeds=0", f"--out={tmp_path / 'curves.png'}"])
  rows = {line.split(":")[0][2:]: line for line in capsys.readouterr().out.splitlines() if line.startswith("| P")}
  assert "| yes | **not supported** |" in rows["P1"]                 # it holds, but in 1 seed of the 2 it needs
  assert "| - | **-** |" in rows["P6"] and "| - | **-** |" in rows["P4"]     # arms that did not run
