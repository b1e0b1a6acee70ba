"""Evaluation is a stage hook (`Stage.evaluate`): a stage kind whose policy is not a token decoder brings its
own held-out evaluation, which the shared loop runs at `eval_every` and at the stage's end (the LLM
evaluation is the default)."""
import jax
import jax.numpy as jnp
import ml_collections

import test_stages as ts   # the RL stage's test components (pytest's rootdir import: the same module object)
from rlkit.train.config import base_config
from rlkit.train.stages import STAGES, Context, Stage, loop, register_stage
from rlkit.train.steps import TrainState


def _defaults():
  c = ml_collections.ConfigDict()
  c.kind = "test_evaluate_hook"
  c.steps = 3
  c.eval_every = 2
  c.max_skipped_updates = 0
  return c


def _evaluate(ctx, params, global_step, index, samples=None):
  """A bandit policy's held-out score: its mean's distance to the best arm (no sampler, no task)."""
  if samples is not None:
    samples.append({"set": "test", "prompt": "", "completion": f"mu={float(params['mu']):.2f}", "correct": True})
  return {"eval/distance": float(jnp.abs(params["mu"] - 1.0)), "eval/step_seen": global_step}


class _Steps:
  def __next__(self):
    return {}

  def get_state(self):
    return {}


def _run(ctx, cfg, state, start, meta):
  def iteration(state, batch, key, iterator, step):
    train = state["train"]
    return dict(state, train=train._replace(params={"mu": train.params["mu"] + 0.25})), {"loss": 0.0}, [False]
  return loop(ctx, cfg, state, start, meta, _Steps(), iteration, ())


register_stage("test_evaluate_hook", Stage(init=lambda ctx, cfg, params: {}, run=_run, defaults=_defaults,
                                           validate=lambda section, name: None, needs=(), evaluate=_evaluate))


def test_the_loop_runs_the_stages_own_evaluation():
  logger = ts._Log()
  ctx = Context(config=base_config(), model=None, tokenizer=None, task=None, train_source=[], eval_records=[],
                logger=logger, checkpointer=ts._NoCkpt(), key=jax.random.key(0), put_batch=lambda b: b)
  state = {"train": TrainState(jnp.zeros((), jnp.int32), {"mu": jnp.float32(0.0)}, ())}
  STAGES.get("test_evaluate_hook").run(ctx, _defaults(), state, 0, {"stage": "bandit", "stage_index": 0,
                                                                      "offset": 10})
  evals = [r for r in logger.rows if "eval/distance" in r]
  assert [(r["step"], r["eval/step_seen"]) for r in evals] == [(12, 12), (13, 13)]   # eval_every 2, and the end
  assert [round(r["eval/distance"], 6) for r in evals] == [0.5, 0.25]
  assert [(r["step"], r["completion"]) for r in logger.samples] == [(12, "mu=0.50"), (13, "mu=0.75")]
