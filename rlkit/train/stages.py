"""Training stages (registry `STAGES`, config key `<section>.kind`) and the loop they share.

A run is a list of stages; each starts from the previous stage's parameters with a fresh optimizer. A stage
kind is one registration, a `Stage`: `defaults()` (its config section, every field commented), `validate(
section, name)` (range checks, before any work), `needs` (the run-level sections it uses, so a stage without
a language model needs no tokenizer), `init(ctx, cfg, params) -> state` (a pytree: what a checkpoint holds)
and `run(ctx, cfg, state, start_step, meta) -> state`; `roles(section)` names the `config.models` roles it trains
besides its policy (they must say trainable=True). Kinds: `sft` (rlkit/train/sft_stage.py), `rl`
(rlkit/train/rl_stage.py, the RL iteration as phases; `distill` is it with OPD defaults), `graft`,
`reward_model`, `rquest` (their modules `<kind>_stage.py`). Checkpoint steps are global (`offset + stage step`), and the PRNG key of stage step s is `fold_in(stage key, s)`, so a resumed stage draws exactly what an
uninterrupted one would. A stage may end before `cfg.steps` (SFT's `stop_at_loss`); its last checkpoint then
says `done`, and global steps of later stages still start at the offset `cfg.steps` reserves. The loop
evaluates every `eval_every` steps and at the stage's end (with eval.log_samples of the greedy rows, see
metrics.py), and, when `meta["eval_at_start"]` (run.py: the first stage of a run that loads `model.path`),
once before the first update, logged at the stage's first global step and marked `at_stage_start`.

Non-finite guard: a step whose loss or gradient is not finite changes nothing (see `steps.py`); after
`max_skipped_updates` such steps in a row the loop stops with `TrainingError`, before saving, so the last
checkpoint is the last good state.
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, NamedTuple, Optional

import jax
import ml_collections

from rlkit.core.errors import TrainingError
from rlkit.core.registry import Registry
from rlkit.models.lora import sampling_params
from rlkit.train.evaluate import evaluate


@dataclasses.dataclass
class Context:
  """What every stage needs: the model and its data, where to log, how to save."""
  config: ml_collections.ConfigDict
  model: Any
  tokenizer: Any
  task: Any
  train_source: Any
  eval_records: list
  logger: Any
  checkpointer: Any
  key: jax.Array
  put_batch: Callable[[dict], dict]        # host batch -> device arrays (sharded over the data axes)
  models: dict = dataclasses.field(default_factory=dict)   # role -> Model (rlkit.train.models), besides the policy
  workdir: str = ""
  extra_evals: dict = dataclasses.field(default_factory=dict)   # eval.extra_sets: name -> (task, records)


class Stage(NamedTuple):
  init: Callable                           # (ctx, cfg, params) -> state pytree
  run: Callable                            # (ctx, cfg, state, start_step, meta) -> state
  defaults: Callable                       # () -> the section's ConfigDict
  validate: Callable                       # (section, name) -> None; raises ConfigError
  needs: tuple = ("tokenizer", "task", "data", "model")
  roles: Callable = lambda section: ()     # (section) -> the config.models roles the stage trains
  # (ctx, params, global_step, index, samples) -> {"eval/...": value}, the held-out evaluation of the stage's
  # policy (samples: a list for the rows to show, or None); None: the LLM evaluation, `eval_metrics`
  evaluate: Optional[Callable] = None


STAGES: Registry[Stage] = Registry("stage kind")


def stage_key(ctx: Context, index: int) -> jax.Array:
  return jax.random.fold_in(ctx.key, index)


def numeric(batch: dict) -> dict:
  """Drops the host-only columns (text, fields)."""
  return {k: v for k, v in batch.items() if getattr(v, "dtype", None) is not None and v.dtype != object}


def eval_metrics(ctx: Context, params, global_step: int, index: int, model=None, samples=None) -> dict:
  """The evaluation of `params` (of `model`, default the stage's policy) at a global step: {"eval/...": ...},
  and for every set of eval.extra_sets {"eval/<name>/...": ...} (the same sampler keys). With `samples` (a
  list), the first eval.log_samples greedy rows of every set are appended to it, each with its `set` (the
  main one is "test")."""
  e = ctx.config.eval
  key = jax.random.fold_in(jax.random.fold_in(ctx.key, 10_000 + index), global_step)
  sets = {"": (ctx.task, ctx.eval_records), **{f"{name}/": v for name, v in ctx.extra_evals.items()}}
  metrics = {}
  params = sampling_params(params, ctx.config.model.lora)      # LoRA: merged or not, as the rollouts
  for prefix, (task, records) in sets.items():
    rows = [] if samples is not None else None
    got = evaluate(ctx.model if model is None else model, params, ctx.tokenizer, task, records, key,
                   batch_size=e.batch_size, max_prompt_len=ctx.config.data.max_prompt_len,
                   max_new_tokens=e.max_new_tokens, pass_k=e.pass_k, pass_n=e.pass_n, put_batch=ctx.put_batch,
                   by_category=e.by_category, log_samples=e.log_samples, samples=rows)
    if samples is not None:
      samples += [{"set": prefix[:-1] or "test", **row} for row in rows]
    metrics.update({"eval/" + prefix + k[len("eval/"):]: v for k, v in got.items()})
  return metrics


# Marks the eval row of a stage's start (the loaded model before its first update): the run's summary shows
# the stage's gain over it.
AT_STAGE_START = "at_stage_start"


def maybe_eval(ctx: Context, params, name: str, global_step: int, index: int, at_start: bool = False,
               evaluate: Optional[Callable] = None) -> dict:
  """Evaluates (the stage's `evaluate` hook, default `eval_metrics`), logs the eval row and its sample rows
  (eval.log_samples), and says the headline."""
  samples = []
  metrics = (evaluate or eval_metrics)(ctx, params, global_step, index, samples=samples)
  if metrics:
    ctx.logger.log(global_step, name, {**metrics, AT_STAGE_START: True} if at_start else metrics)
    when = ", the stage's start (before its first update)" if at_start else ""
    ctx.logger.say(f"eval {name} @ step {global_step}{when}: {eval_headline(metrics)}")
    if samples:
      ctx.logger.log_samples(global_step, name, samples)
  return metrics


def is_headline(key: str) -> bool:
  """The evaluation metrics a console line shows: accuracy and pass@k (an embodied stage's success; a generative
  stage's reward and MMD to the data)."""
  return key in ("eval/accuracy", "eval/success", "eval/reward", "eval/mmd") or key.startswith("eval/pass@")


def eval_headline(metrics: dict) -> str:
  """"accuracy 0.322, pass@4 0.551 (500 prompts)" from an evaluation's metrics."""
  parts = [f"{k[len('eval/'):]} {v:.3f}" for k, v in metrics.items() if is_headline(k) and isinstance(v, (int, float))]
  count = metrics.get("eval/num_examples")
  return ", ".join(parts) + (f" ({count} prompts)" if count else "")


def save(ctx: Context, state, global_step: int, meta: dict, force: bool) -> None:
  if force or ctx.checkpointer.should_save(global_step):
    ctx.checkpointer.save(global_step, state, meta)


# Smoothing of the training loss that `stop_at_loss` compares: ~20 steps, enough to average out minibatch
# noise without lagging far behind a loss that is falling fast.
LOSS_EMA_DECAY = 0.95


def loop(ctx: Context, cfg, state, start: int, meta: dict, iterator, iteration: Callable, show: tuple,
         stop_at_loss: float = 0.0):
  """Shared stage loop: iterate, log, evaluate and checkpoint by global step; resume from `start`.

  `iteration(state, batch, key, iterator, step) -> (state, metrics, skipped)` (`step` the stage step, from 0)
  with `skipped` the per-update-step
  non-finite flags. With `stop_at_loss > 0` the stage ends once the moving average of its training loss
  falls below it. The average and the run of skipped steps are part of the checkpoint metadata, so a
  resumed stage behaves exactly as an uninterrupted one.
  """
  name, index, offset = meta["stage"], meta["stage_index"], meta["offset"]
  if start > 0 and meta.get("iterator") is not None:
    iterator.set_state(meta["iterator"])
  loss_ema = meta.get("loss_ema")
  skipped_run = meta.get("skipped_run", 0)
  ctx.logger.say(f"stage {name} ({cfg.kind}): " + (f"resuming at step {start} of {cfg.steps}" if start else
                 f"{cfg.steps} steps") + f" (global steps {offset + 1}..{offset + cfg.steps})")
  evaluate = STAGES.get(cfg.kind).evaluate if cfg.kind in STAGES else None
  if start == 0 and meta.get("eval_at_start"):   # its gain is then visible (run.py sets it for a loaded model)
    maybe_eval(ctx, state["train"].params, name, offset + 1, index, at_start=True, evaluate=evaluate)
  ctx.logger.start_stage(name, cfg.steps, start)
  key = stage_key(ctx, index)
  for step in range(start, cfg.steps):
    t0 = time.perf_counter()
    state, metrics, skipped = iteration(state, next(iterator), jax.random.fold_in(key, step), iterator, step)
    for flag in skipped:
      skipped_run = skipped_run + 1 if flag else 0
    if cfg.max_skipped_updates and skipped_run >= cfg.max_skipped_updates:
      raise TrainingError(
          f"stage {name!r}: {skipped_run} update steps in a row had a non-finite loss or gradient and were "
          f"skipped (global step {offset + step + 1}); nothing after the last checkpoint was saved. Lower "
          f"{name}.optimizer.lr, check the data and rewards for NaN/inf, or raise {name}.max_skipped_updates.")
    metrics["step_s"] = time.perf_counter() - t0
    if "tokens" in metrics:
      metrics["tokens_per_s"] = metrics.pop("tokens") / max(metrics["step_s"], 1e-9)
    stop = False
    if stop_at_loss:
      loss = float(metrics["loss"])
      loss_ema = loss if loss_ema is None else LOSS_EMA_DECAY * loss_ema + (1 - LOSS_EMA_DECAY) * loss
      metrics["loss_ema"] = loss_ema
      stop = loss_ema < stop_at_loss
    gstep = offset + step + 1
    ctx.logger.log(gstep, name, metrics, show=show)
    ctx.logger.advance()
    last = step + 1 == cfg.steps or stop
    if cfg.eval_every and (step + 1) % cfg.eval_every == 0 and not last:
      maybe_eval(ctx, state["train"].params, name, gstep, index, evaluate=evaluate)
    meta_now = dict(meta, stage_step=step + 1, iterator=iterator.get_state(), loss_ema=loss_ema, done=last,
                    skipped_run=skipped_run)
    if last:
      maybe_eval(ctx, state["train"].params, name, gstep, index, evaluate=evaluate)
    save(ctx, state, gstep, meta_now, force=last)
    if last:
      ctx.logger.close_bar()
      why = (f"ended at step {step + 1} of {cfg.steps}: the loss average {loss_ema:.4g} fell below "
             f"stop_at_loss={stop_at_loss}" if stop else f"finished {cfg.steps} steps")
      ctx.logger.say(f"stage {name}: {why}; checkpoint {ctx.checkpointer.directory}/{gstep} (kept)")
      break
  ctx.logger.close_bar()
  return state


def register_stage(kind: str, stage: Stage) -> None:
  STAGES.add(kind, stage)

