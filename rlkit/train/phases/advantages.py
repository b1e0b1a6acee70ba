"""Phase 7, advantages: per-token advantages `[N, R]` of the scored batch (config `rl.advantage`).

Two kinds of estimator share the one config key:

  group estimators  `rlkit.objectives.ADVANTAGES` (group, batch, none, rloo): one number per row from its
                    group's rewards, broadcast over the row's response positions
  token estimators  `TOKEN_ESTIMATORS` below: read the scored `TrainBatch` (loss mask, segment ids, the
                    critic's values) and the whole reward output (`RewardArrays`: rewards, correct,
                    components, per-segment rewards) and give a number per token
                    gae                    PPO with a critic: GAE(gamma, lambda) on the outcome reward placed
                                           on each row's last token; returns go to extras["returns"] for the
                                           critic's loss; optional whitening over the batch (verl always)
                    reinforce_pp           REINFORCE++: discounted reward-to-go whitened over the batch
                    reinforce_pp_baseline  REINFORCE++-baseline: reward minus its group's mean, whitened over
                                           the batch's tokens

Groups are `capacity` contiguous rows. When augmenters left padding rows (`valid` False), each group's
statistics are taken over its valid rows only and padding rows get advantage 0; with every row valid the
estimator runs unmasked, exactly as on a plain GRPO batch. Token estimators see padding rows as rows with an
all-False loss mask, which every masked statistic skips.
"""
from __future__ import annotations

from typing import Callable, NamedTuple, Optional

import jax.numpy as jnp
import numpy as np

from rlkit.core.registry import Registry
from rlkit.core.types import TrainBatch
from rlkit.objectives import ADVANTAGES, group_advantages
from rlkit.rewards import RewardOutput
from rlkit.objectives.returns import (gae, masked_whiten, outcome_token_rewards, reinforce_pp_advantages,
                                      reinforce_pp_baseline_advantages)


class RewardArrays(NamedTuple):
  """A `RewardOutput` as the token estimators receive it: every per-row field, as global device arrays."""
  rewards: jnp.ndarray                      # [N] float32
  correct: Optional[jnp.ndarray]            # [N] bool, or None (the reward has no notion of correct)
  components: dict                          # name -> [N] float32
  segment_rewards: Optional[jnp.ndarray]    # [N, S] float32 by segment kind (SEGMENT_KINDS), or None


class TokenEstimator(NamedTuple):
  fn: Callable            # (rewards: RewardArrays, batch: TrainBatch, cfg, capacity, valid) -> (adv [N, R], extras)
  needs_values: bool      # True: the batch must carry the critic's extras["values"]
  min_group: int = 2      # the fewest completions per prompt it gives a signal with (1: no group baseline)


TOKEN_ESTIMATORS: Registry[TokenEstimator] = Registry("token advantage estimator")


def token_advantages(name: str, rewards: np.ndarray, capacity: int, response_len: int, eps: float,
                     valid: Optional[np.ndarray] = None) -> jnp.ndarray:
  """A group estimator's [N] rewards -> [N, R] float32 advantages (each row's on every response position)."""
  r = jnp.asarray(rewards, jnp.float32)
  if valid is not None and np.all(valid):
    valid = None
  adv = group_advantages(name, r, capacity, eps, valid=None if valid is None else jnp.asarray(valid))
  return jnp.broadcast_to(adv[:, None], (adv.shape[0], response_len))


def _gae(rewards, batch: TrainBatch, cfg, capacity, valid):
  del capacity, valid
  mask = batch.loss_mask
  adv, returns = gae(outcome_token_rewards(rewards.rewards, mask), batch.extras["values"], mask, cfg.gamma,
                     cfg.gae_lambda)
  if cfg.whiten_advantages:
    adv = masked_whiten(adv, mask)
  return adv, {"returns": returns}


def _reinforce_pp(rewards, batch: TrainBatch, cfg, capacity, valid):
  del capacity, valid
  mask = batch.loss_mask
  return reinforce_pp_advantages(outcome_token_rewards(rewards.rewards, mask), mask, cfg.gamma), {}


def _reinforce_pp_baseline(rewards, batch: TrainBatch, cfg, capacity, valid):
  return reinforce_pp_baseline_advantages(rewards.rewards, batch.loss_mask, capacity, valid), {}


TOKEN_ESTIMATORS.add("gae", TokenEstimator(_gae, needs_values=True, min_group=1))
TOKEN_ESTIMATORS.add("reinforce_pp", TokenEstimator(_reinforce_pp, needs_values=False, min_group=1))
TOKEN_ESTIMATORS.add("reinforce_pp_baseline", TokenEstimator(_reinforce_pp_baseline, needs_values=False))


def all_estimators() -> Registry:
  """Every name `rl.advantage` accepts (group and token estimators), for validation and error messages."""
  every = Registry("advantage estimator")
  for reg in (ADVANTAGES, TOKEN_ESTIMATORS):
    for name in reg:
      every.add(name, reg.get(name))
  return every


def min_group_size(name: str) -> int:
  """The fewest completions per prompt estimator `name` gives a signal with: 2 for a group estimator (one
  completion is its own group mean), a token estimator's `min_group`."""
  return TOKEN_ESTIMATORS.get(name).min_group if name in TOKEN_ESTIMATORS else 2


def needs_values(name: str) -> bool:
  return name in TOKEN_ESTIMATORS and TOKEN_ESTIMATORS.get(name).needs_values


def reward_arrays(rewards: RewardOutput, put_batch: Callable[[dict], dict]) -> RewardArrays:
  """This process's `RewardOutput` rows as global device arrays (float32 rewards, components and segment rewards)."""
  host = {"rewards": np.asarray(rewards.rewards, np.float32),
          **{f"components/{k}": np.asarray(v, np.float32) for k, v in rewards.components.items()}}
  if rewards.correct is not None:
    host["correct"] = np.asarray(rewards.correct, bool)
  if rewards.segment_rewards is not None:
    host["segment_rewards"] = np.asarray(rewards.segment_rewards, np.float32)
  dev = put_batch(host)
  return RewardArrays(dev["rewards"], dev.get("correct"),
                      {k: dev[f"components/{k}"] for k in rewards.components}, dev.get("segment_rewards"))


def with_advantages(batch: TrainBatch, rewards: RewardOutput, cfg, capacity: int, put_batch: Callable[[dict], dict],
                    valid: Optional[np.ndarray] = None) -> TrainBatch:
  """The batch with `advantages` [N, R] from `cfg.advantage` (and any extras the estimator adds).

  `rewards` (the whole reward output) and `valid` are this process's rows: a group estimator runs on its
  rewards (groups never span processes); a token estimator runs on the global arrays of every per-row field
  (`RewardArrays`), so its batch statistics (whitening) are global.
  """
  if cfg.advantage not in TOKEN_ESTIMATORS:
    adv = token_advantages(cfg.advantage, rewards.rewards, capacity, batch.response_len, cfg.adv_eps, valid)
    return batch.replace(advantages=put_batch({"advantages": np.asarray(adv)})["advantages"])
  arrays = reward_arrays(rewards, put_batch)
  dev = put_batch({"valid": np.asarray(valid, bool)}) if valid is not None and not np.all(valid) else {}
  adv, extras = TOKEN_ESTIMATORS.get(cfg.advantage).fn(arrays, batch, cfg, capacity, dev.get("valid"))
  return batch.replace(advantages=jnp.where(batch.loss_mask, adv, 0.0).astype(jnp.float32),
                       extras=dict(batch.extras, **extras))
