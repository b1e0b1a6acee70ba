"""Phase 2, reward: decode this process's rows and score them with the stage's reward function.

The reward function (registry `REWARDS`, `rl.reward.name`) receives one `RewardBatch` (prompts, completions
as text and tokens, answers, every extra field of the examples, lengths, finished flags, group ids) and
returns a `RewardOutput` (rewards, optional `correct`, named components, failures). Then every registered
reward shaper (registry `REWARD_SHAPERS`) may add to the rewards: a shaper is `fn(stage section, RewardBatch,
RewardOutput) -> RewardOutput` and returns the output unchanged when its settings are off (DAPO's soft overlong
punishment, rlkit/train/overlong.py, adds the component `overlong` when `rl.overlong_cache` > 0). Each shaper's
output is checked as a reward's is (`check_output`), and `correct` must come back unchanged: shaping is not
correctness.
"""
from __future__ import annotations

from typing import Callable

import numpy as np

from rlkit.core.registry import Registry
from rlkit.models.tokenizer import decode_responses
from rlkit.rewards import RewardBatch, RewardOutput
from rlkit.rewards.batch import check_output
from rlkit.parallel.hosts import host_rows
from rlkit.train.phases.collect import Samples


def reward_batch(samples: Samples, tokenizer) -> RewardBatch:
  ro = samples.rollout
  response, lengths = host_rows(ro.response), host_rows(ro.lengths)
  ex = samples.examples
  return RewardBatch(prompts=[e["prompt"] for e in ex], completions=decode_responses(tokenizer, response, lengths),
                     completion_tokens=response, lengths=lengths, finished=host_rows(ro.finished),
                     answers=[e["answer"] for e in ex], fields=[e["fields"] for e in ex],
                     group_ids=host_rows(ro.group_ids))


REWARD_SHAPERS: Registry[Callable[..., RewardOutput]] = Registry("reward shaper")


def shape_rewards(cfg, batch: RewardBatch, out: RewardOutput) -> RewardOutput:
  """Every registered shaper in name order on the reward function's `out`; ValueError naming the shaper when
  one returns an invalid output or changes `correct`."""
  for name in REWARD_SHAPERS:
    shaped = check_output(REWARD_SHAPERS.get(name)(cfg, batch, out), len(batch), f"shaper {name}")
    if (shaped.correct is None) != (out.correct is None) or (
        out.correct is not None and not np.array_equal(shaped.correct, out.correct)):
      raise ValueError(f"reward shaper {name!r} changed `correct`: shaping is not correctness (the accuracy "
                       "metrics read it); return the output's `correct` unchanged and add a component instead.")
    out = shaped
  return out


def compute_rewards(reward_fn, samples: Samples, tokenizer, cfg) -> RewardOutput:
  """`reward_fn` on this process's rows, then every registered shaper (`shape_rewards`)."""
  batch = reward_batch(samples, tokenizer)
  return shape_rewards(cfg, batch, reward_fn(batch))
