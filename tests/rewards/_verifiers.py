"""Helpers for the reward tests: a batch builder, and row functions and a task that misbehave, importable by
the executor's spawn worker (as `tests.rewards._verifiers`, from the repository root that pytest.ini puts on
sys.path)."""
import dataclasses
import os
import signal
import time

import numpy as np

from rlkit.rewards.batch import RewardBatch


def make_batch(completions, answers=None, **overrides) -> RewardBatch:
  n = len(completions)
  kwargs = dict(prompts=[f"p{i}" for i in range(n)], completions=list(completions),
                completion_tokens=np.zeros((n, 4), np.int64), lengths=np.full(n, 4), finished=np.ones(n, bool),
                answers=list(answers) if answers is not None else ["0"] * n, fields=[{} for _ in range(n)],
                group_ids=np.arange(n) // 2)
  kwargs.update(overrides)
  return RewardBatch(**kwargs)


def value_of(text: str, answer: str) -> float:
  """Well-behaved, and row-dependent so row order is observable."""
  return float(text) * 10 + float(answer)


def pid(*_) -> float:
  return float(os.getpid())


def misbehave(text: str, answer: str) -> float:
  """Does what `text` says: an int scores as itself; the rest raise, hang or crash."""
  if text == "zero":
    return 1 / 0
  if text == "key":
    return {}["missing"]
  if text == "none":
    return None
  if text == "sleep":
    time.sleep(10 ** 6)
  if text == "spin":
    while True:
      pass
  if text == "c_hang":      # what a hang in C code looks like to the worker: the alarm signal never gets in
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGALRM})
    time.sleep(10 ** 6)
  if text == "exit":
    os._exit(3)
  if text == "swallow":     # a verifier that catches everything must still be stopped by the alarm
    while True:
      try:
        time.sleep(10 ** 6)
      except Exception:
        pass
  return float(text)


@dataclasses.dataclass(frozen=True)
class MisbehavingTask:
  """A digit completion parses and is right when it equals the answer; any other text goes to `misbehave`."""
  name: str = "misbehaving"

  def extract_answer(self, completion: str):
    return completion if completion.isdigit() else None

  def verify(self, completion: str, answer: str) -> float:
    if completion.isdigit():
      return float(completion == answer)
    return misbehave(completion, answer)
