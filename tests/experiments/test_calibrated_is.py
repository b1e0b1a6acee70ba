"""experiments/calibrated_is: the configs validate against a stand-in for the base (a tiny Hugging Face folder with
a digit-splitting BPE), the driver runs the calibration gate first, writes its outcome, stops before the arms
when it fails and archives what the summary reads, and (slow) the gradient harness measures every arm on a
sampler copy. The summary over a synthetic archive is in test_summaries.py."""
import json
import os

import numpy as np
import pytest

from configs import calibrated_is as cfgs
from experiments.calibrated_is import mismatch_gate, run
from experiments.calibrated_is import summarize
from experiments.gate import GATE_FAILED, read_gate

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture(scope="module")
def stand_in(tmp_path_factory):
  """A one-layer model with a BPE tokenizer of the task's prompts, saved as the base is (bf16 HF folder)."""
  import jax
  import jax.numpy as jnp

  from rlkit.data.tasks import make_task
  from rlkit.models import hf
  from rlkit.models.bpe import bpe_tokenizer
  from rlkit.models.transformer import TransformerConfig, init_params

  task, rng = make_task("arithmetic", **cfgs.TASK), np.random.default_rng(0)
  texts = [e["prompt"] + e["answer"] for e in (task.make_example(rng) for _ in range(300))]
  folder = tmp_path_factory.mktemp("base")
  tok = bpe_tokenizer(texts, 280, folder=str(folder / "tok"), split_digits=True)
  cfg = TransformerConfig(vocab_size=tok.vocab_size, hidden_size=32, intermediate_size=64, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=16, param_dtype="bfloat16", dtype="bfloat16")
  params = jax.tree.map(lambda x: x.astype(jnp.bfloat16), init_params(cfg, jax.random.key(0)))
  return str(hf.save(folder / "model", cfg, params, tokenizer=tok))


def test_presets_validate_and_differ_in_the_copy_only(stand_in):
  from rlkit.train.config_checks import validate
  configs = {}
  for preset in cfgs.PRESETS:
    c = cfgs.get_config(preset)
    assert c.model.path == cfgs.BASE and c.rl.sync.kind == "dense" and c.rl.sync.dtype == "bfloat16"
    c.model.path = stand_in
    validate(c)
    configs[preset] = c.to_dict()
  assert {p: c["rl"]["sync"]["quantizer"] for p, c in configs.items()} == cfgs.QUANTIZER == {
      "bf16": "none", "fp8": "fp8", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "nvfp4_w4a4": "nvfp4_w4a4",
      "mxfp4_w4a4": "mxfp4_w4a4"}
  for c in configs.values():
    c["rl"]["sync"]["quantizer"] = "none"
  assert all(c == configs["bf16"] for c in configs.values())   # run.Env reads sampling and task from one preset
  with pytest.raises(ValueError, match="bf16, fp8, nvfp4, mxfp4"):
    cfgs.get_config("int4")


def _gate_run(path, mismatch, reward=0.5):
  """A finished gate workdir: 3 RL iterations logging the trainer's mismatch, then the final evaluation."""
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump({"stages": ["rl"], "rl": {"steps": mismatch_gate.ITERATIONS}}, f)
  rows = [{"stage": "rl", "step": s, "reward": reward, "informative_groups": 0.6, "mismatch/mean": mismatch,
           "rollout_corr/kl": 0.1 * mismatch, "loss": 0.3, "grad_norm": 1.0}
          for s in range(1, mismatch_gate.ITERATIONS + 1)]
  rows.append({"stage": "rl", "step": mismatch_gate.ITERATIONS, "eval/accuracy": 0.4})
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


W4A4 = {"nvfp4_w4a4": 0.02, "mxfp4_w4a4": 0.029}


@pytest.mark.parametrize("mismatch, arms", [({"bf16": 0.001, "fp8": 0.002, "nvfp4": 0.02, "mxfp4": 0.029, **W4A4}, []),
                                            ({"bf16": 0.001, "fp8": 0.05, "nvfp4": 0.02, "mxfp4": 0.04, **W4A4},
                                             ["fp8", "mxfp4"])])
def test_the_driver_runs_the_gate_first_and_the_arms_only_on_copies_that_pass(stand_in, tmp_path, monkeypatch,
                                                                              capsys, mismatch, arms):
  monkeypatch.chdir(REPO)                     # run.main moves to the repository root; restored after the test
  launched, measured = [], []

  def fake_launch(root, path, config, args, lock, dry_run, tag, **record):
    launched.append(config)
    _gate_run(path, mismatch[config.split(":")[1]])
    return 0

  monkeypatch.setattr(run, "launch", fake_launch)
  monkeypatch.setattr(run, "part_grad", lambda root, model, seed, sizes, copies: measured.append((seed, copies)))
  root, dest = tmp_path / "root", tmp_path / "archive"
  status = run.main([f"--root={root}", f"--archive={dest}", f"--model={stand_in}"])
  out = capsys.readouterr().out
  assert launched == [f"configs/calibrated_is.py:{copy}" for copy in ("bf16", "fp8", "nvfp4", "mxfp4", *W4A4)]
  outcome = read_gate(str(root))
  assert outcome["arms_copies"] == arms and outcome["capability"]["pass"] and outcome["passed"] == bool(arms)
  assert outcome["base"]["path"] == stand_in and len(outcome["base"]["model_safetensors_sha256"]) == 64
  if arms:
    assert status == 0 and measured == [(0, arms), (1, arms), (2, arms)] and "the arms run on: fp8, mxfp4" in out
  else:
    assert status == GATE_FAILED and measured == [] and "STOP: the calibration gate failed" in out
  # The archive holds what the summary reads: the gate runs cut to mismatch_gate.KEYS, gate.json, results.jsonl.
  assert {"gate.json", "gate_bf16", "gate_fp8", "results.jsonl"} <= set(os.listdir(dest))
  kept = mismatch_gate.read_rows(str(dest / "gate_fp8"))
  assert kept and all("loss" not in r and "grad_norm" not in r for r in kept) and "mismatch/mean" in kept[0]
  summarize.main([f"--root={dest}"])
  out = capsys.readouterr().out
  assert ("GATE: PASSED: the arms ran on fp8, mxfp4" if arms else "GATE: FAILED") in out
  assert f"base: {stand_in}, model.safetensors SHA-256 {outcome['base']['model_safetensors_sha256']}" in out
  # Measuring gradients alone, on a copy the gate refused, is refused too.
  assert run.main([f"--root={root}", "--part=grad", "--copies=bf16", "--archive="]) == GATE_FAILED


@pytest.mark.slow
def test_the_gradient_harness_measures_every_arm_on_a_sampler_copy(stand_in, tmp_path, monkeypatch):
  """run.part_grad on the stand-in (a reward with variance: an untrained model never answers right): g* from the
  master's rollouts (on-policy: the trainer's re-score equals the sampler's log-probs), then every arm's gradient
  on the fp8 copy's batches, where the mismatch is not 0."""
  from rlkit.rewards import RewardOutput, register_reward

  @register_reward("test_cis_parity")
  def _parity(task, executor):
    del task, executor
    return lambda b: RewardOutput(rewards=np.array([float(len(c) % 2) for c in b.completions]), correct=None,
                                  components={}, failures={})

  def config(preset):
    c = cfgs.get_config(preset)
    c.rl.reward.name = "test_cis_parity"
    return c

  monkeypatch.setattr(run, "get_config", config)
  run.part_grad(str(tmp_path), stand_in, 0, run.SIZES["quick"], ["fp8"])
  rows = [json.loads(line) for line in open(tmp_path / "results.jsonl")]
  target = [r for r in rows if r["type"] == "target"]
  assert len(target) == 1 and target[0]["lr_abs"] < 1e-5 and target[0]["informative"] > 0
  batches = [r for r in rows if r["type"] == "batch"]
  assert len(batches) == run.SIZES["quick"]["batches"] and all(r["lr_abs"] > 0 for r in batches)
  grads = [r for r in rows if r["type"] == "grad"]
  assert sorted({r["arm"] for r in grads}) == sorted(cfgs.ARMS)
  assert all(np.isfinite(r["nmse"]) and r["kept_tokens"] > 0 for r in grads)
  assert {r["arm"] for r in rows if r["type"] == "mean_grad"} == set(cfgs.ARMS)
