"""experiments/onepo: every preset validates against a stand-in base (a tiny Hugging Face folder with a digit-split
BPE tokenizer, as the real base has); the calibration gate's checks, and a failed gate stops the driver before
any arm; the driver archives what summarize.py reads; summarize.py over a synthetic archive prints the gate, the
verdict of every pre-registered prediction per seed, and the tables."""
import argparse
import json
import os

import jax
import pytest

from configs import onepo as cfg_module
from configs.onepo import ANNEAL, ARMS, EVAL_EVERY, GATE, STEPS
from experiments.onepo import run as driver
from experiments.onepo import summarize

K = GATE["pass_k"]


@pytest.fixture(scope="module")
def stand_in_base(tmp_path_factory):
  """A Hugging Face folder like experiments/base/model, in seconds: a digit-split BPE tokenizer of additions and
  a one-layer Qwen3-shaped model of its vocabulary."""
  from rlkit.models import hf
  from rlkit.models.bpe import bpe_tokenizer
  from rlkit.models.transformer import TransformerConfig, init_params
  folder = tmp_path_factory.mktemp("base")
  texts = [f"{a}+{b}={a + b}" for a in range(0, 10000, 37) for b in range(0, 10000, 411)]
  tok = bpe_tokenizer(texts, 280, folder=str(folder / "tokenizer"), split_digits=True)
  cfg = TransformerConfig(vocab_size=tok.vocab_size, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=1,
                          num_kv_heads=1, head_dim=16, tie_word_embeddings=True)
  return str(hf.save(folder / "model", cfg, init_params(cfg, jax.random.key(0)), tokenizer=tok))


def test_every_preset_validates_from_the_base(stand_in_base):
  from rlkit.train.config_checks import validate
  seen = {}
  for preset in cfg_module.PRESETS:
    c = cfg_module.get_config(preset)
    assert c.model.path == cfg_module.BASE_MODEL and c.tokenizer.kind == "hf"
    key = json.dumps(c.to_dict(), sort_keys=True, default=str)
    assert key not in seen, f"preset {preset!r} is the same config as {seen.get(key)!r}"
    seen[key] = preset
    c.model.path = stand_in_base
    assert validate(c) is None
  assert cfg_module.get_config("huatuo").rl.onepo.rule == "huatuo"
  assert cfg_module.get_config("annealed").rl.onepo.teacher_rows == cfg_module.TEACHER_ROWS > 1


def test_the_teacher_rows_verify_on_the_hard_task(stand_in_base):
  assert driver.teacher_accuracy(stand_in_base) == 1.0


def _workdir(path, steps, rows):
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump({"stages": ["rl"], "rl": {"steps": steps}}, f)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def _arm(path, hard, below=(0.9, 0.85), long=0.0, teacher="", steps=STEPS):
  """A finished arm: its start evaluation, `steps` training rows and an evaluation every EVAL_EVERY; `hard(step)`
  the hard-task accuracy at each evaluation."""
  rows = [{"stage": "rl", "step": 1, "at_stage_start": True, "eval/accuracy": hard(0), "eval/below/accuracy": below[0],
           "eval/long/accuracy": long}]
  for s in range(1, steps + 1):
    row = {"stage": "rl", "step": s, "step_s": 1.0, "reward": hard(s), "entropy": 0.5}
    if teacher and s <= ANNEAL:
      row.update({f"{teacher}/teacher_tokens": 20.0, f"{teacher}/teacher_p_sum": 5.0, f"{teacher}/teacher_rows": 4.0})
    rows.append(row)
    if s % EVAL_EVERY == 0:
      rows.append({"stage": "rl", "step": s, "eval/accuracy": hard(s), "eval/below/accuracy": below[1],
                   "eval/long/accuracy": long})
  _workdir(path, steps, rows)


def _gate(root, pass_k=0.1, below=0.9):
  _workdir(os.path.join(root, "gate"), 1, [
      {"stage": "rl", "step": 1, "at_stage_start": True, "eval/accuracy": 0.01, f"eval/pass@{K}": pass_k,
       "eval/below/accuracy": below, "eval/long/accuracy": 0.0},
      {"stage": "rl", "step": 1, "step_s": 2.0, "reward": 0.0},
      {"stage": "rl", "step": 1, "eval/accuracy": 0.01, f"eval/pass@{K}": pass_k, "eval/below/accuracy": below}])


def _archive(root, seeds=(0, 1, 2)):
  """Made-up runs: grpo stays at 0; annealed climbs to 0.3 and holds; huatuo reaches 0.4; permanent 0.2;
  every arm loses 5 points one step below, none gets the shifted split."""
  curves = {"grpo": lambda s: 0.0, "permanent": lambda s: 0.2 * s / STEPS,
            "annealed": lambda s: min(0.3, 0.3 * s / ANNEAL), "huatuo": lambda s: min(0.4, 0.4 * s / ANNEAL)}
  terms = {"grpo": "", "permanent": "shaped", "annealed": "shaped", "huatuo": "floored"}
  for arm in ARMS:
    for seed in seeds:
      _arm(os.path.join(root, f"{arm}_s{seed}"), curves[arm], teacher=terms[arm])


def test_gate_checks_each_minimum():
  start = {f"eval/pass@{K}": 0.2, "eval/below/accuracy": 0.8, "eval/accuracy": 0.01}

  def failed(start, teacher=1.0):
    return [c.name for c in driver.gate_checks(start, teacher) if not c.passed]
  assert failed(start) == []
  too_good = {**start, f"eval/pass@{K}": GATE["base_pass_max"] + 0.01}
  assert failed(too_good) == [f"G2 the base's pass@{K} on the hard task"]
  assert failed(start, teacher=0.5) == ["G1 the teacher's rows verify on the hard task"]
  assert failed({**start, "eval/below/accuracy": 0.3}) == ["G3 the base's greedy accuracy one step below"]
  assert len(failed({})) == 2                                  # values the run did not log fail their checks


def test_a_failed_gate_stops_the_driver_before_any_arm(tmp_path, capsys, monkeypatch):
  root, dest = str(tmp_path / "runs"), str(tmp_path / "archive")
  _gate(root, pass_k=0.7)                                      # finished (no launch); the base is too good: G2
  monkeypatch.setattr(driver, "teacher_accuracy", lambda model: 1.0)
  assert driver.main([f"--root={root}", f"--archive={dest}"]) == driver.GATE_FAILED
  out = capsys.readouterr().out
  assert "FAILED: no arm runs" in out and ":grpo" not in out
  gate = json.load(open(os.path.join(dest, "gate.json")))
  assert gate["passed"] is False and [c["value"] for c in gate["checks"]] == [1.0, 0.7, 0.9]
  assert gate["base"][f"eval/pass@{K}"] == 0.7 and sorted(os.listdir(dest)) == ["gate", "gate.json"]


def test_the_driver_runs_every_arm_and_the_archive_reads_like_the_runs(tmp_path, capsys):
  root, dest = str(tmp_path / "runs"), str(tmp_path / "archive")
  assert driver.main([f"--root={root}", "--dry_run", "--seeds=0", "--model=/some/base"]) == 0
  out = capsys.readouterr().out
  assert "configs/onepo.py:gate" in out and "the gate is checked here" in out
  for arm in ARMS:
    assert f"configs/onepo.py:{arm} --workdir={root}/{arm}_s0 --config.seed=0 --config.model.path=/some/base" in out
  _gate(root)
  _archive(root)
  driver.record_gate(root, "onepo", driver.gate_checks(driver.start_eval(os.path.join(root, "gate")), 1.0))
  assert driver.finish(argparse.Namespace(archive=dest, dry_run=False, root=root), []) == 0
  assert "archived 13 workdir(s)" in capsys.readouterr().out
  assert sorted(os.listdir(dest)) == sorted(["gate", "gate.json", *(f"{a}_s{s}" for a in ARMS for s in range(3))])
  summarize.main([f"--root={root}", f"--out={tmp_path / 'a.png'}"])
  from_runs = capsys.readouterr().out
  summarize.main([f"--root={dest}", f"--out={tmp_path / 'b.png'}"])
  assert capsys.readouterr().out.replace(dest, root).replace("b.png", "a.png") == from_runs


def test_summary_prints_the_gate_and_every_verdict_per_seed(tmp_path, capsys):
  root = str(tmp_path / "runs")
  _gate(root)
  _archive(root)
  driver.record_gate(root, "onepo", driver.gate_checks(driver.start_eval(os.path.join(root, "gate")), 1.0))
  summarize.main([f"--root={root}"])
  out = capsys.readouterr().out
  lines = {line.split(" | ")[0].lstrip("| "): line for line in out.splitlines() if line.startswith("| ")}
  assert "Calibration gate: **passed**" in out
  assert lines["G3 the base's greedy accuracy one step below"].endswith("| ok |")
  assert lines["1. plain GRPO stalls (hard < 0.1)"].endswith("| yes | yes | yes | supported |")
  assert "| yes (+0.300) |" in lines["2. annealed ends >= 0.05 above grpo (hard)"]
  assert lines["3. huatuo ends >= 0.05 above grpo (hard)"].endswith("supported |")
  assert lines["4. huatuo ends above annealed (hard)"].endswith("| higher (+0.100) | supported |")
  assert lines[f"5. annealed holds after the teacher retires (hard at {STEPS} >= at {ANNEAL} - 0.02)"].endswith(
      "| yes (+0.000) | supported |")
  assert lines["6. annealed ends above permanent (shifted split)"].endswith("| tie (+0.000) | no evidence (ties) |")
  for arm in ARMS:
    assert lines[f"7. {arm} keeps the step below (loses <= 0.1)"].endswith("| yes (-0.050) | supported |")
  assert "| huatuo | 0,1,2 | 0.000 (0.000-0.000) -> 0.400 (0.400-0.400) |" in out
  assert (tmp_path / "runs" / "accuracy.png").exists()
  # A seed short: verdicts wait for it.
  summarize.main([f"--root={root}", "--seeds=0,1,2,3"])
  assert "| - | incomplete |" in capsys.readouterr().out
