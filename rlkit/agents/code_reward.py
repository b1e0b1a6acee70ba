"""The code task's reward (`REWARDS["code_tests"]`): hidden tests in the sandbox, then the post-hoc audit.

  tests        the fraction of hidden tests passed (rlkit/agents/code_task.run_tests, `workers` sandboxes at once)
  all_pass     1 where every hidden test passed
  quality      the solution score S_sol in (0, 1]: the reference demonstration's AST size over the solution's,
               at most 1 (a rubric we chose: as concise as the step-by-step reference scores 1; DESIGN); 1 where
               there is no parsable code (nothing passed to score). GAR reads it (rl.gar.quality).
  behaviour    the behaviour score S_beh: 1 for a solution that writes nothing but the harness's result, 0.5
               for one that prints or warns (DESIGN)
  audit_reset  1 where a passing solution raised an audit flag (rlkit/agents/code_audit.py) and, with
               `audit=True`, had its reward reset to failure
  reward       grader "pass_fail": all_pass (or tests, with `partial=True`); grader "grs": MiMo-V2.6's GRS,
               tests * quality * behaviour; 0 where the audit reset it

`correct` is all_pass and not reset. A sandbox that cannot start is an error of the run, not a zero reward:
`Sandbox` refuses to build (SandboxUnavailable names why and the fix) before the first batch.
"""
from __future__ import annotations

import numpy as np

import ast

from rlkit.agents.code_audit import audit_code
from rlkit.agents.code_task import extract_code, reference_code, run_tests
from rlkit.agents.sandbox import Limits, Sandbox
from rlkit.rewards.batch import RewardBatch, RewardOutput
from rlkit.rewards.verifier import RewardFn, register_reward


@register_reward("code_tests")
def make_code_tests_reward(task, executor, *, backend: str = "bwrap", cpu_s: int = 2, wall_s: float = 5.0,
                           memory_mb: int = 256, processes: int = 8, workers: int = 2, partial: bool = False,
                           audit: bool = True, grader: str = "pass_fail") -> RewardFn:
  """See the module docstring; the limits are the sandbox's (rlkit.agents.sandbox.Limits)."""
  del task, executor   # the tests run in the sandbox, not in the verifier executor
  if grader not in GRADERS:
    raise ValueError(f"reward 'code_tests': grader={grader!r} is not one of {', '.join(GRADERS)}.")
  if not isinstance(workers, int) or isinstance(workers, bool) or workers < 1:
    raise ValueError(f"reward 'code_tests': workers must be an integer >= 1, got {workers!r}.")
  sandbox = Sandbox(Limits(cpu_s=cpu_s, wall_s=wall_s, memory_mb=memory_mb, processes=processes), backend=backend)

  def reward_fn(batch: RewardBatch) -> RewardOutput:
    reports = run_tests(sandbox, batch.completions, batch.answers, workers=workers)
    tests = np.array([r.fraction for r in reports])
    all_pass = np.array([r.total > 0 and r.passed == r.total for r in reports], np.float64)
    flagged = np.array([bool(audit_code(extract_code(c))) for c in batch.completions])
    reset = (all_pass > 0) & flagged if audit else np.zeros(len(reports), bool)
    quality = np.array([solution_score(extract_code(c), reference_code(a))
                        for c, a in zip(batch.completions, batch.answers)])
    behaviour = np.array([1.0 if r.result is None or _quiet(r) else 0.5 for r in reports])
    base = tests * quality * behaviour if grader == "grs" else (tests if partial else all_pass)
    rewards = np.where(reset, 0.0, base)
    return RewardOutput(rewards=rewards, correct=(all_pass > 0) & ~reset,
                        components={"tests": tests, "all_pass": all_pass, "quality": quality,
                                    "behaviour": behaviour, "audit_reset": reset.astype(np.float64)},
                        failures={})
  return reward_fn


GRADERS = ("pass_fail", "grs")


def _size(code: str) -> int:
  return sum(1 for _ in ast.walk(ast.parse(code)))


def solution_score(code, reference: str) -> float:
  """S_sol: min(1, AST nodes of `reference` / AST nodes of `code`); 1 without parsable code."""
  try:
    return min(1.0, _size(reference) / _size(code)) if code is not None else 1.0
  except (SyntaxError, ValueError):
    return 1.0


def _quiet(report) -> bool:
  """The run wrote nothing but the harness's result line (no prints, no warnings)."""
  lines = [line for line in report.result.stdout.splitlines() if line.strip()]
  return report.result.stderr == "" and len(lines) <= 1 and all(line.startswith('{"outputs"') for line in lines)
