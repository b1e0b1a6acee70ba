"""The `gen_rl` stage: online RL of a conditional flow generator on a reward of GEN_REWARDS
(rlkit/diffusion/gen_rewards.py) by a method of GEN_METHODS (rlkit/diffusion/gen_methods.py: flow_grpo | dance_grpo
| nft | draft; rlkit/diffusion/gen_art.py: art), methods/embodied.md §1.

It starts from the preceding stage's generator (a `gen_pretrain` stage with the same data, toy2d and flow
fields), else from the one saved at `expert_path` (a gen_pretrain run's workdir or checkpoint), else a fresh one;
that start is the frozen reference theta_ref. One iteration (stage step t, key fold_in(stage key, t)):
  1. prompts: `prompts` conditions, the first of a random permutation of the C conditions (cycled past C);
  2. the method's iteration: it samples `group_size` rows per prompt, scores them and updates (its own fields);
  3. log: reward (the mean over the iteration's samples), the reward's reports (toy2d: true_reward, the reward
     without its hackable term), nfe (the cumulative network evaluations of training, forward-equivalents with a
     backward counting 2: the methods' common x-axis), the method's metrics, and where the reward's optimum is
     known (toy2d) opt_mmd: the mean over conditions of the squared MMD between `monitor_samples` Euler samples
     per condition from fixed noise and draws of the exact KL-regularised optimum p* ∝ p exp(r_true / beta) (a
     measurement: not counted in nfe).
Evaluation (every `eval_every`, and at the end): `eval_samples` Euler samples (`sample_steps`) per condition from
fixed evaluation noise: eval/reward (and the reports, eval/opt_mmd) and the dataset's quality (eval/mmd to the
data, eval/class_accuracy).

State: {"train": theta's TrainState, "ref": theta_ref, "nfe": int32, "method": the method's own, when it has any};
all of it checkpointed, so a resumed stage continues exactly as an uninterrupted one.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import ml_collections

from rlkit.core.errors import ConfigError
from rlkit.core.registry import choice
from rlkit.diffusion.gen_art import art_defaults   # (its import registers `art`)
from rlkit.diffusion.gen_methods import (GEN_METHODS, GenSetup, copy_tree, dance_defaults, draft_defaults,
                                         grpo_defaults, nft_defaults)
from rlkit.diffusion.gen_pretrain_stage import (check_gen_fields, condition_samples, dataset, eval_key, flow_config,
                                                gen_fields)
from rlkit.diffusion.gen_rewards import GEN_REWARDS, GenReward
from rlkit.diffusion.sample_distance import mean_mmd2
from rlkit.embodied.bc_stage import StepIterator
from rlkit.embodied.expert_source import saved_expert
from rlkit.models.flow import init_flow
from rlkit.optim.optimizers import gradient_path, make_optimizer
from rlkit.train.config import optimizer_defaults
from rlkit.train.stages import Stage, loop, register_stage
from rlkit.train.steps import init_train_state


def method_sections() -> dict:
  """{section name: defaults} of every registered method (methods share a section by its name)."""
  return {name: f for m in GEN_METHODS.names() for name, f in GEN_METHODS.get(m).sections.items()}


def gen_rl_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "gen_rl"             # stage kind (registry STAGES)
  c.steps = 200                 # iterations (prompts, the method's sample-score-update)
  gen_fields(c)                 # data, toy2d, flow: the preceding gen_pretrain stage's; sample_steps, eval_samples
  c.expert_path = ""            # a run's first stage starts from the generator saved here (a gen_pretrain workdir,
                                # its checkpoints or one checkpoints/<step>), not a fresh one
  c.reward = ml_collections.ConfigDict()
  c.reward.name = "toy2d"       # registry GEN_REWARDS: toy2d | digit_confidence | ink
  c.reward.gamma = 0.0          # toy2d: weight of the hackable term gamma * x[0] (true_reward leaves it out)
  c.reward.beta = 1.0           # toy2d: the KL weight of the optimum p* ∝ p exp(r_true / beta) opt_mmd measures to
  c.method = "art"              # registry GEN_METHODS: flow_grpo | dance_grpo | nft | draft | art
  c.prompts = 8                 # conditions per iteration
  c.group_size = 8              # samples per condition (the group of group-relative advantages)
  c.rollout_steps = 10          # denoising steps of the training samples (Flow-GRPO's "denoising reduction": may
                                # be fewer than sample_steps, the evaluation's)
  c.grpo = grpo_defaults()      # flow_grpo and dance_grpo: the SDE, the clip, the update passes
  c.dance = dance_defaults()    # dance_grpo's own: its constant noise, the share of steps trained
  c.nft = nft_defaults()        # nft: the implicit policies, the draws, theta_old's decay
  c.draft = draft_defaults()    # draft: the steps the gradient runs through
  c.art = art_defaults()        # art (our design): the directions, theta_old, drift and restoration
  for name, defaults in method_sections().items():
    if name not in c:           # the sections of a method registered elsewhere (GenMethod.sections)
      c[name] = defaults()
  c.monitor_samples = 64        # toy2d: samples per condition of each iteration's opt_mmd (0: off)
  c.eval_every = 0              # evaluate every N iterations (0: only at the end of the stage)
  c.max_skipped_updates = 10    # stop after this many update steps in a row with a non-finite loss/grad (0: never)
  c.optimizer = optimizer_defaults()
  c.optimizer.lr = 3e-4
  return c


def validate(section, name: str) -> None:
  check_gen_fields(section, name)
  choice(section.method, GEN_METHODS, f"{name}.method")
  choice(section.reward.name, GEN_REWARDS, f"{name}.reward.name")
  spec = GEN_REWARDS.get(section.reward.name)
  if section.data not in spec.data:
    raise ConfigError(f"{name}.reward.name={section.reward.name!r} scores {' or '.join(spec.data)} samples, and "
                      f"{name}.data={section.data!r}; choose a reward of that data ("
                      f"{', '.join(r for r in GEN_REWARDS.names() if section.data in GEN_REWARDS.get(r).data)}).")
  for key in ("prompts", "group_size", "rollout_steps"):
    if section[key] < 1:
      raise ConfigError(f"{name}.{key}={section[key]} must be >= 1.")
  if section.reward.beta <= 0 or section.monitor_samples < 0:
    raise ConfigError(f"{name}: reward.beta > 0 and monitor_samples >= 0, got reward.beta={section.reward.beta}, "
                      f"monitor_samples={section.monitor_samples}.")
  GEN_METHODS.get(section.method).validate(section, name)


def reward_of(section) -> GenReward:
  return GEN_REWARDS.get(section.reward.name).build(section.reward, section)


def update_steps(section) -> int:
  return section.steps * GEN_METHODS.get(section.method).update_steps(section)


def _same_shapes(a, b) -> bool:
  return (jax.tree.structure(a) == jax.tree.structure(b)
          and all(x.shape == y.shape for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))))


def start_params(params, cfg, fresh):
  """The stage's starting generator: the preceding stage's (`params`), else the one at `cfg.expert_path`, else
  `fresh`; a clear error when the preceding params are not a generator of this section's shape."""
  if params is None:
    return saved_expert(cfg.expert_path, fresh) if cfg.expert_path else fresh
  if cfg.expert_path:
    raise ConfigError("expert_path is set on a gen_rl stage that follows another: it starts from the preceding "
                      "stage's generator; set expert_path only on a run's first stage.")
  if not _same_shapes(params, fresh):
    raise ConfigError("A gen_rl stage starts from the preceding stage's generator, but its parameters are not a "
                      "generator of this stage's data and flow fields: put a gen_pretrain stage with the same data, "
                      "toy2d and flow fields before it, or make gen_rl the run's first stage.")
  return params


def method_setup(cfg) -> tuple[GenSetup, GenReward]:
  """(what a method's build and init read, the reward) of a gen_rl section."""
  data = dataset(cfg)
  reward = reward_of(cfg)
  setup = GenSetup(section=cfg, flow=flow_config(cfg, data), conditions=data.conditions, score=reward.score,
                   tx=make_optimizer(cfg.optimizer, update_steps(cfg)), path=gradient_path(cfg.optimizer))
  return setup, reward


def _init(ctx, cfg, params):
  setup, _ = method_setup(cfg)
  key = jax.random.fold_in(ctx.key, 0x6E1)
  ref = start_params(params, cfg, init_flow(setup.flow, setup.conditions, key))
  own, nfe = GEN_METHODS.get(cfg.method).init(ref, setup, jax.random.fold_in(key, 1))
  state = {"train": init_train_state(copy_tree(ref), setup.tx, setup.path), "ref": ref, "nfe": jnp.int32(nfe)}
  return {**state, "method": own} if own else state


def prompt_ids(key, prompts: int, conditions: int):
  """The iteration's conditions: the first `prompts` of a random permutation (cycled when prompts > C)."""
  return jax.random.permutation(key, conditions)[jnp.arange(prompts) % conditions]


def _run(ctx, cfg, state, start: int, meta: dict):
  setup, reward = method_setup(cfg)
  method_iteration = GEN_METHODS.get(cfg.method).build(setup)
  reports = {name: jax.jit(fn) for name, fn in reward.reports.items()}
  monitor = reward.optimum is not None and cfg.monitor_samples > 0
  monitor_key = jax.random.fold_in(eval_key(ctx, meta["stage_index"]), 1)
  ctx.logger.say(f"stage {meta['stage']}: {cfg.method} on reward {cfg.reward.name} ({cfg.data}, {setup.conditions} "
                 f"conditions, {cfg.prompts} x {cfg.group_size} samples per iteration)")

  def iteration(state, _, key, iterator, step):
    k_prompts, k_method = jax.random.split(key)
    ids = prompt_ids(k_prompts, cfg.prompts, setup.conditions)
    state, out = method_iteration(state, ids, k_method)
    state = {**state, "nfe": state["nfe"] + jnp.int32(out.nfe)}
    x, rows = out.x.reshape(-1, setup.flow.action_dim), jnp.repeat(ids, cfg.group_size)
    metrics = {**out.metrics, "reward": float(jnp.mean(out.rewards)), "nfe": int(state["nfe"]),
               **{name: float(jnp.mean(fn(x, rows))) for name, fn in reports.items()}}
    if monitor:
      got = condition_samples(state["train"].params, setup.flow, setup.conditions, cfg.monitor_samples, monitor_key,
                              cfg.sample_steps)
      metrics["opt_mmd"] = mean_mmd2(got, reward.optimum)
    return state, metrics, out.skipped

  return loop(ctx, cfg, state, start, meta, StepIterator(), iteration, ("reward", "nfe"))


def evaluate(ctx, params, global_step: int, index: int, samples=None) -> dict:
  """Rewards (and the dataset's quality) of Euler samples from the stage's fixed evaluation noise."""
  cfg = ctx.config[ctx.config.stages[index]]
  data, reward = dataset(cfg), reward_of(cfg)
  x = condition_samples(params, flow_config(cfg, data), data.conditions, cfg.eval_samples, eval_key(ctx, index),
                        cfg.sample_steps)
  flat, rows = jnp.asarray(x.reshape(-1, data.dim)), jnp.repeat(jnp.arange(data.conditions), cfg.eval_samples)
  out = {"eval/reward": float(jnp.mean(reward.score(flat, rows)))}
  out.update({f"eval/{name}": float(jnp.mean(fn(flat, rows))) for name, fn in reward.reports.items()})
  if reward.optimum is not None:
    out["eval/opt_mmd"] = mean_mmd2(x, reward.optimum)
  out.update({f"eval/{k}": v for k, v in data.quality(x, ctx.config.seed).items()})
  return out


register_stage("gen_rl", Stage(_init, _run, gen_rl_defaults, validate, needs=(), evaluate=evaluate))
