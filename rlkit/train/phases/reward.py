"""Phase 2, reward: decode this process's rows and score them with the stage's reward function.

The reward function (registry `REWARDS`, `rl.reward.name`) receives one `RewardBatch` (prompts, completions
as text and tokens, answers, every extra field of the examples, lengths, finished flags, group ids) and
returns a `RewardOutput` (rewards, optional `correct`, named components, failures). DAPO's soft overlong
punishment (`rl.overlong_cache`) is added here as the component `overlong`.
"""
from __future__ import annotations

import numpy as np

from rlkit.models.tokenizer import decode_responses
from rlkit.objectives import overlong_penalty
from rlkit.rewards import RewardBatch, RewardOutput
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


def compute_rewards(reward_fn, samples: Samples, tokenizer, cfg) -> RewardOutput:
  """`reward_fn` on this process's rows, plus the overlong penalty if `cfg.overlong_cache` > 0."""
  batch = reward_batch(samples, tokenizer)
  out = reward_fn(batch)
  if cfg.overlong_cache:
    penalty = np.asarray(overlong_penalty(batch.lengths, cfg.max_new_tokens, cfg.overlong_cache,
                                          cfg.overlong_factor), np.float64)
    out = RewardOutput(rewards=out.rewards + penalty, correct=out.correct,
                       components={**out.components, "overlong": penalty}, failures=out.failures)
  return out
