"""Rewards: `RewardBatch -> RewardOutput` functions built from the registry `REWARDS` (verifiers, rubric
aggregation, constraint rewards, process verifiers: rlkit/rewards/catalog.py), and the executor that runs
their host-side code with a per-row time limit.

The names are loaded on first use (PEP 562): the executor's worker process imports `rlkit.rewards.executor`,
and an eager package would make it import jax (through `rlkit.core`) before it can start (~1 s instead of
~0.2 s, paid again at every restart after a hang).
"""
import importlib
from typing import TYPE_CHECKING

_EXPORTS = {
    "RewardBatch": "batch", "RewardOutput": "batch", "check_output": "batch", "concat_outputs": "batch",
    "take": "batch",
    "RowResults": "executor", "VerifierExecutor": "executor",
    "REWARDS": "catalog", "RewardFn": "verifier", "check_reward_kwargs": "verifier", "register_reward": "verifier",
}
__all__ = sorted(_EXPORTS)

if TYPE_CHECKING:
  from rlkit.rewards.batch import RewardBatch, RewardOutput, check_output, concat_outputs, take  # noqa: F401
  from rlkit.rewards.executor import RowResults, VerifierExecutor  # noqa: F401
  from rlkit.rewards.catalog import REWARDS  # noqa: F401
  from rlkit.rewards.verifier import RewardFn, check_reward_kwargs, register_reward  # noqa: F401


def __getattr__(name: str):
  if name not in _EXPORTS:
    raise AttributeError(f"module 'rlkit.rewards' has no attribute {name!r}")
  value = getattr(importlib.import_module(f"rlkit.rewards.{_EXPORTS[name]}"), name)
  globals()[name] = value
  return value


def __dir__():
  return sorted(list(globals()) + __all__)
