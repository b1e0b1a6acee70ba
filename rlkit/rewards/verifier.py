"""Host-side rewards from a task's exact verifier (registry `REWARDS`, config key `<stage>.reward`).

A reward function maps a batch of decoded completions to float rewards:
`fn(task, completions: list[str], answers: list[str]) -> (rewards [N] float64, failures: int)`.
A verifier that raises on one completion scores it 0 and is counted in `failures` (logged as
`reward_failures`), so one pathological sample never crashes a run.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from rlkit.core.registry import Registry

REWARDS: Registry[Callable] = Registry("reward")


def _safe_verify(task, completion: str, answer: str) -> tuple[float, bool]:
  try:
    return float(task.verify(completion, answer)), False
  except Exception:  # a verifier bug on one sample is a logged failure, not a crashed run
    return 0.0, True


@REWARDS.register("verifier")
def verifier_reward(task, completions: Sequence[str], answers: Sequence[str]) -> tuple[np.ndarray, int]:
  """1 for a completion the task's verifier accepts, else 0."""
  out = [_safe_verify(task, c, a) for c, a in zip(completions, answers)]
  return np.array([r for r, _ in out], np.float64), sum(f for _, f in out)


@REWARDS.register("verifier_format")
def verifier_format_reward(task, completions: Sequence[str], answers: Sequence[str]) -> tuple[np.ndarray, int]:
  """Verifier reward plus 0.1 for any completion whose answer can be extracted (a shaping baseline)."""
  rewards, failures = verifier_reward(task, completions, answers)
  parsed = np.array([task.extract_answer(c) is not None for c in completions], np.float64)
  return rewards + 0.1 * parsed, failures
