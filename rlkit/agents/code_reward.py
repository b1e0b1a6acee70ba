"""The code task's reward (`REWARDS["code_tests"]`): hidden tests in the sandbox, then the post-hoc audit.

  tests        the fraction of hidden tests passed (rlkit/agents/code_task.run_tests, `workers` sandboxes at once)
  all_pass     1 where every hidden test passed
  audit_reset  1 where a passing solution raised an audit flag (rlkit/agents/code_audit.py) and, with
               `audit=True`, had its reward reset to failure
  reward       all_pass (or tests, with `partial=True`), 0 where the audit reset it

`correct` is all_pass and not reset. A sandbox that cannot start is an error of the run, not a zero reward:
`Sandbox` refuses to build (SandboxUnavailable names why and the fix) before the first batch.
"""
from __future__ import annotations

import numpy as np

from rlkit.agents.code_audit import audit_code
from rlkit.agents.code_task import extract_code, run_tests
from rlkit.agents.sandbox import Limits, Sandbox
from rlkit.rewards.batch import RewardBatch, RewardOutput
from rlkit.rewards.verifier import RewardFn, register_reward


@register_reward("code_tests")
def make_code_tests_reward(task, executor, *, backend: str = "bwrap", cpu_s: int = 2, wall_s: float = 5.0,
                           memory_mb: int = 256, processes: int = 8, workers: int = 2, partial: bool = False,
                           audit: bool = True) -> RewardFn:
  """See the module docstring; the limits are the sandbox's (rlkit.agents.sandbox.Limits)."""
  del task, executor   # the tests run in the sandbox, not in the verifier executor
  if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
    raise ValueError(f"reward 'code_tests': workers must be an integer >= 1, got {workers!r}.")
  sandbox = Sandbox(Limits(cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb, processes=processes), backend=backend)

  def reward_fn(batch: RewardBatch) -> RewardOutput:
    reports = run_tests(sandbox, batch.completions, batch.answers, workers=workers)
    tests = np.array([r.fraction for r in reports])
    all_pass = np.array([r.total > 0 and r.passed == r.total for r in reports], np.float64)
    flagged = np.array([bool(audit_code(extract_code(c))) for c in batch.completions])
    reset = (all_pass > 0) & flagged if audit else np.zeros(len(reports), bool)
    rewards = np.where(reset, 0.0, tests if partial else all_pass)
    return RewardOutput(rewards=rewards, correct=(all_pass > 0) & ~reset,
                        components={"tests": tests, "all_pass": all_pass, "audit_reset": reset.astype(np.float64)},
                        failures={})
  return reward_fn
