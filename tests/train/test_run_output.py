"""What a run shows a user: sample rows at each evaluation (console, samples.jsonl, a wandb table), the config
printed as its difference from the config file, one line on a loaded model, and the evaluation of a loaded
model at the start of its stage with the gain in the summary. Each test stands in a fake for the sampler or
the stage's work, so none compiles a training step."""
import dataclasses
import json
import logging
from types import SimpleNamespace

import jax
import ml_collections
import numpy as np
import optax
import pytest

from configs.grpo_arith import get_config
from rlkit.data.pipeline import as_text_record
from rlkit.models.lora import view_shape
from rlkit.models.tokenizer import CharTokenizer
from rlkit.models.transformer import Transformer, init_params
from rlkit.parallel.mesh import make_mesh
from rlkit.train import checkpoint as ckpt, stages
from rlkit.train import evaluate as ev
from rlkit.train.config import model_defaults
from rlkit.train.metrics import MetricsLogger, read_metrics
from rlkit.train.models import build_model, build_models, model_spec, role_model_defaults, transformer_config
from rlkit.train.run import run, summary_lines
from rlkit.train.stages import AT_STAGE_START, Context, Stage, loop, register_stage
from rlkit.train.steps import init_train_state
from tests.cli_in_process import launch_in_process

TOK = CharTokenizer()
SAMPLE_FIELDS = {"step", "stage", "set", "prompt", "completion", "answer", "correct"}


# ------------------------------------------------------------------------------------------ samples

def _echo(model, params, tokens, mask, key, cfg):
  """Stands in for `generate`: every prompt is answered with itself."""
  prompts = [TOK.decode(t[m].tolist()) for t, m in zip(np.asarray(tokens), np.asarray(mask))]
  response = np.zeros((len(prompts), 8), np.int32)
  for i, p in enumerate(prompts):
    response[i, :len(p)] = TOK.encode(p)
  return SimpleNamespace(response=response, lengths=np.array([len(p) for p in prompts]))


class _Exact:
  def verify(self, completion, answer):
    return float(completion == answer)


def test_evaluate_hands_back_its_first_greedy_rows(monkeypatch):
  monkeypatch.setattr(ev, "generate", _echo)
  # Answers equal to the prompt are right: rows 0, 2, 4, 6.
  records = [{"prompt": f"{i}+1", "answer": f"{i}+1" if i % 2 == 0 else "x"} for i in range(7)]
  kw = dict(batch_size=3, max_prompt_len=6, max_new_tokens=4, pass_k=0)   # 3 chunks, the last one padded
  for n in (2, 5, 20):
    rows = []
    metrics = ev.evaluate(None, None, TOK, _Exact(), records, jax.random.key(0), log_samples=n, samples=rows, **kw)
    assert len(rows) == min(n, len(records))                    # across chunks, never a padding repeat
    assert [r["prompt"] for r in rows] == [r["prompt"] for r in records[:len(rows)]]
    assert all(set(r) == {"prompt", "completion", "answer", "correct"} for r in rows)
    assert [r["correct"] for r in rows] == [i % 2 == 0 for i in range(len(rows))]
    assert all(r["completion"] == r["prompt"] for r in rows)
    assert metrics["eval/accuracy"] == pytest.approx(4 / 7)
  rows = []
  ev.evaluate(None, None, TOK, _Exact(), records, jax.random.key(0), log_samples=0, samples=rows, **kw)
  assert rows == []
  with pytest.raises(ValueError, match="eval.log_samples=-1"):
    ev.evaluate(None, None, TOK, _Exact(), records, jax.random.key(0), log_samples=-1, samples=[], **kw)


def _fake_evaluate(accuracies):
  """Stands in for `evaluate`: the next of `accuracies` per call, and the first log_samples records as rows
  (each one right where the accuracy is at least 0.5)."""
  calls = []

  def fake(model, params, tok, task, records, key, log_samples=0, samples=None, **kw):
    acc = accuracies[min(len(calls), len(accuracies) - 1)]
    calls.append(acc)
    if samples is not None:
      samples += [{"prompt": as_text_record(r)["prompt"], "completion": "7", "answer": "7", "correct": acc >= 0.5}
                  for r in records[:log_samples]]
    return {"eval/accuracy": acc, "eval/pass@2": acc, "eval/num_examples": len(records)}
  return fake


class _FakeWandb:
  def __init__(self):
    self.logged = []

  def log(self, data, step):
    self.logged.append((step, data))

  def finish(self):
    pass


def test_each_evaluation_writes_its_sample_rows_to_samples_jsonl_the_console_and_wandb(
    tmp_path, monkeypatch, capsys):
  c = get_config("test")
  c.eval.log_samples = 3
  monkeypatch.setattr(stages, "evaluate", _fake_evaluate([0.75]))
  logger = MetricsLogger(str(tmp_path), "disabled", progress=False)
  logger._wandb = wandb = _FakeWandb()       # what wandb.init would give, minus the run
  records = [{"prompt": f"{i}+{i}=", "answer": str(2 * i)} for i in range(5)]
  ctx = Context(config=c, model=None, tokenizer=None, task=None, train_source=None, eval_records=records,
                logger=logger, checkpointer=None, key=jax.random.key(0), put_batch=None,
                extra_evals={"long": (None, records[:2])})
  stages.maybe_eval(ctx, None, "rl", 7, 1)
  logger.close()
  rows = read_metrics(str(tmp_path / "samples.jsonl"))
  assert len(rows) == 3 + 2                                 # log_samples of the main set, all 2 of "long"
  assert all(set(r) == SAMPLE_FIELDS for r in rows)
  assert [(r["set"], r["step"], r["stage"]) for r in rows] == [("test", 7, "rl")] * 3 + [("long", 7, "rl")] * 2
  assert [r["prompt"] for r in rows] == ["0+0=", "1+1=", "2+2=", "0+0=", "1+1="] and rows[0]["correct"] is True
  out = capsys.readouterr().out
  assert "samples rl @ step 7, eval set 'test'" in out and "eval set 'long'" in out
  assert out.count("[right] '1+1=' -> '7' (answer '7')") == 2
  (step, data), = [entry for entry in wandb.logged if "eval/samples" in entry[1]]
  table = data["eval/samples"]
  assert step == 7 and set(table.columns) == SAMPLE_FIELDS and len(table.data) == 5

  c.eval.log_samples = 0                                    # off: no rows, no console lines
  (tmp_path / "off").mkdir()
  logger = MetricsLogger(str(tmp_path / "off"), "disabled", progress=False)
  stages.maybe_eval(dataclasses.replace(ctx, logger=logger), None, "rl", 7, 1)
  logger.close()
  assert read_metrics(str(tmp_path / "off" / "samples.jsonl")) == []
  assert "samples rl" not in capsys.readouterr().out


def test_a_resume_cuts_samples_jsonl_back_to_the_restored_step(tmp_path):
  logger = MetricsLogger(str(tmp_path), "disabled", progress=False)
  for step in (4, 8):
    logger.log_samples(step, "rl", [{"set": "test", "prompt": "1+1=", "completion": "2", "answer": "2",
                                     "correct": True}])
  logger.close()
  MetricsLogger(str(tmp_path), "disabled", resume_step=6, progress=False).close()
  assert [r["step"] for r in read_metrics(str(tmp_path / "samples.jsonl"))] == [4]
  MetricsLogger(str(tmp_path), "disabled", progress=False).close()     # a fresh run starts it empty
  assert read_metrics(str(tmp_path / "samples.jsonl")) == []


# --------------------------------------------------------------------------------- the config print

def test_a_run_prints_its_config_as_the_difference_from_the_config_file(tmp_path, monkeypatch):
  import rlkit.train.run
  monkeypatch.setattr(rlkit.train.run, "run", lambda config, workdir: {})   # only what launch prints
  config_arg, workdir = "--config=configs/grpo_arith.py:test", tmp_path / "run"
  code, out, err = launch_in_process(config_arg, f"--workdir={workdir}")
  assert code == 0, err
  assert out.strip().splitlines() == [
      f"config: configs/grpo_arith.py:test as the file sets it; the whole resolved config is in "
      f"{workdir}/config.json (--print_config prints it with each field's comment)"]
  whole = json.loads((workdir / "config.json").read_text())
  assert whole["rl"]["kl_beta"] == 0.0 and whole["eval"]["log_samples"] == 4
  assert len((workdir / "config.json").read_text().splitlines()) > 200

  code, out, err = launch_in_process(config_arg, f"--workdir={workdir}", "--config.rl.kl_beta=0.1",
                                     "--config.stages=('rl',)", "--allow_config_change")
  assert code == 0, err
  lines = out.strip().splitlines()
  assert lines[0].startswith("config: configs/grpo_arith.py:test with 2 keys changed from the file; ")
  assert [line.split() for line in lines[1:]] == [["rl.kl_beta", "=", "0.1", "(file:", "0.0)"],
                                                   ["stages", "=", '["rl"]', "(file:", '["sft",', '"rl"])']]
  assert json.loads((workdir / "config.json").read_text())["rl"]["kl_beta"] == 0.1

  code, out, err = launch_in_process(config_arg, "--print_config")   # the whole config, as before
  assert code == 0 and len(out.splitlines()) > 200 and "kl_beta" in out


# ------------------------------------------------------------------------------ a loaded model's line

def _section(**kw):
  s = model_defaults()
  s.update(dict(hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8))
  s.update(kw)
  return s


def _count(tree) -> int:
  return sum(int(np.prod(x.shape)) for x in jax.tree.leaves(tree))


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory):
  """A workdir whose checkpoints/ holds step 3 of a tiny char-tokenizer model; and that model's params."""
  workdir = tmp_path_factory.mktemp("source")
  module = Transformer(transformer_config(_section(), TOK.vocab_size))
  params = init_params(module.cfg, jax.random.key(0))
  saver = ckpt.Checkpointer(str(workdir / "checkpoints"), every=1,
                            model_spec=model_spec(module.cfg, {"kind": "char", "path": ""}))
  saver.save(3, {"train": init_train_state(params, optax.sgd(0.1))}, {"stage_index": 0, "done": True})
  saver.close()
  return workdir, params


def test_a_loaded_model_is_reported_in_one_line_with_its_trainable_parameters(source_dir, caplog):
  workdir, base = source_dir
  mesh = make_mesh({"data": 1}, jax.devices()[:1])
  lines = []
  build_model(_section(path=str(workdir)), TOK, jax.random.key(1), mesh, say=lines.append)
  assert lines == [f"model: loaded rlkit workdir {workdir} (its newest checkpoint: global step 3); "
                   f"{_count(base):,} parameters, all trainable"]

  lora = _section(path=str(workdir / "checkpoints" / "3"))
  lora.lora.rank, lora.lora.targets = 2, ("qkv", "down")
  lines = []
  _, params = build_model(lora, TOK, jax.random.key(1), mesh, say=lines.append)
  # Each targeted projection of each layer gets A [in, 2] and B [2, out] (trainable) and a scale (frozen).
  views = [view_shape(m, n, base[layer][m][n].shape) for layer in base if layer.startswith("layers_")
           for m, n in (("attn", "qkv"), ("mlp", "down"))]
  adapters = sum(2 * (n_in + n_out) for n_in, n_out in views)
  assert len(views) == 4 and _count(params) == _count(base) + adapters + len(views)
  assert lines == [f"model: loaded rlkit checkpoint {workdir}/checkpoints/3 (global step 3); {_count(params):,} "
                   f"parameters, {adapters:,} trainable (LoRA adapters; the base weights frozen)"]

  role = role_model_defaults()
  role.update(path=str(workdir))
  lines = []
  with caplog.at_level(logging.WARNING):
    build_models(ml_collections.ConfigDict({"reference": role}), TOK, jax.random.key(2), mesh, say=lines.append)
  assert lines == [f"models.reference: loaded rlkit workdir {workdir} (its newest checkpoint: global step 3); "
                   f"{_count(base):,} parameters, frozen"]
  # Orbax warns whenever it opens checkpoints read-only, which loading always does; the loader drops it.
  assert not [r for r in caplog.records if "read only" in r.getMessage()]
  with caplog.at_level(logging.WARNING):
    ckpt.CheckpointReader(str(workdir / "checkpoints")).close()
  assert [r for r in caplog.records if "read only" in r.getMessage()]


# ------------------------------------------------------------------- evaluation at a stage's start

def _noop_defaults():
  c = ml_collections.ConfigDict()
  c.kind = "test_run_output_noop"
  c.steps = 2
  c.eval_every = 0
  c.max_skipped_updates = 0
  return c


class _Steps:
  def __init__(self):
    self.n = 0

  def __next__(self):
    self.n += 1
    return self.n

  def get_state(self):
    return self.n

  def set_state(self, n):
    self.n = n


def _noop_run(ctx, cfg, state, start, meta):
  return loop(ctx, cfg, state, start, meta, _Steps(), lambda s, batch, key, it, step: (s, {"loss": 0.0}, [False]),
              ("loss",))


register_stage("test_run_output_noop", Stage(
    lambda ctx, cfg, params: {"train": init_train_state(params, optax.set_to_zero())}, _noop_run, _noop_defaults,
    lambda section, name: None))


def _noop_config(tmp_path, path: str):
  c = get_config("test")
  c.stages = ("noop", "again")
  c.noop, c.again = _noop_defaults(), _noop_defaults()
  c.model.update(hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8,
                 path=path)
  c.data.dir = str(tmp_path / "data")           # both runs share the prepared data
  c.data.num_train, c.data.num_test, c.eval.num_examples = 16, 8, 8
  c.eval.log_samples = 2
  return c


def test_a_loaded_model_is_evaluated_at_its_stage_start_and_the_summary_shows_the_gain(
    source_dir, tmp_path, monkeypatch, capsys):
  """Two stages from a loaded model: the first is evaluated before its first update; the second starts where
  the first one's final evaluation left it, so it is not."""
  workdir, _ = source_dir
  monkeypatch.setattr(stages, "evaluate", _fake_evaluate([0.25, 0.75, 0.5]))
  final = run(_noop_config(tmp_path, str(workdir)), str(tmp_path / "loaded"))
  rows = read_metrics(str(tmp_path / "loaded" / "metrics.jsonl"))
  assert [(r["stage"], r["step"], "eval/accuracy" in r, r.get(AT_STAGE_START, False)) for r in rows] == [
      ("noop", 1, True, True), ("noop", 1, False, False), ("noop", 2, False, False), ("noop", 2, True, False),
      ("again", 3, False, False), ("again", 4, False, False), ("again", 4, True, False)]
  assert rows[0]["eval/accuracy"] == 0.25 and final["eval/accuracy"] == 0.5
  samples = read_metrics(str(tmp_path / "loaded" / "samples.jsonl"))
  assert [(r["stage"], r["step"]) for r in samples] == [("noop", 1)] * 2 + [("noop", 2)] * 2 + [("again", 4)] * 2
  out = capsys.readouterr().out
  assert "eval noop @ step 1, the stage's start (before its first update): accuracy 0.250" in out
  assert [line.split() for line in out.splitlines() if line.startswith(("  noop", "  again"))] == [
      ["noop", "start", "1", "0.250", "0.250"], ["noop", "2", "0.750", "0.750"],
      ["noop", "gain", "+0.500", "+0.500"], ["again", "4", "0.500", "0.500"]]


def test_the_summary_lists_a_stage_start_only_where_one_was_evaluated():
  evals = [{"step": 4, "stage": "sft", "eval/accuracy": 0.5}, {"step": 8, "stage": "rl", "eval/accuracy": 0.25}]
  assert summary_lines(evals)[0] == "summary (held-out evaluation at the end of each stage):"
  assert [line.split() for line in summary_lines(evals)[2:]] == [["sft", "4", "0.500"], ["rl", "8", "0.250"]]
