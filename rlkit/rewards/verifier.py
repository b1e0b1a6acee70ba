"""Rewards from a task's exact verifier (registry `REWARDS`, config keys `reward.name`, `reward.kwargs`).

`REWARDS` maps a name to a factory `make(task, executor, **kwargs) -> RewardFn`, where
`RewardFn(batch: RewardBatch) -> RewardOutput` (rlkit/rewards/batch.py). The factory binds the task and the
`VerifierExecutor` (rlkit/rewards/executor.py) that runs the task's host-side code with a per-row time limit,
so a verifier that raises or hangs on one completion costs that row (`failure_reward`, counted in `failures`
and logged), never the run.

  verifier         r = 1[verify(completion, answer)]                           correct = accepted
  verifier_format  r = 1[verify(completion, answer)] + format_reward * 1[extract_answer(completion) is not None]
                                                                                correct = accepted

`verify` returns 1.0 or 0.0; a value above 0.5 counts as accepted. `correct` is the acceptance itself, not
`r > 0.5`: with `format_reward >= 0.5` a wrong but well-formed answer would pass such a threshold. The
components ("verifier", "format") sum to the reward on every row, failed rows included.

A factory's keyword-only parameters are its kwargs: `register_reward` rejects any other keyword with the list
of valid ones, and `check_reward_kwargs` runs the same check for config validation, before a task exists.
"""
from __future__ import annotations

import functools
import inspect
import math
from typing import Any, Callable, Mapping, Optional

import numpy as np

from rlkit.core.registry import Registry
from rlkit.rewards.batch import RewardBatch, RewardOutput, check_output
from rlkit.rewards.executor import VerifierExecutor

RewardFn = Callable[[RewardBatch], RewardOutput]
REWARDS: Registry[Callable[..., RewardFn]] = Registry("reward")


def check_reward_kwargs(name: str, kwargs: Mapping[str, Any]) -> None:
  """Raises a ValueError naming reward `name` and its valid keywords if `kwargs` has any other key."""
  valid = REWARDS.get(name).keywords
  unknown = sorted(set(kwargs) - set(valid))
  if unknown:
    raise ValueError(f"reward {name!r}: unknown keyword(s) {unknown}; valid keywords: "
                     f"{list(valid) if valid else 'none'}.")


def register_reward(name: str, *, role_kwargs: tuple[str, ...] = ()):
  """Registers a factory `make(task, executor, *, kw=default, ...)` as `name`; its keyword-only parameters are
  the reward's kwargs (any other keyword is refused), and every RewardOutput it produces is checked.

  A reward that uses models of the run (an LM judge, a trained reward model) names the kwargs whose values are
  roles of `config.models` in `role_kwargs`, and takes the keyword-only parameter `models` (role -> Model),
  which the stage passes and which is not a user kwarg. Config validation checks that the roles exist."""
  def decorator(make):
    @functools.wraps(make)
    def checked_make(task, executor: VerifierExecutor, models: Optional[Mapping[str, Any]] = None,
                     **kwargs) -> RewardFn:
      check_reward_kwargs(name, kwargs)
      if role_kwargs:
        kwargs["models"] = dict(models or {})
      reward_fn = make(task, executor, **kwargs)

      @functools.wraps(reward_fn)
      def checked_reward(batch: RewardBatch) -> RewardOutput:
        return check_output(reward_fn(batch), len(batch), name)
      return checked_reward

    checked_make.keywords = tuple(p.name for p in inspect.signature(make).parameters.values()
                                  if p.kind is p.KEYWORD_ONLY and not (role_kwargs and p.name == "models"))
    checked_make.role_kwargs = tuple(role_kwargs)
    REWARDS.add(name, checked_make)
    return make
  return decorator


def check_float(reward: str, key: str, value) -> float:
  if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
    raise ValueError(f"reward {reward!r}: {key} must be a finite number, got {value!r}.")
  return float(value)


def verify_and_parse(task, completion: str, answer: str) -> tuple[float, bool]:
  """One row of `verifier_format`, run in the executor: (the verifier's score, whether an answer parses)."""
  return task.verify(completion, answer), task.extract_answer(completion) is not None


@register_reward("verifier")
def make_verifier(task, executor: VerifierExecutor, *, failure_reward: float = 0.0) -> RewardFn:
  """1 where the task's verifier accepts the completion, else 0 (`failure_reward` where it raised or hung)."""
  failure_reward = check_float("verifier", "failure_reward", failure_reward)
  verify = task.verify          # one bound method for every call, so the executor sends it to its worker once

  def reward_fn(batch: RewardBatch) -> RewardOutput:
    out = executor.map(verify, list(zip(batch.completions, batch.answers)))
    accepted = (out.values > 0.5) & ~out.failed
    rewards = np.where(out.failed, failure_reward, accepted.astype(np.float64))
    return RewardOutput(rewards=rewards, correct=accepted, components={"verifier": rewards.copy()},
                        failures=out.failures)
  return reward_fn


@register_reward("verifier_format")
def make_verifier_format(task, executor: VerifierExecutor, *, format_reward: float = 0.1,
                         failure_reward: float = 0.0) -> RewardFn:
  """The verifier reward plus `format_reward` where the task can extract an answer (a shaping baseline)."""
  format_reward = check_float("verifier_format", "format_reward", format_reward)
  failure_reward = check_float("verifier_format", "failure_reward", failure_reward)
  row_fn = functools.partial(verify_and_parse, task)

  def reward_fn(batch: RewardBatch) -> RewardOutput:
    out = executor.map(row_fn, list(zip(batch.completions, batch.answers)), fallback=(0.0, 0.0))
    accepted = (out.values[:, 0] > 0.5) & ~out.failed
    verifier = np.where(out.failed, failure_reward, accepted.astype(np.float64))
    parsed = format_reward * ((out.values[:, 1] > 0.5) & ~out.failed)
    return RewardOutput(rewards=verifier + parsed, correct=accepted,
                        components={"verifier": verifier, "format": parsed}, failures=out.failures)
  return reward_fn
