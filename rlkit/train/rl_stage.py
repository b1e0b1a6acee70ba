"""The `rl` stage: the RL iteration composed from its phases (rlkit/train/phases/, methods/llm.md §12).

  collect   G completions per prompt from the KV-cache sampler                          phases/collect.py
            (or its perturbed copy: a simulated inference engine, rl.rollout_mismatch)  rollout/mismatch.py
  reward    the stage's reward function on one RewardBatch (+ overlong penalty)         phases/reward.py
  filter    which groups to keep, and whether to sample another round (FILTERS)       phases/filter.py
  augment   rows added to each group from elsewhere (AUGMENTERS; none by default)     phases/augment.py
  score     the registered scorers the section uses (SCORERS): old / reference /      phases/score.py
            roles' log-probs, a teacher's (any tokenizer), the critic's values         train/distill.py, critic.py
  correct   the off-policy correction's token weights and rejections (CORRECTIONS)    objectives/correction.py
  advantages per-token advantages (ADVANTAGES, TOKEN_ESTIMATORS)                     phases/advantages.py
            (then the scorers that act after the advantages: GRAFT's peer-row weights)
  update    epochs x minibatches of the jitted step, a sum of LOSS_TERMS              phases/update.py
            (then every scorer's own update: the critic's)

Everything a method changes is a registered component named in the config; this module only wires them.
"""
from __future__ import annotations

import time

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.core.errors import ConfigError
from rlkit.core.registry import choice, closest_first
from rlkit.core.sections import check_sections
from rlkit.core.types import ROW_SOURCE, ROW_SOURCES
from rlkit.data.pipeline import make_iterator
from rlkit.models.lora import sampling_params
from rlkit.objectives.correction import CORRECTIONS
from rlkit.optim.optimizers import gradient_path, make_optimizer
from rlkit.optim.schedules import check as check_schedules
from rlkit.optim.schedules import values_at
from rlkit.parallel.hosts import host_rows, process_sum
from rlkit.rewards import REWARDS, VerifierExecutor, check_reward_kwargs, concat_outputs, take
from rlkit.rollout.mismatch import from_config as mismatch_from_config
from rlkit.rollout.mismatch import sampling_model
from rlkit.rollout.scoring import replay_mode
from rlkit.train.rl_config import rl_defaults
from rlkit.train import onepo  # noqa: F401  (registers the onepo augmenter, estimator and loss term)
from rlkit.train.phases.advantages import with_advantages
from rlkit.train.phases.augment import AUGMENTERS, AugmentEnv, build_augmenter
from rlkit.train.phases.collect import COLLECTORS, CollectEnv, Samples, sampling_config
from rlkit.train.phases.filter import FILTERS, select_rows
from rlkit.train.phases.reward import compute_rewards
from rlkit.train.phases.score import ScoreEnv, build_scorers, run_scorers, scorer_state, train_batch
from rlkit.train.phases.update import ppo_updates
from rlkit.train.policy import POLICIES
from rlkit.train.rl_metrics import accuracy, failures, mismatch, policy_metrics
from rlkit.train.stages import Stage, loop, register_stage
from rlkit.train.steps import default_step_inputs, init_train_state, make_rl_step, term_weights
from rlkit.train import weight_sync


def _total_updates(cfg) -> int:
  return cfg.steps * cfg.ppo_epochs * cfg.minibatches


def _init(ctx, cfg, params):
  return init_policy_state(ctx, cfg, params)


def init_policy_state(ctx, cfg, params, module=None, own_reference: bool = False) -> dict:
  """One policy's slice of the stage state: `train`, and as configured `ref_params` (its initial parameters:
  kl_beta > 0 without a `models.reference`, or `own_reference`), `correction` and the state of every active
  scorer that owns one (e.g. `critic`)."""
  state = {"train": init_train_state(params, make_optimizer(cfg.optimizer, _total_updates(cfg)),
                                     gradient_path(cfg.optimizer))}
  if cfg.kl_beta > 0 and ("reference" not in ctx.models or own_reference):
    state["ref_params"] = jax.tree.map(jnp.copy, params)
  state.update(scorer_state(ctx, cfg, params, module))
  correction = CORRECTIONS.get(cfg.correction.name).init(cfg.correction)
  if correction:                                         # e.g. calibrated IS's mismatch scale
    state["correction"] = correction
  return state


class Learner:
  """One policy's RL iteration (the phases of the module docstring) over its own slice of the stage state
  (`train`, `ref_params`, `correction`, the scorers' own, e.g. `critic`, and with rl.sync the sampler's copy
  `sampler`, which checkpoints leave out and `ready` remakes): `sample` collects, rewards and
  filters; `learn` scores (the registered scorers active for the section, phases/score.py), corrects,
  computes advantages, runs the scorers that act after the advantages (e.g. GRAFT's peer-row weights),
  updates the policy, then every scorer with an update of its own (the critic). The `rl` stage is one
  Learner; the `graft` stage runs two and trades rows between them."""

  def __init__(self, ctx, cfg, state, reward_fn, model=None, augmenter=None):
    self.ctx, self.cfg, self.reward_fn = ctx, cfg, reward_fn
    self.model = ctx.model if model is None else model
    tok = ctx.tokenizer
    tx = make_optimizer(cfg.optimizer, _total_updates(cfg))
    self.sampling = sampling_config(cfg, tok)
    self.step_fn = make_rl_step(self.model, tx, cfg, self.sampling, cfg.micro_batches, replay_mode(cfg),
                                gradient_path(cfg.optimizer))
    self.step_inputs = default_step_inputs(cfg)
    self.scorers = build_scorers(ScoreEnv(ctx, cfg, self.sampling, self.model, "ref_params" in state))
    self.keep = FILTERS.get(cfg.filter)
    self.correction = CORRECTIONS.get(cfg.correction.name)
    engine = mismatch_from_config(cfg.rollout_mismatch)
    self.sampler_model, self.perturb = sampling_model(self.model, engine), engine.logits_hook(self.sampling)
    # rl.sync: the sampler's own copy of the weights (its mesh and dtype) in state["sampler"], synced after
    # every update phase
    self.sync = weight_sync.build(cfg.sync, state["train"].params, self.sampler_model, ctx.config.model.lora,
                                  engine.dtype)
    self.sampler_model = self.sync.model
    self.collect = weight_sync.on_sampler(self.sync, COLLECTORS.get(cfg.collector).make(
        cfg, CollectEnv(tok, ctx.task, ctx.models, ctx.config.model.path)))
    self.augmenter = augmenter or build_augmenter(cfg, AugmentEnv(tok, reward_fn, cfg, ctx.put_batch, ctx.models))
    # the traced step inputs that follow a schedule: the augmenter's defaults, overridden by rl.schedules
    self.schedules = {**AUGMENTERS.get(cfg.augment).schedules(cfg), **cfg.schedules.to_dict()}

  def ready(self, state: dict) -> dict:
    """The policy state `state` with the sampler's copy (rl.sync) it lacks after a start or a resume (made from
    `state["train"]`'s params); `state` itself when the copy is there or the sync is off."""
    return weight_sync.with_copy(self.sync, state)

  def sampler_params(self, state: dict):
    """What the sampler reads for the policy state `state`: its own synced copy (rl.sync), else the policy's
    params (LoRA: merged weights or the adapter path)."""
    return sampling_params(weight_sync.sampling_source(self.ready(state).get(weight_sync.SAMPLER),
                                                       state["train"].params), self.ctx.config.model.lora)

  def sample(self, state, batch, key, iterator):
    """collect -> reward -> filter in rounds, from the sampler's view of the policy state `state` (pass it
    through `ready` first to keep the copy it makes). Returns (samples, rewards, the first round's rewards,
    rounds)."""
    cfg, prompts = self.cfg, self.cfg.prompts_per_step
    parts, outputs, rounds = [], [], 0
    params = self.sampler_params(state)
    while True:
      s = self.collect(self.sampler_model, params, batch, jax.random.fold_in(key, rounds), self.sampling,
                       cfg.group_size, self.ctx.put_batch, first_group_id=rounds * prompts, perturb=self.perturb)
      parts.append(s), outputs.append(compute_rewards(self.reward_fn, s, self.ctx.tokenizer, cfg))
      rounds += 1
      selection = self.keep(concat_outputs(outputs).rewards, cfg.group_size, prompts)
      if selection.done or rounds > cfg.max_sampling_rounds:
        break
      batch = next(iterator)
    samples, rewards = Samples.concat(parts), concat_outputs(outputs)
    rows = select_rows(selection, len(samples), cfg.group_size, prompts)
    return samples.take(rows), take(rewards, rows), outputs[0], rounds

  def inputs_at(self, scheduled: dict) -> dict:
    """The update step's traced inputs: the loss terms' weights, overridden by the schedules' values at this
    step (`scheduled`; float32 scalars: a new value does not recompile the step)."""
    return dict(self.step_inputs, **{k: jnp.float32(v) for k, v in scheduled.items()})

  def learn(self, state, samples, rewards, capacity, key, step: int = 0):
    """score -> correct -> advantages -> score (after advantages) -> update (the policy, then every scorer
    with an update). `step`: the stage step (the schedules' clock). Returns (state, metrics, skipped, batch)."""
    cfg, state = self.cfg, self.ready(state)
    batch, metrics = run_scorers(self.scorers["score"], state, train_batch(samples, None, self.ctx.put_batch),
                                 samples)
    metrics.update(mismatch(batch))
    corrected = self.correction.apply(batch, cfg.correction, state.get("correction", {}))
    batch = batch.replace(token_weights=batch.token_weights * corrected.weights,
                          loss_mask=batch.loss_mask & corrected.keep)
    if corrected.state:
      state = dict(state, correction=corrected.state)
    metrics.update(corrected.metrics)
    batch = with_advantages(batch, rewards, cfg, capacity, self.ctx.put_batch, samples.valid)
    batch, refined = run_scorers(self.scorers["advantages"], state, batch, samples)
    metrics.update(refined)
    scheduled = values_at(self.schedules, step)
    train, update_metrics, skipped = ppo_updates(self.step_fn, state["train"], batch, key, cfg.ppo_epochs,
                                                 cfg.minibatches, self.inputs_at(scheduled))
    metrics.update(update_metrics)
    metrics.update({f"schedule/{k}": v for k, v in scheduled.items()})
    state = dict(state, train=train)
    for _, scorer in self.scorers["score"] + self.scorers["advantages"]:
      if scorer.update is not None:
        state, scorer_metrics = scorer.update(state, batch, key)
        metrics.update(scorer_metrics)
    # rl.sync: the sampler's copy follows every update, whichever stage drives this learner
    copy, synced = weight_sync.update(self.sync, state.get(weight_sync.SAMPLER), train.params)
    if copy is not None:
      state = dict(state, **{weight_sync.SAMPLER: copy})
    metrics.update(synced)
    return state, metrics, skipped, batch

  def iteration(self, state, batch, key, iterator, step):
    cfg, state = self.cfg, self.ready(state)
    t0 = time.perf_counter()
    samples, rewards, first, rounds = self.sample(state, batch, key, iterator)
    lengths = host_rows(samples.rollout.lengths)            # the policy's rows, before any augmentation
    metrics = policy_metrics(rewards, lengths, cfg.group_size)
    metrics.update({f"collect/{k}": v for k, v in samples.metrics.items()})
    samples, rewards = self.augmenter(samples, rewards, jax.random.fold_in(key, 5_000), step)
    sample_s = time.perf_counter() - t0
    t1 = time.perf_counter()
    state, learned, skipped, batch = self.learn(state, samples, rewards, cfg.group_size + self.augmenter.extra_rows,
                                                key, step)
    update_s = time.perf_counter() - t1
    metrics.update(learned)
    metrics.update(**accuracy(first), **failures(rewards.failures))
    gen_tokens, tokens, teacher = process_sum([lengths.sum(),
                                               host_rows(batch.attention_mask).sum(),
                                               np.sum(samples.row_source == ROW_SOURCE["teacher"])])
    metrics.update({"sampling_rounds": rounds, "sample_s": sample_s, "update_s": update_s,
                    "gen_tokens_per_s": float(gen_tokens) / max(sample_s, 1e-9),
                    "tokens_per_s": cfg.ppo_epochs * float(tokens) / max(update_s, 1e-9)})
    if self.augmenter.extra_rows:
      metrics["rows/teacher"] = int(teacher)
    return state, metrics, skipped


class _CollectorStateIterator:
  """The data iterator with a collector's host state beside its own (`get_state` / `set_state`), so the stage's
  checkpoint keeps both (an asynchronous collector's queue of unfinished samples, rlkit/train/async_collect.py)."""

  def __init__(self, inner, collector):
    self.inner, self.collector = inner, collector

  def __next__(self):
    return next(self.inner)

  def get_state(self) -> dict:
    return {"data": self.inner.get_state(), "collector": self.collector.get_state()}

  def set_state(self, state: dict) -> None:
    self.inner.set_state(state["data"])
    self.collector.set_state(state["collector"])


def with_collector_state(iterator, collector):
  """`iterator` itself, or wrapped with the collector's state when the collector keeps host state across
  iterations (it has `get_state`); a collector with `attach` gets the data iterator to read ahead from."""
  if hasattr(collector, "attach"):
    collector.attach(iterator)
  return _CollectorStateIterator(iterator, collector) if hasattr(collector, "get_state") else iterator


def stage_iterator(ctx, cfg, meta):
  return make_iterator(ctx.train_source, cfg.prompts_per_step, ctx.config.seed + 1000 * meta["stage_index"],
                       ctx.tokenizer, ctx.config.data.max_prompt_len, process_index=jax.process_index(),
                       process_count=jax.process_count())


SHOW = ("reward", "accuracy", "mismatch/mean")


def reward_executor(cfg) -> VerifierExecutor:
  return VerifierExecutor(timeout_s=cfg.reward.timeout_s, call_timeout_s=cfg.reward.call_timeout_s or None)


def _run(ctx, cfg, state, start: int, meta: dict):
  executor = reward_executor(cfg)
  try:                       # the worker process is stopped however the stage ends
    reward_fn = REWARDS.get(cfg.reward.name)(ctx.task, executor, models=ctx.models, **dict(cfg.reward.kwargs))
    learner = Learner(ctx, cfg, state, reward_fn)
    return loop(ctx, cfg, state, start, meta, with_collector_state(stage_iterator(ctx, cfg, meta), learner.collect),
                learner.iteration, SHOW)
  finally:
    executor.close()


def validate(section, name: str) -> None:
  """Range checks of an RL section (types and unknown keys are checked by `config_checks.validate`)."""
  from rlkit.objectives import AGGREGATIONS, KL_ESTIMATORS, POLICY_LOSSES
  from rlkit.objectives.loss_terms import LOSS_TERMS, SFT_ONLY_TERMS, policy_loss_error
  from rlkit.train.phases.advantages import all_estimators, min_group_size

  def need(ok: bool, key: str, rule: str) -> None:
    if not ok:
      raise ConfigError(f"{name}.{key}={section[key]!r} {rule}.")

  choice(section.reward.name, REWARDS, f"{name}.reward.name")
  try:
    check_reward_kwargs(section.reward.name, dict(section.reward.kwargs))
  except (TypeError, ValueError) as e:
    raise ConfigError(f"{name}.reward.kwargs: {e}") from None
  choice(section.advantage, all_estimators(), f"{name}.advantage")
  choice(section.policy_loss, POLICY_LOSSES, f"{name}.policy_loss")
  bad_loss = policy_loss_error(section.policy_loss, section.eps_low, section.eps_high, section.dual_clip,
                               dict(section.policy_kwargs))
  if bad_loss:
    raise ConfigError(f"{name}: {bad_loss} (rl.policy_loss, eps_low, eps_high, dual_clip, policy_kwargs)")
  choice(section.aggregation, AGGREGATIONS, f"{name}.aggregation")
  choice(section.kl_estimator, KL_ESTIMATORS, f"{name}.kl_estimator")
  choice(section.filter, FILTERS, f"{name}.filter")
  choice(section.collector, COLLECTORS, f"{name}.collector")
  choice(section.policy, POLICIES, f"{name}.policy")
  policy_check = getattr(POLICIES.get(section.policy), "check", None)   # a policy's own requirements, if any
  if policy_check is not None:
    policy_check(section, name)
  check_sections(section, name)                # correction, distill, onepo, critic, sync, ... (their own modules)
  choice(section.augment, AUGMENTERS, f"{name}.augment")
  for term in section.loss_terms.keys():
    choice(term, LOSS_TERMS, f"{name}.loss_terms.{term}")
    if term in ("policy", "kl", "entropy"):
      raise ConfigError(f"{name}.loss_terms.{term}: the {term!r} term is configured by its own fields "
                        "(always on / kl_beta / entropy_coef); loss_terms holds extra terms only.")
    if term in SFT_ONLY_TERMS:
      raise ConfigError(f"{name}.loss_terms.{term}: {term!r} is the SFT stage's next-token loss; it does not "
                        "read an RL TrainBatch.")
  check_schedules(section.schedules, f"{name}.schedules")
  inputs = {f"weight/{term}" for term in term_weights(section)} | {f"rows/{s}" for s in ROW_SOURCES}
  for key in section.schedules.keys():
    if key not in inputs:
      raise ConfigError(f"{name}.schedules.{key}: not a step input of this stage; schedulable inputs: "
                        f"{', '.join(closest_first(key, inputs))} (a loss term's weight is an input once the "
                        "term is configured).")
  for key in ("prompts_per_step", "max_new_tokens", "ppo_epochs", "minibatches", "micro_batches"):
    need(section[key] >= 1, key, "must be >= 1")
  least = min_group_size(section.advantage)
  need(section.group_size >= least, "group_size",
       f"is too small: advantage {section.advantage!r} needs at least {least} completions per prompt")
  need(section.temperature > 0, "temperature", "must be > 0")
  need(section.top_k >= 0, "top_k", "must be >= 0 (0 turns it off)")
  need(0 < section.top_p <= 1, "top_p", "must be in (0, 1] (1 turns it off)")
  need(0 <= section.gamma <= 1, "gamma", "must be in [0, 1]")
  need(0 <= section.gae_lambda <= 1, "gae_lambda", "must be in [0, 1]")
  bad = [s for s in section.surrogate_rows if s not in ROW_SOURCE]
  need(not bad and len(section.surrogate_rows) > 0, "surrogate_rows", f"must name row sources of {ROW_SOURCES}")
  need(section.kl_beta >= 0, "kl_beta", "must be >= 0")
  need(section.adv_eps >= 0, "adv_eps", "must be >= 0")
  need(section.max_sampling_rounds >= 0, "max_sampling_rounds", "must be >= 0")
  need(0 <= section.overlong_cache <= section.max_new_tokens, "overlong_cache",
       f"must be in [0, max_new_tokens={section.max_new_tokens}]")
  need(section.max_skipped_updates >= 0, "max_skipped_updates", "must be >= 0 (0: never stop)")
  need(section.reward.timeout_s >= 0, "reward", "needs reward.timeout_s >= 0 (0: no limit, for debugging)")
  need(section.reward.call_timeout_s >= 0, "reward", "needs reward.call_timeout_s >= 0 (0: no cap)")
  if section.reward.call_timeout_s and not section.reward.timeout_s:
    raise ConfigError(f"{name}.reward.call_timeout_s={section.reward.call_timeout_s} needs the worker: set "
                      f"{name}.reward.timeout_s > 0 (0 runs verifiers inline, without limits).")
  rows = section.prompts_per_step * (section.group_size + AUGMENTERS.get(section.augment).extra_rows(section))
  parts = section.minibatches * section.micro_batches
  if rows % parts:
    raise ConfigError(f"{name}: the {rows} rows of an iteration (prompts_per_step x group rows) must divide "
                      f"into minibatches x micro_batches = {parts} equal parts.")
  try:
    AUGMENTERS.get(section.augment).check(section, name)
    COLLECTORS.get(section.collector).check(section, name)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def distill_defaults():
  """The `distill` stage kind: this stage with on-policy distillation as its objective (rlkit/train/distill.py),
  so a multi-stage config reads as what it does: stages ("sft", "rl", "distill"), the last one's model a student
  (its own model.path) and models.teacher the policy the earlier stages trained."""
  c = rl_defaults()
  c.kind = "distill"            # stage kind (registry STAGES)
  c.advantage = "opd"           # sg(log p_T - log p_S) per token (+ distill.reward_weight x the RL advantage)
  return c


register_stage("rl", Stage(_init, _run, rl_defaults, validate))
register_stage("distill", Stage(_init, _run, distill_defaults, validate))
