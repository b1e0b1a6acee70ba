"""The run driver's per-stage pieces: a stage with its own task gets that task and its data; extra held-out
sets (eval.extra_sets) get theirs and are evaluated beside the main one."""
import json

import jax
import pytest

from configs.grpo_arith import get_config
from rlkit.data.pipeline import as_text_record
from rlkit.core.errors import ConfigError
from rlkit.train.config_checks import validate
from rlkit.train import stages
from rlkit.train.run import extra_evals, stage_context
from rlkit.train.stages import Context


def _ctx(config, workdir):
  return Context(config=config, model=None, tokenizer=None, task="run task", train_source="run data",
                 eval_records=["run eval"], logger=None, checkpointer=None, key=None, put_batch=None,
                 workdir=str(workdir))


def test_a_stage_with_its_own_task_gets_its_task_and_data(tmp_path):
  c = get_config("test")
  c.rl.task.name = "arithmetic"
  c.rl.task.kwargs = {"ops": "*", "min_digits": 1, "max_digits": 2}
  validate(c)
  ctx = _ctx(c, tmp_path)
  assert stage_context(ctx, c, "sft") is ctx                       # no override: the run's own pieces
  rl = stage_context(ctx, c, "rl")
  assert rl.task.ops == "*" and rl.eval_records
  prompts = [as_text_record(rl.train_source[i])["prompt"] for i in range(len(rl.train_source))]
  assert all("*" in p and "+" not in p for p in prompts)


def test_a_stage_jsonl_task_reads_its_own_file(tmp_path):
  path = tmp_path / "rl.jsonl"
  path.write_text("\n".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1), "level": i % 3})
                            for i in range(8)) + "\n")
  c = get_config("test")
  c.rl.task.name = "jsonl"
  c.rl.task.kwargs = {"path": str(path), "required_fields": ["level"]}
  validate(c)
  rl = stage_context(_ctx(c, tmp_path), c, "rl")
  assert len(rl.train_source) == 8 and rl.eval_records == []
  c.rl.task.kwargs = {"path": str(path), "required_fields": ["rubric"]}
  with pytest.raises(ConfigError, match="rl.task.kwargs"):
    validate(c)


def test_extra_held_out_sets_are_their_tasks_test_splits_evaluated_beside_the_main_one(tmp_path, monkeypatch):
  c = get_config("test")
  c.eval.extra_sets = {"long": {"min_digits": 3, "max_digits": 3}}
  validate(c)
  sets = extra_evals(c, str(tmp_path))
  task, records = sets["long"]
  assert task.min_digits == 3 and len(records) == c.eval.num_examples
  assert all(len(as_text_record(r)["prompt"].split("+")[0]) == 3 for r in records)
  calls = []
  monkeypatch.setattr(stages, "evaluate", lambda model, params, tok, task, records, key, **kw:
                      calls.append((task, records)) or {"eval/accuracy": float(len(calls))})
  ctx = Context(config=c, model=None, tokenizer=None, task="run task", train_source=None, eval_records=["main"],
                logger=None, checkpointer=None, key=jax.random.key(0), put_batch=None, extra_evals=sets)
  assert stages.eval_metrics(ctx, None, 1, 0) == {"eval/accuracy": 1.0, "eval/long/accuracy": 2.0}
  assert calls == [("run task", ["main"]), (task, records)]
  for bad, needle in (({"bad name": {}}, "plain name"), ({"x": {"digits": 3}}, "eval.extra_sets.x"),
                      ({"x": 3}, "must map task kwargs")):
    c.eval.extra_sets = bad
    with pytest.raises(ConfigError, match=needle):
      validate(c)
