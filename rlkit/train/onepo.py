"""OnePO in the trainer (OUR DESIGN, methods/llm.md §7; the maths: `rlkit.objectives.onepo`): three
registered components and one config section, `rl.onepo`.

  augmenter `onepo`            up to `onepo.teacher_rows` teacher rows per group, real only in guided groups
                               (on-policy accuracy <= `onepo.max_accuracy`) and while alpha(t) > 0, each with
                               loss weight alpha(t): the traced step input `rows/teacher`, a linear schedule
                               alpha0 -> 0 over `onepo.anneal_steps` (or the `rl.schedules` entry of that
                               name), so the step never recompiles for it; the others are padding rows. The teacher: `onepo.teacher = "demonstration"` (the task's
                               scripted solution) or a role of `config.models` whose samples answer the
                               prompt (same tokenizer as the policy).
  advantage `mixed_group`      group advantages over the union of policy and teacher rows (`onepo.
                               teacher_in_baseline`: whether teacher rows enter the baseline)
  loss term `shaped_offpolicy` `-A p/(p+gamma)` on teacher rows; with `rl.surrogate_rows = ("policy",)` the
                               clipped surrogate then trains policy rows only

A recipe: `rl.augment=onepo rl.advantage=mixed_group rl.loss_terms.shaped_offpolicy=1.0
rl.surrogate_rows=("policy",)`. With `onepo.anneal_steps = 0` the augmenter adds no rows at all (it declares
0 extra rows), so the run is plain GRPO exactly.
"""
from __future__ import annotations

import dataclasses
from typing import Callable

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.core.sections import RL_SECTIONS, Section
from rlkit.core.types import ROW_SOURCE, Metric, Rollout
from rlkit.objectives.loss_terms import LOSS_TERMS
from rlkit.objectives import group_advantages
from rlkit.objectives.onepo import mixed_group_advantages, shaped_offpolicy_loss
from rlkit.optim.schedules import make_schedule
from rlkit.rewards import RewardOutput
from rlkit.rollout.sampler import generate
from rlkit.train.phases.advantages import TOKEN_ESTIMATORS, TokenEstimator
from rlkit.train.phases.augment import AUGMENTERS, AugmentEnv, Augmenter, AugmenterSpec, interleave_groups
from rlkit.train.phases.augment import response_rows
from rlkit.train.phases.collect import Samples, sampling_config
from rlkit.train.phases.reward import compute_rewards


def onepo_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.teacher = "demonstration"   # the teacher: "demonstration" (the task's solution) or a config.models role
  c.teacher_rows = 1            # teacher rows per guided group (M)
  c.alpha0 = 1.0                # teacher rows' loss weight at step 0
  c.anneal_steps = 0            # weight alpha0 * (1 - t / anneal_steps), 0 after; 0: no guidance (plain GRPO)
  c.max_accuracy = 0.0          # a group is guided if its on-policy accuracy is at most this (0: all-fail only)
  c.teacher_in_baseline = True  # mixed_group: teacher rows in the baseline mean (LUFFY) or policy rows only
  c.gamma = 0.1                 # shaped_offpolicy: f(p) = p / (p + gamma) on teacher tokens (LUFFY's 0.1)
  return c


def _extra_rows(cfg) -> int:
  return cfg.onepo.teacher_rows if cfg.onepo.anneal_steps > 0 else 0


def _schedules(cfg) -> dict:
  """alpha(t) = alpha0 max(0, 1 - t / anneal_steps), the teacher rows' weight: a linear schedule of the step
  input `rows/teacher` (none without guidance)."""
  o = cfg.onepo
  if not _extra_rows(cfg):
    return {}
  return {"rows/teacher": {"kind": "linear", "start": o.alpha0, "end": 0.0, "steps": o.anneal_steps}}


def teacher_weight(cfg) -> Callable[[int], float]:
  """alpha(t): the `rl.schedules` entry `rows/teacher` if the config sets one, else OnePO's anneal."""
  spec = cfg.schedules.get("rows/teacher") or _schedules(cfg).get("rows/teacher")
  return make_schedule(spec) if spec else (lambda step: 0.0)


def _group_accuracy(rewards: RewardOutput, group_size: int) -> np.ndarray:
  correct = rewards.correct if rewards.correct is not None else rewards.rewards > 0
  return np.asarray(correct, np.float64).reshape(-1, group_size).mean(1)


def _demonstration_teacher(cfg, env: AugmentEnv):
  tok, width = env.tokenizer, cfg.max_new_tokens

  def respond(base: Samples, key) -> tuple[np.ndarray, np.ndarray]:
    del key
    return response_rows(tok, [e["demonstration"] for e in base.examples], width, tok.pad_id)
  return respond


def _model_teacher(cfg, env: AugmentEnv):
  o = cfg.onepo
  teacher = env.models.get(o.teacher)
  if teacher is None:
    raise ValueError(f"rl.onepo.teacher={o.teacher!r} is neither 'demonstration' nor a role of config.models "
                     f"(roles: {', '.join(env.models) or 'none'}).")
  if teacher.module.cfg.vocab_size != env.tokenizer.vocab_size:
    raise ValueError(f"rl.onepo.teacher={o.teacher!r} has a vocabulary of {teacher.module.cfg.vocab_size}, the "
                     f"policy's tokenizer {env.tokenizer.vocab_size}: teacher rows are trained as the policy's "
                     "tokens, so the teacher needs the policy's tokenizer.")
  sampling = sampling_config(cfg, env.tokenizer)

  def respond(base: Samples, key) -> tuple[np.ndarray, np.ndarray]:
    ro = base.rollout
    out = generate(teacher.module, teacher.params, ro.prompt, ro.prompt_mask, key, sampling)
    return np.asarray(jax.device_get(out.response)), np.asarray(jax.device_get(out.response_mask))
  return respond


# onepo.teacher -> the builder of `respond(base, key) -> ([n, R] response tokens, mask)`; any other value names
# a config.models role, answered by that model's samples.
TEACHERS = {"demonstration": _demonstration_teacher}


def onepo_augmenter(cfg, env: AugmentEnv) -> Augmenter:
  group, m, o = cfg.group_size, _extra_rows(cfg), cfg.onepo
  if m == 0:
    return Augmenter(0)
  respond = TEACHERS.get(o.teacher, _model_teacher)(cfg, env)
  tok, weight = env.tokenizer, teacher_weight(cfg)

  def add(samples: Samples, rewards: RewardOutput, key, step):
    alpha = weight(step)
    guided = (_group_accuracy(rewards, group) <= o.max_accuracy) & (alpha > 0)        # [groups]
    rows = np.repeat(np.arange(0, len(samples), group), m)                           # M per group
    base = samples.take(rows)
    response, mask = respond(base, key)
    live = np.repeat(guided, m)
    mask = mask & live[:, None]
    lengths = mask.sum(1).astype(np.int32)
    finished = np.array([bool(k.any()) and int(r[k.sum() - 1]) in tok.stop_ids for r, k in zip(response, mask)])
    dev = env.put_batch({"response": response, "response_mask": mask, "lengths": lengths, "finished": finished})
    ro = base.rollout
    # Rows of unguided groups are padding rows: `valid` False (train_batch masks their attention too).
    rollout = Rollout(prompt=ro.prompt, prompt_mask=ro.prompt_mask, response=dev["response"],
                      response_mask=dev["response_mask"],
                      logprobs=jnp.zeros_like(dev["response"], jnp.float32),   # no behaviour log-probs needed
                      lengths=dev["lengths"], finished=dev["finished"], group_ids=ro.group_ids,
                      extras={k: jnp.zeros_like(v) for k, v in ro.extras.items()})
    source = np.where(live, ROW_SOURCE["teacher"], ROW_SOURCE["padding"]).astype(np.int32)
    # weighted alpha(t) in the step (the step input rows/teacher), not here
    extra = dataclasses.replace(base, rollout=rollout, row_source=source, valid=live, weight=None)
    extra_rewards = compute_rewards(env.reward_fn, extra, tok, cfg)
    return interleave_groups(samples, rewards, extra, extra_rewards, group, m)

  return Augmenter(m, add)


AUGMENTERS.add("onepo", AugmenterSpec(onepo_augmenter, _extra_rows, schedules=_schedules))


def _mixed_group(arrays, batch, cfg, capacity, valid):
  # The union baseline is GRPO over a group's valid rows: the `group` estimator itself, so a batch without
  # teacher rows (no guided group, or guidance over) gets exactly plain GRPO's advantages.
  rewards = arrays.rewards
  grpo = group_advantages("group", rewards, capacity, cfg.adv_eps, valid=valid)
  if not cfg.onepo.teacher_in_baseline:
    teacher = batch.row_source == ROW_SOURCE["teacher"]
    mixed = mixed_group_advantages(rewards, teacher, jnp.ones(teacher.shape, bool) if valid is None else valid,
                                   capacity, False, cfg.adv_eps)
    grpo = jnp.where(jnp.any(teacher), mixed, grpo)
  return jnp.broadcast_to(grpo[:, None], batch.loss_mask.shape), {}


TOKEN_ESTIMATORS.add("mixed_group", TokenEstimator(_mixed_group, needs_values=False))


@LOSS_TERMS.register("shaped_offpolicy")
def shaped_offpolicy_term(cfg):
  """`-A p/(p+gamma)` on teacher rows (rl.onepo.gamma), 0 elsewhere. Metrics (summed over micro-batches and
  update steps): `shaped/teacher_p_sum` (of p over teacher tokens) and `shaped/teacher_tokens`; their ratio is
  the policy's mean probability of the teacher's tokens."""
  gamma = cfg.onepo.gamma

  def term(logp, logits, batch, step_inputs):
    del logits, step_inputs
    mask = batch.loss_mask & (batch.row_source == ROW_SOURCE["teacher"])[:, None]
    loss = shaped_offpolicy_loss(logp, batch.advantages, mask, gamma)
    p_sum = jnp.sum(jnp.where(mask, jnp.exp(jnp.where(mask, logp, 0.0)), 0.0))
    return loss, {"shaped/teacher_p_sum": Metric(p_sum, "sum"),
                  "shaped/teacher_tokens": Metric(mask.sum().astype(jnp.float32), "sum")}
  return term


def check(stage, name: str) -> None:
  o = stage.onepo
  if not (o.teacher_rows >= 1 and o.anneal_steps >= 0 and o.alpha0 >= 0 and o.gamma > 0
          and 0 <= o.max_accuracy <= 1):
    raise ValueError(f"{name}.onepo={o.to_dict()!r} needs teacher_rows >= 1, anneal_steps >= 0, alpha0 >= 0, "
                     "gamma > 0, 0 <= max_accuracy <= 1.")


def _roles(stage, name: str) -> list[tuple[str, str]]:
  teacher = stage.onepo.teacher
  if stage.get("augment") != "onepo" or teacher == "demonstration":
    return []
  return [(teacher, f"{name}.onepo.teacher={teacher!r} is neither 'demonstration' nor a role of config.models")]


RL_SECTIONS.add("onepo", Section(onepo_defaults, check, _roles,
                                 doc="OnePO's guidance (augment=onepo, advantage=mixed_group, shaped_offpolicy)"))
