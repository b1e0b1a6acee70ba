"""DAPO's soft overlong punishment as a reward shaper (registry `REWARD_SHAPERS`, phases/reward.py): with
`rl.overlong_cache` = L > 0 a response longer than `max_new_tokens - L` loses linearly up to
`rl.overlong_factor` at the full budget (`rlkit.objectives.dapo.overlong_penalty`), logged as the reward
component `overlong`.
"""
from __future__ import annotations

import dataclasses

import numpy as np

from rlkit.objectives import overlong_penalty
from rlkit.rewards import RewardBatch, RewardOutput
from rlkit.train.phases.reward import REWARD_SHAPERS


def overlong(cfg, batch: RewardBatch, out: RewardOutput) -> RewardOutput:
  if not cfg.overlong_cache:
    return out
  penalty = np.asarray(overlong_penalty(batch.lengths, cfg.max_new_tokens, cfg.overlong_cache,
                                        cfg.overlong_factor), np.float64)
  return dataclasses.replace(out, rewards=out.rewards + penalty, components={**out.components, "overlong": penalty})


REWARD_SHAPERS.add("overlong", overlong)
