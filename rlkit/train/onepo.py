"""OnePO in the trainer (the maths: `rlkit.objectives.onepo`): the augmenter `onepo`, whose rule
`rl.onepo.rule` (registry `RULES`) says how a teacher's answers enter a group, two loss terms, one advantage
estimator and one config section, `rl.onepo`.

  rule `guidance` (OUR DESIGN, methods/llm.md §7): up to `onepo.teacher_rows` teacher rows join each guided
                  group (on-policy accuracy <= `onepo.max_accuracy`) while alpha(t) > 0, each with loss weight
                  alpha(t): the traced step input `rows/teacher`, a linear schedule alpha0 -> 0 over
                  `onepo.anneal_steps` (or the `rl.schedules` entry of that name), so the step never recompiles
                  for it; the group's other added rows are padding rows.
  rule `huatuo`   (HuatuoGPT-3's RELEASED RULE, methods/primary-sources.md): the teacher's response replaces one
                  uniformly chosen rollout of a group, only where its reward is strictly above every student
                  reward there; groups keep their size. The teacher is offered to the groups while the
                  retirement schedule `onepo.retire` allows over `onepo.anneal_steps` (`cutoff`: every group
                  before step T, none after, the release's teacher_max_steps; `linear`: a share 1 - t/T of the
                  groups, ours). Teacher rows keep weight 1.

  The teacher of either rule: `onepo.teacher = "demonstration"` (the task's scripted solution) or a role of
  `config.models` whose samples answer the prompt (same tokenizer as the policy).

  advantage `mixed_group`       group advantages over the union of policy and teacher rows (`onepo.
                                teacher_in_baseline`: whether teacher rows enter the baseline)
  loss term `shaped_offpolicy`  ours: `-A p/(p+gamma)` on teacher rows
  loss term `floored_teacher`   the release's: the clipped surrogate on teacher rows with the ratio's
                                denominator floored at `onepo.floor` (and the positive-advantage rescale)

With either loss term, `rl.surrogate_rows = ("policy",)` makes the clipped surrogate train policy rows only, so
teacher rows are trained by their term alone. Recipes:

  ours      rl.augment=onepo rl.advantage=mixed_group rl.loss_terms.shaped_offpolicy=1.0 rl.surrogate_rows=("policy",)
  released  rl.augment=onepo rl.onepo.rule=huatuo rl.advantage=group rl.loss_terms.floored_teacher=1.0
            rl.surrogate_rows=("policy",)

With `onepo.anneal_steps = 0` the augmenter adds and replaces nothing (ours declares 0 extra rows), so the run
is plain GRPO exactly.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.core.registry import Registry
from rlkit.core.sections import RL_SECTIONS, Section
from rlkit.core.types import ROW_SOURCE, Metric, Rollout
from rlkit.objectives.loss_terms import LOSS_TERMS
from rlkit.objectives import group_advantages
from rlkit.objectives.onepo import (RETIREMENTS, floored_teacher_loss, frontier, mixed_group_advantages,
                                    replacement_order, shaped_offpolicy_loss)
from rlkit.optim.schedules import make_schedule
from rlkit.rewards import RewardOutput, concat_outputs, take
from rlkit.rollout.sampler import generate
from rlkit.train.phases.advantages import TOKEN_ESTIMATORS, TokenEstimator
from rlkit.train.phases.augment import AUGMENTERS, AugmentEnv, Augmenter, AugmenterSpec, interleave_groups
from rlkit.train.phases.augment import response_rows
from rlkit.train.phases.collect import Samples, sampling_config
from rlkit.train.phases.reward import compute_rewards


def onepo_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.rule = "guidance"           # how the teacher enters (registry RULES): guidance (our design) | huatuo (the release)
  c.teacher = "demonstration"   # the teacher: "demonstration" (the task's solution) or a config.models role
  c.teacher_rows = 1            # guidance: teacher rows per guided group (M); huatuo: 1 (it replaces one rollout)
  c.alpha0 = 1.0                # guidance: teacher rows' loss weight at step 0
  c.anneal_steps = 0            # the teacher's horizon T: guidance's weight alpha0 * (1 - t / T), 0 after; huatuo's
                                # retirement (onepo.retire) over T; 0: no teacher at all (plain GRPO)
  c.max_accuracy = 0.0          # guidance: a group is guided if its on-policy accuracy is at most this (0: all-fail)
  c.teacher_in_baseline = True  # mixed_group: teacher rows in the baseline mean (LUFFY) or policy rows only
  c.gamma = 0.1                 # shaped_offpolicy: f(p) = p / (p + gamma) on teacher tokens (LUFFY's 0.1)
  c.retire = "cutoff"           # huatuo: the groups offered the teacher at step t < T: cutoff (all, the release's
                                # teacher_max_steps) | linear (a share 1 - t/T, ours); none from T on
  c.floor = 0.1                 # floored_teacher: teacher tokens' ratio pi / max(pi_old, floor) (the release's 0.1)
  return c


def teacher_weight(cfg) -> Callable[[int], float]:
  """alpha(t): the `rl.schedules` entry `rows/teacher` if the config sets one, else the rule's (guidance: the
  anneal; huatuo: none, so 0 here and weight 1 in the step)."""
  spec = cfg.schedules.get("rows/teacher") or _schedules(cfg).get("rows/teacher")
  return make_schedule(spec) if spec else (lambda step: 0.0)


def _group_accuracy(rewards: RewardOutput, group_size: int) -> np.ndarray:
  correct = rewards.correct if rewards.correct is not None else rewards.rewards > 0
  return np.asarray(correct, np.float64).reshape(-1, group_size).mean(1)


# ------------------------------------------------------------------------------------------------ teachers

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


def teacher_rows(cfg, env: AugmentEnv, base: Samples, response: np.ndarray, mask: np.ndarray,
                 live: np.ndarray) -> tuple[Samples, RewardOutput]:
  """`teacher` rows answering `base`'s prompts with `response`, scored by the stage's reward; rows not `live`
  are padding rows (`valid` False, masks False). Not sampled, so no behaviour log-probs (zeros)."""
  tok = env.tokenizer
  mask = mask & live[:, None]
  lengths = mask.sum(1).astype(np.int32)
  finished = np.array([bool(k.any()) and int(r[k.sum() - 1]) in tok.stop_ids for r, k in zip(response, mask)])
  dev = env.put_batch({"response": response, "response_mask": mask, "lengths": lengths, "finished": finished})
  ro = base.rollout
  rollout = Rollout(prompt=ro.prompt, prompt_mask=ro.prompt_mask, response=dev["response"],
                    response_mask=dev["response_mask"], logprobs=jnp.zeros_like(dev["response"], jnp.float32),
                    lengths=dev["lengths"], finished=dev["finished"], group_ids=ro.group_ids,
                    extras={k: jnp.zeros_like(v) for k, v in ro.extras.items()})
  source = np.where(live, ROW_SOURCE["teacher"], ROW_SOURCE["padding"]).astype(np.int32)
  rows = dataclasses.replace(base, rollout=rollout, row_source=source, valid=np.asarray(live, bool), weight=None)
  return rows, compute_rewards(env.reward_fn, rows, tok, cfg)


# ------------------------------------------------------------------------------------------------ the rules

class Rule(NamedTuple):
  """One way a teacher's answers enter the groups (`onepo.rule`).

  make: (stage section, AugmentEnv, respond) -> `add(samples, rewards, key, step) -> (samples, rewards)`.
  extra_rows: (stage section) -> rows it adds to each group (static); 0 for a rule that replaces rows.
  schedules: (stage section) -> default `rl.schedules` entries its rows' weights follow.
  check: (stage section, its name) -> None; ValueError naming the key and the fix.
  """
  make: Callable
  extra_rows: Callable
  schedules: Callable
  check: Callable


RULES: Registry[Rule] = Registry("onepo rule")


def _guidance_rows(cfg) -> int:
  return cfg.onepo.teacher_rows if cfg.onepo.anneal_steps > 0 else 0


def _guidance_schedules(cfg) -> dict:
  """alpha(t) = alpha0 max(0, 1 - t / anneal_steps), the teacher rows' weight: a linear schedule of the step
  input `rows/teacher` (none without guidance)."""
  o = cfg.onepo
  if not _guidance_rows(cfg):
    return {}
  return {"rows/teacher": {"kind": "linear", "start": o.alpha0, "end": 0.0, "steps": o.anneal_steps}}


def _guidance(cfg, env: AugmentEnv, respond):
  group, m, o = cfg.group_size, cfg.onepo.teacher_rows, cfg.onepo
  weight = teacher_weight(cfg)

  def add(samples: Samples, rewards: RewardOutput, key, step):
    guided = (_group_accuracy(rewards, group) <= o.max_accuracy) & (weight(step) > 0)      # [groups]
    base = samples.take(np.repeat(np.arange(0, len(samples), group), m))               # M per group
    response, mask = respond(base, key)
    # weighted alpha(t) in the step (the step input rows/teacher), not here
    extra, extra_rewards = teacher_rows(cfg, env, base, response, mask, np.repeat(guided, m))
    return interleave_groups(samples, rewards, extra, extra_rewards, group, m)
  return add


def _check_guidance(stage, name: str) -> None:
  del stage, name


def offered_groups(key, num_groups: int, share: float) -> np.ndarray:
  """[num_groups] bool: a random subset of floor(share * n + u) groups, u ~ U[0, 1) (so share * n on average,
  every group when share is 1, none when 0), drawn from `key`."""
  k_count, k_perm = jax.random.split(key)
  count = int(math.floor(share * num_groups + float(jax.random.uniform(k_count))))
  offered = np.zeros(num_groups, bool)
  offered[np.asarray(jax.random.permutation(k_perm, num_groups))[:count]] = True
  return offered


def _huatuo(cfg, env: AugmentEnv, respond):
  group, o = cfg.group_size, cfg.onepo
  retire = RETIREMENTS.get(o.retire)

  def add(samples: Samples, rewards: RewardOutput, key, step):
    k_offer, k_teacher, k_pick = jax.random.split(key, 3)
    offered = offered_groups(k_offer, len(samples) // group, retire(step, o.anneal_steps))
    if not offered.any():                  # retired: no teacher call at all
      return samples, rewards
    base = samples.take(np.arange(0, len(samples), group))                             # one per group
    response, mask = respond(base, k_teacher)
    extra, extra_rewards = teacher_rows(cfg, env, base, response, mask, offered)
    replace = frontier(extra_rewards.rewards, np.asarray(rewards.rewards).reshape(-1, group), offered)
    pick = np.asarray(jax.random.randint(k_pick, (len(base),), 0, group))
    order = replacement_order(len(samples), group, replace, pick)
    return Samples.concat([samples, extra]).take(order), take(concat_outputs([rewards, extra_rewards]), order)
  return add


def _check_huatuo(stage, name: str) -> None:
  o = stage.onepo
  if o.teacher_rows != 1:
    raise ValueError(f"{name}.onepo.teacher_rows={o.teacher_rows} with {name}.onepo.rule='huatuo': the released "
                     f"rule replaces at most one rollout per prompt; set {name}.onepo.teacher_rows=1.")


RULES.add("guidance", Rule(_guidance, _guidance_rows, _guidance_schedules, _check_guidance))
RULES.add("huatuo", Rule(_huatuo, lambda cfg: 0, lambda cfg: {}, _check_huatuo))


def _extra_rows(cfg) -> int:
  return RULES.get(cfg.onepo.rule).extra_rows(cfg)


def _schedules(cfg) -> dict:
  return RULES.get(cfg.onepo.rule).schedules(cfg)


def onepo_augmenter(cfg, env: AugmentEnv) -> Augmenter:
  o = cfg.onepo
  if o.anneal_steps <= 0:
    return Augmenter(_extra_rows(cfg))
  respond = TEACHERS.get(o.teacher, _model_teacher)(cfg, env)
  return Augmenter(_extra_rows(cfg), RULES.get(o.rule).make(cfg, env, respond))


AUGMENTERS.add("onepo", AugmenterSpec(onepo_augmenter, _extra_rows, schedules=_schedules))


# ------------------------------------------------------------------------------ advantages and loss terms

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


def _teacher_mask(batch):
  return batch.loss_mask & (batch.row_source == ROW_SOURCE["teacher"])[:, None]


def _teacher_counts(prefix: str, logp, mask) -> dict:
  """Sums over micro-batches and update steps: teacher tokens, the rows holding them, and p over them (its
  ratio to the tokens is the policy's mean probability of the teacher's tokens)."""
  p_sum = jnp.sum(jnp.where(mask, jnp.exp(jnp.where(mask, logp, 0.0)), 0.0))
  return {f"{prefix}/teacher_p_sum": Metric(p_sum, "sum"),
          f"{prefix}/teacher_tokens": Metric(mask.sum().astype(jnp.float32), "sum"),
          f"{prefix}/teacher_rows": Metric(mask.any(1).sum().astype(jnp.float32), "sum")}


@LOSS_TERMS.register("shaped_offpolicy")
def shaped_offpolicy_term(cfg):
  """`-A p/(p+gamma)` on teacher rows (rl.onepo.gamma), 0 elsewhere. Metrics: `shaped/teacher_p_sum`,
  `shaped/teacher_tokens`, `shaped/teacher_rows` (`_teacher_counts`)."""
  gamma = cfg.onepo.gamma

  def term(logp, logits, batch, step_inputs):
    del logits, step_inputs
    mask = _teacher_mask(batch)
    return shaped_offpolicy_loss(logp, batch.advantages, mask, gamma), _teacher_counts("shaped", logp, mask)
  return term


@LOSS_TERMS.register("floored_teacher")
def floored_teacher_term(cfg):
  """The release's teacher-token surrogate (`floored_teacher_loss`: floor rl.onepo.floor, the stage's clip
  ranges and dual clip) on teacher rows, 0 elsewhere. Metrics: `floored/teacher_p_sum`, `floored/teacher_tokens`,
  `floored/teacher_rows` (`_teacher_counts`) and `floored/low_support_tokens` (pi_old < floor), sums."""
  clip = dict(floor=cfg.onepo.floor, eps_low=cfg.eps_low, eps_high=cfg.eps_high, dual_clip=cfg.dual_clip or None)

  def term(logp, logits, batch, step_inputs):
    del logits, step_inputs
    mask = _teacher_mask(batch)
    loss, m = floored_teacher_loss(logp, batch.old_logp, batch.advantages, mask, **clip)
    low = m["low_support_frac"] * jnp.maximum(mask.sum(), 1)
    return loss, {**_teacher_counts("floored", logp, mask), "floored/low_support_tokens": Metric(low, "sum")}
  return term


# ------------------------------------------------------------------------------------------- config section

def check(stage, name: str) -> None:
  o = stage.onepo
  RULES.check(o.rule, f"{name}.onepo.rule")
  RETIREMENTS.check(o.retire, f"{name}.onepo.retire")
  if not (o.teacher_rows >= 1 and o.anneal_steps >= 0 and o.alpha0 >= 0 and o.gamma > 0
          and 0 <= o.max_accuracy <= 1 and 0 < o.floor < 1):
    raise ValueError(f"{name}.onepo={o.to_dict()!r} needs teacher_rows >= 1, anneal_steps >= 0, alpha0 >= 0, "
                     "gamma > 0, 0 <= max_accuracy <= 1, 0 < floor < 1.")
  RULES.get(o.rule).check(stage, name)


def _roles(stage, name: str) -> list[tuple[str, str]]:
  teacher = stage.onepo.teacher
  if stage.get("augment") != "onepo" or teacher == "demonstration":
    return []
  return [(teacher, f"{name}.onepo.teacher={teacher!r} is neither 'demonstration' nor a role of config.models")]


RL_SECTIONS.add("onepo", Section(onepo_defaults, check, _roles,
                                 doc="OnePO's teacher (augment=onepo; rule guidance: advantage=mixed_group, "
                                     "shaped_offpolicy; rule huatuo: floored_teacher)"))
