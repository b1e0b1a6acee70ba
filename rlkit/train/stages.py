"""Training stages (registry `STAGES`, config key `<section>.kind`): supervised fine-tuning and RL.

A run is a list of stages; each starts from the previous stage's parameters with a fresh optimizer. A stage
is a pair of functions: `init(ctx, cfg, params) -> state` (a pytree: what a checkpoint holds) and
`run(ctx, cfg, state, start_step, meta) -> state`. Checkpoint steps are global (`offset + stage step`), and
the PRNG key of stage step s is `fold_in(stage key, s)`, so a resumed stage draws exactly what an
uninterrupted one would. A stage may end before `cfg.steps` (SFT's `stop_at_loss`); its last checkpoint then
says `done`, and global steps of later stages still start at the offset `cfg.steps` reserves.

The RL iteration (methods/llm.md §12):
  prompts --sampler--> G completions each --verifier--> rewards --(DAPO filter/refill)--> advantages
  --trainer re-score--> old log-probs (and the sampler/trainer mismatch) --> K epochs x minibatches of rl_step
"""
from __future__ import annotations

import dataclasses
import time
from typing import Any, Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.core.registry import Registry
from rlkit.data.pipeline import make_iterator, make_sft_iterator
from rlkit.objectives import dynamic_sampling_select, group_advantages, overlong_penalty
from rlkit.optim.optimizers import make_optimizer
from rlkit.rewards import REWARDS
from rlkit.rollout.sampler import SamplingConfig, generate
from rlkit.train.evaluate import decode_responses, evaluate
from rlkit.train.steps import RLLossConfig, init_train_state, make_rl_step, make_score_fn, make_sft_step


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


class Stage(NamedTuple):
  init: Callable
  run: Callable


STAGES: Registry[Stage] = Registry("stage kind")


def _stage_key(ctx: Context, index: int) -> jax.Array:
  return jax.random.fold_in(ctx.key, index)


def _numeric(batch: dict) -> dict:
  """Drops the host-only text columns."""
  return {k: v for k, v in batch.items() if getattr(v, "dtype", None) is not None and v.dtype != object}


def _maybe_eval(ctx: Context, params, name: str, global_step: int, index: int) -> dict:
  e = ctx.config.eval
  metrics = evaluate(ctx.model, params, ctx.tokenizer, ctx.task, ctx.eval_records,
                     jax.random.fold_in(jax.random.fold_in(ctx.key, 10_000 + index), global_step),
                     batch_size=e.batch_size, max_prompt_len=ctx.config.data.max_prompt_len,
                     max_new_tokens=e.max_new_tokens, pass_k=e.pass_k)
  if metrics:
    ctx.logger.log(global_step, name, metrics)
  return metrics


def _save(ctx: Context, state, global_step: int, meta: dict, force: bool) -> None:
  if force or ctx.checkpointer.should_save(global_step):
    ctx.checkpointer.save(global_step, state, meta)


# Smoothing of the training loss that `stop_at_loss` compares: ~20 steps, enough to average out minibatch
# noise without lagging far behind a loss that is falling fast.
LOSS_EMA_DECAY = 0.95


def _loop(ctx: Context, cfg, state, start: int, meta: dict, iterator, iteration: Callable, show: tuple,
          stop_at_loss: float = 0.0):
  """Shared stage loop: iterate, log, evaluate and checkpoint by global step; resume from `start`.

  With `stop_at_loss > 0` the stage ends once the moving average of its training loss falls below it. The
  average is part of the checkpoint metadata, so a resumed stage stops at exactly the same step.
  """
  name, index, offset = meta["stage"], meta["stage_index"], meta["offset"]
  if start > 0 and meta.get("iterator") is not None:
    iterator.set_state(meta["iterator"])
  loss_ema = meta.get("loss_ema")
  ctx.logger.start_stage(name, cfg.steps, start)
  stage_key = _stage_key(ctx, index)
  for step in range(start, cfg.steps):
    t0 = time.perf_counter()
    state, metrics = iteration(state, next(iterator), jax.random.fold_in(stage_key, step), iterator)
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
      _maybe_eval(ctx, state["train"].params, name, gstep, index)
    meta_now = dict(meta, stage_step=step + 1, iterator=iterator.get_state(), loss_ema=loss_ema, done=last)
    if last:
      _maybe_eval(ctx, state["train"].params, name, gstep, index)
    _save(ctx, state, gstep, meta_now, force=last)
    if last:
      break
  ctx.logger.close_bar()
  return state


# ---------------------------------------------------------------------------------------------------- SFT

def _sft_init(ctx: Context, cfg, params):
  tx = make_optimizer(cfg.optimizer, cfg.steps)
  return {"train": init_train_state(params, tx)}


def _sft_run(ctx: Context, cfg, state, start: int, meta: dict):
  tx = make_optimizer(cfg.optimizer, cfg.steps)
  step_fn = make_sft_step(ctx.model, tx, cfg.micro_batches)
  it = make_sft_iterator(ctx.train_source, cfg.batch_size, ctx.config.seed + 1000 * meta["stage_index"],
                         ctx.tokenizer, cfg.max_len)

  def iteration(state, batch, key, iterator):
    train, m = step_fn(state["train"], ctx.put_batch(_numeric(batch)))
    return {"train": train}, dict(jax.device_get(m), tokens=int(np.sum(batch["attention_mask"])))

  return _loop(ctx, cfg, state, start, meta, it, iteration, ("loss", "token_accuracy"), cfg.stop_at_loss)


STAGES.add("sft", Stage(_sft_init, _sft_run))


# ----------------------------------------------------------------------------------------------------- RL

def rl_loss_config(cfg) -> RLLossConfig:
  return RLLossConfig(policy_loss=cfg.policy_loss, eps_low=cfg.eps_low, eps_high=cfg.eps_high,
                      dual_clip=cfg.dual_clip or None, aggregation=cfg.aggregation,
                      kl_estimator=cfg.kl_estimator, kl_beta=cfg.kl_beta, entropy_coef=cfg.entropy_coef,
                      temperature=cfg.temperature, max_len=cfg.max_new_tokens)


def _rl_init(ctx: Context, cfg, params):
  tx = make_optimizer(cfg.optimizer, cfg.steps * cfg.ppo_epochs * cfg.minibatches)
  state = {"train": init_train_state(params, tx)}
  if cfg.kl_beta > 0:
    state["ref_params"] = jax.tree.map(jnp.copy, params)
  return state


def _sample_round(ctx: Context, cfg, params, batch: dict, key, sampling: SamplingConfig):
  """G completions for each prompt of `batch`, scored. Returns (rollout, rewards [N], verifier failures)."""
  g = cfg.group_size
  rep = np.repeat(np.arange(len(batch["answer"])), g)
  dev = ctx.put_batch({"prompt": batch["prompt_tokens"][rep], "mask": batch["prompt_mask"][rep]})
  rollout = generate(ctx.model, params, dev["prompt"], dev["mask"], key, sampling,
                     group_ids=jnp.asarray(rep, jnp.int32))
  texts = decode_responses(ctx.tokenizer, rollout)
  rewards, failures = REWARDS.get(cfg.reward)(ctx.task, texts, [batch["answer"][i] for i in rep])
  return rollout, rewards, failures


def ppo_updates(step_fn, train, data: dict, key, epochs: int, minibatches: int):
  """`epochs` passes over the iteration's rows, each split into `minibatches` shuffled optimizer steps.

  Returns the new train state and the per-step metrics summed over all steps (still on device).
  """
  n_rows = data["response"].shape[0]
  sums = None
  for epoch in range(epochs):
    perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, 7_000 + epoch), n_rows))
    for part in np.split(perm, minibatches):
      train, m = step_fn(train, jax.tree.map(lambda x: x[part], data))
      sums = m if sums is None else jax.tree.map(jnp.add, sums, m)
  return train, sums


def _concat_rollouts(rollouts):
  return jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *rollouts)


def _rl_run(ctx: Context, cfg, state, start: int, meta: dict):
  total_updates = cfg.steps * cfg.ppo_epochs * cfg.minibatches
  tx = make_optimizer(cfg.optimizer, total_updates)
  loss_cfg = rl_loss_config(cfg)
  step_fn = make_rl_step(ctx.model, tx, loss_cfg, cfg.micro_batches)
  score = make_score_fn(ctx.model, cfg.temperature)
  tok = ctx.tokenizer
  sampling = SamplingConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k,
                            top_p=cfg.top_p, stop_ids=tok.stop_ids, pad_id=tok.pad_id)
  it = make_iterator(ctx.train_source, cfg.prompts_per_step, ctx.config.seed + 1000 * meta["stage_index"], tok,
                     ctx.config.data.max_prompt_len)
  n_rows = cfg.prompts_per_step * cfg.group_size

  def iteration(state, batch, key, iterator):
    train = state["train"]
    t0 = time.perf_counter()
    rollouts, rewards, failures, rounds = [], [], 0, 0
    while True:
      ro, r, f = _sample_round(ctx, cfg, train.params, batch, jax.random.fold_in(key, rounds), sampling)
      if cfg.overlong_cache:
        r = r + np.asarray(overlong_penalty(np.asarray(ro.lengths), cfg.max_new_tokens, cfg.overlong_cache,
                                            cfg.overlong_factor))
      rollouts.append(ro), rewards.append(r)
      failures, rounds = failures + f, rounds + 1
      if not cfg.dynamic_sampling or rounds > cfg.max_sampling_rounds:
        break
      sel = dynamic_sampling_select(np.concatenate(rewards), cfg.group_size, cfg.prompts_per_step)
      if sel.done:
        break
      batch = next(iterator)
    rollout, all_rewards = _concat_rollouts(rollouts), np.concatenate(rewards)
    raw_acc = float(np.mean(all_rewards[:n_rows] > 0.5)) if not cfg.overlong_cache else None
    if cfg.dynamic_sampling:
      sel = dynamic_sampling_select(all_rewards, cfg.group_size, cfg.prompts_per_step)
      rows = sel.row_indices
      if len(rows) < n_rows:   # not enough informative groups: top up with the first others (zero gradient)
        rest = np.setdiff1d(np.arange(len(all_rewards)), rows)[:n_rows - len(rows)]
        rows = np.concatenate([rows, rest])
      rollout = jax.tree.map(lambda x: x[rows], rollout)
      all_rewards = all_rewards[rows]
    sample_s = time.perf_counter() - t0

    t1 = time.perf_counter()
    adv = group_advantages(cfg.advantage, jnp.asarray(all_rewards, jnp.float32), cfg.group_size, cfg.adv_eps)
    data = {"tokens": rollout.tokens, "attention_mask": rollout.attention_mask, "response": rollout.response,
            "response_mask": rollout.response_mask, "advantages": adv}
    old_logp = score(train.params, data)
    mask = np.asarray(rollout.response_mask)
    delta = np.abs(np.asarray(old_logp) - np.asarray(rollout.logprobs))[mask]
    data["old_logp"] = old_logp
    if cfg.kl_beta > 0:
      data["ref_logp"] = score(state["ref_params"], data)
    train, sums = ppo_updates(step_fn, train, data, key, cfg.ppo_epochs, cfg.minibatches)
    updates = cfg.ppo_epochs * cfg.minibatches
    metrics = {k: float(v) / updates for k, v in jax.device_get(sums).items()}
    update_s = time.perf_counter() - t1
    gen_tokens = int(np.asarray(rollout.lengths).sum())
    lengths = np.asarray(rollout.lengths)
    correct = all_rewards > 0.5
    metrics.update({
        "reward": float(np.mean(all_rewards)), "accuracy": float(np.mean(correct)),
        "response_len": float(lengths.mean()),
        "response_len_correct": float(lengths[correct].mean()) if correct.any() else 0.0,
        "response_len_wrong": float(lengths[~correct].mean()) if (~correct).any() else 0.0,
        "mismatch/mean": float(delta.mean()) if delta.size else 0.0,
        "mismatch/max": float(delta.max()) if delta.size else 0.0,
        "reward_failures": failures, "sampling_rounds": rounds,
        "informative_groups": float(np.mean(np.asarray(
            all_rewards.reshape(-1, cfg.group_size).std(axis=1) > 0))),
        "sample_s": sample_s, "update_s": update_s,
        "gen_tokens_per_s": gen_tokens / max(sample_s, 1e-9),
        "tokens_per_s": cfg.ppo_epochs * float(np.asarray(rollout.attention_mask).sum()) / max(update_s, 1e-9),
    })
    if raw_acc is not None:
      metrics["sampled_accuracy"] = raw_acc
    return dict(state, train=train), metrics

  return _loop(ctx, cfg, state, start, meta, it, iteration, ("reward", "accuracy", "mismatch/mean"))


STAGES.add("rl", Stage(_rl_init, _rl_run))
