"""The `graft` stage (OUR DESIGN, methods/llm.md §8; the maths: `rlkit.objectives.graft`): the stage's policy
A and a peer B (a trainable `config.models` role, e.g. another size or pre-training) train side by side on
the same prompts, each an `rl_stage.Learner` with the stage's RL settings, and trade successes.

Per iteration: both sample their groups; for every group A fails entirely and B solves at least once, up
to `graft.rows` of B's successful rows join A's group as `peer` rows (the others are padding rows), and
with `graft.both` the same from A to B; each learner then scores (its own old log-probs of the foreign
rows), corrects its own rows, computes advantages over the augmented groups, and the `graft` scorer (run
after the advantages) weighs the peer rows (truncated ratio, geometric rejection, positive-only) before the
update.

State: A's slice at the top level (`train`, ...), B's under `peer`. Metrics: A's as in the `rl` stage, B's
prefixed `peer/` (its evaluation too, at A's evaluation steps), and `graft/...` per direction:
groups_rescued, rows (grafted rows), rows_kept, tokens_kept, tokens_rejected. `graft.rows = 0` is the
independent baseline: nothing is exchanged, and groups_rescued counts the groups that would have been.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from rlkit.core.types import ROW_SOURCE
from rlkit.objectives.graft import graft_weights, rescue
from rlkit.parallel.hosts import host_rows, process_sum
from rlkit.rewards import REWARDS, RewardOutput, take
from rlkit.train import rl_stage
from rlkit.core.errors import ConfigError
from rlkit.train.rl_config import rl_defaults
from rlkit.train.phases.augment import Augmenter, interleave_groups
from rlkit.train.phases.score import SCORERS, Scorer, ScorerSpec
from rlkit.train.rl_metrics import policy_metrics
from rlkit.train.stages import Stage, eval_metrics, loop, register_stage


def graft_defaults() -> ml_collections.ConfigDict:
  c = rl_defaults()
  c.kind = "graft"              # stage kind (registry STAGES)
  c.graft = ml_collections.ConfigDict()   # the exchange between the policy and its peer
  c.graft.peer = "peer"         # the config.models role trained beside the policy (trainable=True)
  c.graft.rows = 2              # at most this many of the peer's successes join a group the policy fails
                                # (0: no exchange, the two train side by side: the independent baseline)
  c.graft.both = True           # also graft the policy's successes into the peer's all-fail groups
  c.graft.cap = 2.0             # truncation of the foreign token ratio pi_self / pi_peer (0: no weights)
  c.graft.geo_low = 0.5         # reject a foreign row whose geometric-mean ratio is below this
  c.graft.geo_high = 2.0        # ... or above this (0: no rejection)
  c.graft.positive_only = True  # train on foreign rows only where their advantage is > 0
  return c


def _correct(rewards: RewardOutput) -> np.ndarray:
  return np.asarray(rewards.rewards > 0 if rewards.correct is None else rewards.correct, bool)


def graft_rows(own, own_rewards, peer, peer_rewards, group: int, k: int):
  """`own` groups with up to k of `peer`'s successes appended to each all-fail group (padding rows
  elsewhere). Returns (samples, rewards, groups rescued); k = 0 leaves `own` as it is and counts the groups
  that would have been rescued."""
  if k == 0:
    own_ok, peer_ok = (_correct(r).reshape(-1, group) for r in (own_rewards, peer_rewards))
    return own, own_rewards, int((~own_ok.any(1) & peer_ok.any(1)).sum())
  chosen = rescue(_correct(own_rewards), _correct(peer_rewards), group, k).reshape(-1)     # [groups * k]
  live = chosen >= 0
  rows = np.where(live, chosen, 0)
  extra = peer.take(rows)
  ro = dataclasses.replace(extra.rollout, extras={k_: jnp.zeros((len(rows),) + v.shape[1:], v.dtype)
                                                  for k_, v in own.rollout.extras.items()})
  extra = dataclasses.replace(extra, rollout=ro, row_source=np.where(live, ROW_SOURCE["peer"], ROW_SOURCE["padding"])
                              .astype(np.int32), valid=live, weight=None)
  extra_rewards = dataclasses.replace(take(peer_rewards, rows), failures={})   # counted by the peer already
  samples, rewards = interleave_groups(own, own_rewards, extra, extra_rewards, group, k)
  return samples, rewards, int(np.any(live.reshape(-1, k), axis=1).sum())


def graft_scorer(env) -> Optional[Scorer]:
  """The `graft` scorer (registry SCORERS, after the advantages) of a graft stage's learners: weighs each
  learner's peer rows (see the module docstring); absent in stages without a `graft` section."""
  if "graft" not in env.cfg:
    return None
  g = env.cfg.graft

  def refine(state, batch, samples):
    del state, samples
    peer = batch.row_source == ROW_SOURCE["peer"]
    mask = batch.loss_mask & peer[:, None]
    w, keep = graft_weights(batch.old_logp, batch.rollout_logp, mask, g.cap, g.geo_low, g.geo_high)
    if g.positive_only:
      keep = keep & (jnp.max(jnp.where(mask, batch.advantages, -jnp.inf), axis=-1) > 0)
    kept = mask & keep[:, None]
    weights = jnp.where(mask, w, batch.token_weights)
    sums = process_sum([host_rows(peer & mask.any(-1)).sum(), host_rows(keep & peer).sum(),
                        host_rows(kept).sum(), host_rows(mask & ~kept).sum()])
    metrics = dict(zip(("graft/rows", "graft/rows_kept", "graft/tokens_kept", "graft/tokens_rejected"),
                       (float(x) for x in sums)))
    return batch.replace(token_weights=weights, loss_mask=jnp.where(peer[:, None], kept, batch.loss_mask)), metrics
  return Scorer(refine)


SCORERS.add("graft", ScorerSpec(graft_scorer, when="advantages"))


def _init(ctx, cfg, params):
  peer = ctx.models[cfg.graft.peer]
  if peer.module.cfg.vocab_size != ctx.model.cfg.vocab_size:
    raise ConfigError(f"models.{cfg.graft.peer} has a vocabulary of {peer.module.cfg.vocab_size}, the policy "
                      f"{ctx.model.cfg.vocab_size}: grafted rows are the other model's tokens, so both need one "
                      "tokenizer.")
  state = rl_stage.init_policy_state(ctx, cfg, params)
  state["peer"] = rl_stage.init_policy_state(ctx, cfg, jax.tree.map(jnp.copy, peer.params), peer.module,
                                             own_reference=True)
  return state


def _run(ctx, cfg, state, start: int, meta: dict):
  peer = ctx.models[cfg.graft.peer]
  group, k = cfg.group_size, cfg.graft.rows
  executor = rl_stage.reward_executor(cfg)
  try:
    reward_fn = REWARDS.get(cfg.reward.name)(ctx.task, executor, models=ctx.models, **dict(cfg.reward.kwargs))
    learners = {"": rl_stage.Learner(ctx, cfg, state, reward_fn, augmenter=Augmenter(0)),
                "peer/": rl_stage.Learner(ctx, cfg, state["peer"], reward_fn, model=peer.module,
                                          augmenter=Augmenter(0))}

    def iteration(state, batch, key, iterator, step):
      slices = {"": learners[""].ready(state), "peer/": learners["peer/"].ready(state["peer"])}
      drawn = {p: learners[p].sample(slices[p], batch, jax.random.fold_in(key, i), iterator)
               for i, p in enumerate(learners)}
      metrics = {}
      for prefix, (samples, rewards, _, _) in drawn.items():
        metrics.update({prefix + name: v for name, v in
                        policy_metrics(rewards, host_rows(samples.rollout.lengths), group).items()})
      new, flags = {}, None
      for i, (prefix, other) in enumerate((("", "peer/"), ("peer/", ""))):
        samples, rewards = drawn[prefix][:2]
        capacity, rescued = group, 0
        if prefix == "" or cfg.graft.both:
          samples, rewards, rescued = graft_rows(samples, rewards, *drawn[other][:2], group, k)
          capacity = group + k
        own = {name: v for name, v in slices[prefix].items() if name != "peer"}
        new[prefix], learned, skipped, _ = learners[prefix].learn(own, samples, rewards, capacity,
                                                                  jax.random.fold_in(key, 10 + i), step)
        learned["graft/groups_rescued"] = float(process_sum([rescued])[0])
        metrics.update({prefix + name: v for name, v in learned.items()})
        flags = skipped if flags is None else flags       # the policy's updates drive the non-finite guard
      last = step + 1 == cfg.steps
      if last or (cfg.eval_every and (step + 1) % cfg.eval_every == 0):
        gstep = meta["offset"] + step + 1
        metrics.update({"peer/" + name: v for name, v in eval_metrics(
            ctx, new["peer/"]["train"].params, gstep, meta["stage_index"], peer.module).items()})
      return dict(new[""], peer=new["peer/"]), metrics, flags

    return loop(ctx, cfg, state, start, meta, rl_stage.stage_iterator(ctx, cfg, meta), iteration, rl_stage.SHOW)
  finally:
    executor.close()


def validate(section, name: str) -> None:
  rl_stage.validate(section, name)
  g = section.graft
  if section.augment != "none" or section.filter != "none":
    raise ConfigError(f"{name}: the graft stage's groups are its own sampling plus the peer's rows; set "
                      f"{name}.augment='none' and {name}.filter='none' (got {section.augment!r}, {section.filter!r}).")
  if g.rows < 0 or g.cap < 0 or g.geo_high < 0 or (g.geo_high > 0 and not 0 <= g.geo_low <= g.geo_high):
    raise ConfigError(f"{name}.graft needs rows >= 0, cap >= 0 (0: no weights) and 0 <= geo_low <= geo_high "
                      f"(geo_high 0: no rejection); got rows={g.rows}, cap={g.cap}, geo_low={g.geo_low}, "
                      f"geo_high={g.geo_high}.")
  rows = section.prompts_per_step * (section.group_size + g.rows)
  parts = section.minibatches * section.micro_batches
  if rows % parts:
    raise ConfigError(f"{name}: the {rows} rows of an iteration (prompts_per_step x (group_size + graft.rows)) "
                      f"must divide into minibatches x micro_batches = {parts} equal parts.")


register_stage("graft", Stage(_init, _run, graft_defaults, validate, roles=lambda section: (section.graft.peer,)))
