"""The `reward_model` stage and the `reward_model` reward: a head trained on a decoder's embeddings of JSONL
examples with annotators' ratings, written to the workdir, evaluated by W1 / CRPS, resumed exactly, and used
as the RL reward with the decoder as `embed_role` (the reward equals the head's samples' mean there)."""
import json

import jax.numpy as jnp
import numpy as np
import pytest

from configs.grpo_arith import get_config
from rlkit.rewards import REWARDS, VerifierExecutor
from rlkit.rewards.head_catalog import head_spec
from rlkit.rewards.reward_model import embed, load_head, row_keys
from rlkit.train.metrics import read_metrics
from rlkit.train.models import Model, load_model
from rlkit.train.reward_model_stage import _Steps, reward_model_defaults
from rlkit.train.run import run
from tests.fast_compile import fast_compile
from tests.rewards import _verifiers as V


def _rows(n, seed):
  """Responses "good"/"bad"/"odd": consensus high, consensus low, and split annotators (bimodal)."""
  rng = np.random.default_rng(seed)
  rows = []
  for i in range(n):
    kind = ["good", "bad", "odd"][i % 3]
    mean = {"good": [1.0], "bad": [-1.0], "odd": [-2.0, 2.0]}[kind]
    ratings = [float(rng.choice(mean) + 0.1 * rng.normal()) for _ in range(6)]
    rows.append({"prompt": f"q{i % 7}", "answer": "0", "response": kind, "ratings": ratings})
  return rows


def _config(tmp_path, steps):
  for split, n, seed in (("train", 64, 0), ("test", 16, 1)):
    (tmp_path / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in _rows(n, seed)))
  c = get_config("test")
  c.task.name, c.task.kwargs = "jsonl", {}
  c.data.train_jsonl, c.data.test_jsonl = str(tmp_path / "train.jsonl"), str(tmp_path / "test.jsonl")
  c.data.max_prompt_len = 8
  c.stages = ("reward_model",)
  c.reward_model = reward_model_defaults()
  c.reward_model.update(steps=steps, batch_size=16, head="gaussian", eval_every=4)
  c.reward_model.head_kwargs = {"hidden": 16}
  c.reward_model.optimizer.lr = 1e-2
  c.checkpoint.every = 4
  return c


@fast_compile()
def test_the_stage_trains_a_head_that_the_reward_uses(tmp_path):
  executor = VerifierExecutor(timeout_s=0.0)         # inline: the reward here runs no host-side verifier
  run(_config(tmp_path, 8), str(tmp_path / "rm"))
  rows = read_metrics(str(tmp_path / "rm" / "metrics.jsonl"))
  evals = [r for r in rows if "eval/rm/w1" in r]
  assert [r["step"] for r in evals] == [4, 8] and all(np.isfinite(r["eval/rm/crps"]) for r in evals)
  losses = [r["loss"] for r in rows if "loss" in r]
  assert len(losses) == 8 and losses[-1] < losses[0]
  decoder = Model(*load_model(str(tmp_path / "rm")), False)    # the frozen decoder the head was trained on
  folder = str(tmp_path / "rm" / "reward_model" / "reward_model")
  name, kwargs, module, params = load_head(folder, decoder.module.cfg.hidden_size)
  assert name == "gaussian" and kwargs["hidden"] == 16 and "rating_mean" in kwargs
  reward_fn = REWARDS.get("reward_model")(None, executor, models={"embedder": decoder}, path=folder,
                                          embed_role="embedder", samples=8)
  batch = V.make_batch(["good", "odd", "bad"], prompts=["q1", "q1", "q1"])
  out = reward_fn(batch)
  cond = jnp.asarray(embed(decoder, batch.prompts, batch.completions))
  keys = row_keys(0, [p + "\x00" + c for p, c in zip(batch.prompts, batch.completions)])
  samples = jnp.stack([head_spec(name).samples(params, module.apply, k, cond[i:i + 1], 8)[0]
                       for i, k in enumerate(keys)])
  np.testing.assert_allclose(out.rewards, np.asarray(samples.mean(-1)), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(out.components["rm/std"], np.asarray(samples.std(-1)), rtol=1e-5, atol=1e-6)
  assert out.correct is None
  with pytest.raises(ValueError, match="holds no trained head"):
    REWARDS.get("reward_model")(None, executor, models={"embedder": decoder}, path=str(tmp_path),
                                embed_role="embedder")


def test_the_data_stream_resumes_from_its_step():
  a, b = _Steps(50, 8, 3), _Steps(50, 8, 3)
  first = [next(a) for _ in range(5)]
  b.set_state({"step": 3})
  np.testing.assert_array_equal(next(b), first[3])
  assert a.get_state() == {"step": 5}


@fast_compile()
def test_non_finite_head_steps_are_skipped_and_stop_the_stage(tmp_path):
  from rlkit.core.errors import TrainingError
  c = _config(tmp_path, 6)
  (tmp_path / "train.jsonl").write_text("".join(
      json.dumps({**r, "ratings": [1e38] * 6}) + "\n" for r in _rows(64, 0)))   # (r - mean)^2 overflows
  c.reward_model.head_kwargs = {"hidden": 16, "rating_mean": 0.0, "rating_std": 1.0}
  c.reward_model.max_skipped_updates = 2
  with pytest.raises(TrainingError, match="2 update steps in a row had a non-finite loss"):
    run(c, str(tmp_path / "bad"))
  rows = read_metrics(str(tmp_path / "bad" / "metrics.jsonl"))
  assert [r["skipped_updates"] for r in rows if "loss" in r] == [1.0]


def test_a_pair_head_reads_chosen_and_rejected_texts():
  """What the stage builds follows the head's batch keys: a Bradley-Terry head needs `chosen` and `rejected`."""
  from types import SimpleNamespace
  from rlkit.core.errors import ConfigError
  from rlkit.train.reward_model_stage import _data
  cfg = SimpleNamespace(head="bradley_terry")
  ctx = SimpleNamespace(model=None, tokenizer=None)
  rows = [{"prompt": "q", "answer": "0", "chosen": "good", "rejected": "bad"}, {"prompt": "q", "answer": "0",
                                                                                "chosen": "good"}]
  assert _data(ctx, cfg, None, rows[:1], "test", embed_texts=False) == {}
  with pytest.raises(ConfigError, match="example 1 needs a string `rejected` field"):
    _data(ctx, cfg, None, rows, "test", embed_texts=False)
