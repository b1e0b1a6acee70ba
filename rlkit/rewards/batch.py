"""What a reward function receives and returns: `RewardBatch -> RewardOutput` (DESIGN.md, "One RL iteration").

Every reward in `REWARDS` sees the same host-side batch (prompts, decoded completions, sampled tokens, lengths,
finished flags, answers, every extra field of the examples, group ids), so a reward that needs the rubric of an
example or the length of a row reads it here instead of growing its own signature. It returns

  rewards     [N] float64, finite: what the advantage estimator sees;
  correct     [N] bool or None: what `accuracy` is computed from. It is the reward's own notion of success
              (the verifier's acceptance), not a threshold on `rewards`: shaping terms can push a wrong row above
              any threshold. None: the reward has no notion of correct, and accuracy is not logged;
  components  named [N] float64 parts (logged as reward/<name>);
  failures    failure kind -> count ("ZeroDivisionError", "timeout"): rows the host-side code could not score;
  segment_rewards  optional [N, S] float64: a reward per segment kind (S = len(SEGMENT_KINDS), column k the
              reward of row n's tokens of kind k, e.g. a tool call judged apart from the answer), for the
              token estimators that place rewards by segment. The estimators receive the whole output.

The trainer samples in rounds (dynamic sampling) and keeps a subset of rows, hence `concat_outputs` and `take`.
Failures are counts, not per-row flags: they describe the scoring work done, so `take` keeps them whole and the
logged number counts every row scored, kept or not.
"""
from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import numpy as np

from rlkit.core.labels import SEGMENT_KINDS


@dataclasses.dataclass(frozen=True)
class RewardBatch:
  """The rows to score, host-side. Arrays are converted to the dtypes below; every field must have N rows.

  Attributes:
    prompts: [N] prompt text of each row.
    completions: [N] decoded completion text (stop token and padding removed).
    completion_tokens: [N, R] int32 sampled tokens (pad after the end).
    lengths: [N] int32 number of generated tokens.
    finished: [N] bool, True where the row ended with a stop token (False: cut at max_new_tokens).
    answers: [N] the example's answer string.
    fields: [N] every extra field of the row's example ({} when none): numbers, strings, lists, nested dicts.
    group_ids: [N] int32, rows sampled for one prompt share an id.
  """
  prompts: list[str]
  completions: list[str]
  completion_tokens: np.ndarray
  lengths: np.ndarray
  finished: np.ndarray
  answers: list[str]
  fields: list[dict]
  group_ids: np.ndarray

  def __post_init__(self):
    n = len(self.completions)
    for name in ("prompts", "answers", "fields"):
      if len(getattr(self, name)) != n:
        raise ValueError(f"RewardBatch: {name} has {len(getattr(self, name))} rows, completions has {n}.")
    for name, kind, dtype, ndim in (("completion_tokens", "integer", np.int32, 2), ("lengths", "integer", np.int32, 1),
                                    ("finished", "bool", np.bool_, 1), ("group_ids", "integer", np.int32, 1)):
      value = np.asarray(getattr(self, name))
      ok_kind = value.dtype == np.bool_ if kind == "bool" else np.issubdtype(value.dtype, np.integer)
      if not ok_kind or value.ndim != ndim or value.shape[0] != n:
        raise ValueError(f"RewardBatch: {name} must be a {ndim}-d {kind} array with {n} rows, got "
                         f"{value.dtype} of shape {value.shape}.")
      object.__setattr__(self, name, value.astype(dtype, copy=False))

  def __len__(self) -> int:
    return len(self.completions)


@dataclasses.dataclass
class RewardOutput:
  """A reward function's result for N rows (see the module docstring; `check_output` enforces the contract)."""
  rewards: np.ndarray
  correct: Optional[np.ndarray]
  components: dict[str, np.ndarray]
  failures: dict[str, int]
  segment_rewards: Optional[np.ndarray] = None


def check_output(output: RewardOutput, n: int, reward: str) -> RewardOutput:
  """Returns `output` if it is a valid result for `n` rows of reward `reward`, else raises a ValueError
  naming the reward and the problem (a wrong shape or dtype, a non-finite value, a bad failure count)."""
  def fail(problem: str):
    raise ValueError(f"reward {reward!r} returned an invalid RewardOutput for {n} rows: {problem}.")

  if not isinstance(output, RewardOutput):
    fail(f"expected a RewardOutput, got {type(output).__name__}")
  arrays = [("rewards", output.rewards, np.float64)]
  if output.correct is not None:
    arrays.append(("correct", output.correct, np.bool_))
  if not isinstance(output.components, dict):
    fail(f"components must be a dict of name -> [N] array, got {type(output.components).__name__}")
  arrays += [(f"components[{name!r}]", value, np.float64) for name, value in output.components.items()]
  for name, value, dtype in arrays:
    if not isinstance(value, np.ndarray) or value.dtype != dtype or value.shape != (n,):
      got = f"{value.dtype} array of shape {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
      fail(f"{name} must be a {np.dtype(dtype).name} array of shape ({n},), got {got}")
    if dtype == np.float64 and not np.all(np.isfinite(value)):
      bad = np.flatnonzero(~np.isfinite(value))
      fail(f"{name} has {bad.size} non-finite value(s), first at row {bad[0]}: {value[bad[0]]}")
  if output.segment_rewards is not None:
    value, kinds = output.segment_rewards, len(SEGMENT_KINDS)
    if not isinstance(value, np.ndarray) or value.dtype != np.float64 or value.shape != (n, kinds):
      got = f"{value.dtype} array of shape {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
      fail(f"segment_rewards must be a float64 array of shape ({n}, {kinds}) (one column per segment kind: "
           f"{', '.join(SEGMENT_KINDS)}), got {got}")
    if not np.all(np.isfinite(value)):
      fail("segment_rewards has non-finite values")
  if not isinstance(output.failures, dict):
    fail(f"failures must be a dict of kind -> count, got {type(output.failures).__name__}")
  for kind, count in output.failures.items():
    if not isinstance(kind, str) or not isinstance(count, (int, np.integer)) or isinstance(count, bool) \
        or count < 0:
      fail(f"failures must map a kind (str) to a non-negative int count, got {kind!r}: {count!r}")
  return output


def concat_outputs(outputs: Sequence[RewardOutput]) -> RewardOutput:
  """Rows of every output appended in order; failures summed by kind. All outputs must have the same component
  names and all or none a `correct` array (they come from one reward function)."""
  if not outputs:
    raise ValueError("concat_outputs: need at least one RewardOutput.")
  names = list(outputs[0].components)
  for out in outputs[1:]:
    if sorted(out.components) != sorted(names):
      raise ValueError(f"concat_outputs: component names differ: {sorted(names)} vs {sorted(out.components)}.")
    if (out.correct is None) != (outputs[0].correct is None):
      raise ValueError("concat_outputs: some outputs have `correct` and some have None.")
    if (out.segment_rewards is None) != (outputs[0].segment_rewards is None):
      raise ValueError("concat_outputs: some outputs have `segment_rewards` and some have None.")
  failures: dict[str, int] = {}
  for out in outputs:
    for kind, count in out.failures.items():
      failures[kind] = failures.get(kind, 0) + int(count)
  return RewardOutput(
      rewards=np.concatenate([out.rewards for out in outputs]),
      correct=None if outputs[0].correct is None else np.concatenate([out.correct for out in outputs]),
      components={name: np.concatenate([out.components[name] for out in outputs]) for name in names},
      failures=failures,
      segment_rewards=(None if outputs[0].segment_rewards is None
                       else np.concatenate([out.segment_rewards for out in outputs])))


def take(output: RewardOutput, indices) -> RewardOutput:
  """The rows `indices` of `output`, in that order. Failures are kept whole (see the module docstring)."""
  indices = np.asarray(indices)
  if indices.size == 0:
    indices = indices.astype(np.int64)
  if indices.dtype == np.bool_ or not np.issubdtype(indices.dtype, np.integer):
    raise ValueError(f"take: indices must be integers, got {indices.dtype}.")
  return RewardOutput(
      rewards=output.rewards[indices],
      correct=None if output.correct is None else output.correct[indices],
      components={name: value[indices] for name, value in output.components.items()},
      failures=dict(output.failures),
      segment_rewards=None if output.segment_rewards is None else output.segment_rewards[indices])
