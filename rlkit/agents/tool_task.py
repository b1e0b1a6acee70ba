"""The tool task's reward (`REWARDS["tool_task"]`): SLCA-GRPO's execution and preference rewards, scored apart.

A row is a played calculator episode (`rl.collector=multi_turn`, `rl.multi_turn.env=calculator`, prompts of the
`tool_calls` task, whose answer is "call|value", e.g. "mul(23,4)|92"):

  execution   1 if the episode's first call is the gold call (tool and arguments) and ran, else 0
  preference  the summary judge: 1 if the last `<say>...</say>` states the gold value as its last number,
              else 0 (the rule), plus zero-mean Gaussian noise of std `judge_noise` (an imperfect judge, e.g. an
              LLM grader): the noise is a pure function of (judge_seed, prompt, completion), so the same text
              always gets the same grade, as from a deterministic judge, and reruns and resumes are equal
  penalties   -penalty per failed call (malformed, unknown tool, error, timeout) and per call after the first,
              routed to the summary segment as in the released SLCA implementation (primary-sources.md)

`segment_rewards` puts execution in the `tool_call` column and preference + penalties in `summary`; `rewards`
is their sum (GRPO's scalar); `correct` is a right call with a right summary (before the noise). Components:
execution, summary (what the summary segment is credited), summary_rule, penalty, and the segment flags that
`rl.advantage=gar` reads (rlkit/train/gar.py): flag_tool_call (a call failed), flag_summary (no value stated).
"""
from __future__ import annotations

import re
import zlib
from typing import Mapping

import numpy as np

from rlkit.core.labels import SEGMENT_KINDS
from rlkit.rewards.batch import RewardBatch, RewardOutput
from rlkit.rewards.verifier import RewardFn, check_float, register_reward

_SAY = re.compile(r"<say>(.*?)</say>", re.S)
_INT = re.compile(r"-?\d+")


def summary_value(completion: str):
  """The last integer of the last `<say>` of `completion` (the value the summary states), or None."""
  says = _SAY.findall(completion)
  numbers = _INT.findall(says[-1]) if says else []
  return int(numbers[-1]) if numbers else None


def judge_noise_of(seed: int, prompt: str, completion: str, std: float) -> float:
  """The judge's error on one text: N(0, std), seeded by the text (a deterministic judge's error)."""
  if std == 0:
    return 0.0
  key = zlib.crc32(f"{prompt}\x00{completion}".encode())
  return float(np.random.default_rng([int(seed), key]).normal(0.0, std))


@register_reward("tool_task")
def make_tool_task_reward(task, executor, *, judge_noise: float = 0.0, judge_seed: int = 0,
                          penalty: float = 0.5) -> RewardFn:
  """See the module docstring. `task` and `executor` are unused: the tools ran during collection."""
  del task, executor
  judge_noise = check_float("tool_task", "judge_noise", judge_noise)
  penalty = check_float("tool_task", "penalty", penalty)
  if judge_noise < 0 or penalty < 0:
    raise ValueError(f"reward 'tool_task': judge_noise={judge_noise} and penalty={penalty} must be >= 0.")

  def reward_fn(batch: RewardBatch) -> RewardOutput:
    n = len(batch)
    execution, rule, noise, pen, flag_call, flag_summary = (np.zeros(n) for _ in range(6))
    for i, (fields, answer) in enumerate(zip(batch.fields, batch.answers)):
      episode = fields.get("episode")
      if not isinstance(episode, Mapping):
        raise ValueError(f"reward 'tool_task': row {i} has no fields['episode'] (the tool calls of a played "
                         "episode); collect with rl.collector='multi_turn' and rl.multi_turn.env='calculator'.")
      gold_call, _, gold_value = str(answer).partition("|")
      calls = episode["calls"]
      if calls:
        first = calls[0]
        execution[i] = float(first["error"] is None
                             and f"{first['tool']}({','.join(str(a) for a in first['args'])})" == gold_call)
      failed = sum(c["error"] is not None for c in calls)
      pen[i] = -penalty * (failed + max(0, len(calls) - 1))
      stated = summary_value(batch.completions[i])
      rule[i] = float(stated == int(gold_value))
      flag_call[i], flag_summary[i] = float(failed > 0), float(stated is None)
      noise[i] = judge_noise_of(judge_seed, batch.prompts[i], batch.completions[i], judge_noise)
    summary = rule + noise + pen
    segments = np.zeros((n, len(SEGMENT_KINDS)))
    segments[:, SEGMENT_KINDS["tool_call"]] = execution
    segments[:, SEGMENT_KINDS["summary"]] = summary
    return RewardOutput(rewards=execution + summary, correct=(execution == 1) & (rule == 1),
                        components={"execution": execution, "summary": summary, "summary_rule": rule,
                                    "penalty": pen, "flag_tool_call": flag_call, "flag_summary": flag_summary},
                        failures={}, segment_rewards=segments)
  return reward_fn
