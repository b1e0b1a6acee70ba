"""Synthetic train/test splits of a task: the rows the tfds builder stores, without tfds.

Test and train come from disjoint seed streams (`default_rng([seed, 1])` and `[seed, 0]`), each split has
unique prompts, and train skips every test prompt. A row is stored as its text fields, the demonstration,
and every other key as canonical JSON (`fields`; see `rlkit.data.tfds_builders`).
"""
from __future__ import annotations

import json
from typing import Any, Mapping

import numpy as np

from rlkit.data.tasks import RESERVED_FIELDS, Task


def encode_fields(fields: Mapping[str, Any]) -> str:
  """Canonical JSON of the extra fields: sorted keys, no spaces, ASCII (a lone surrogate that JSON allows
  cannot be written as UTF-8, its escape can)."""
  return json.dumps(fields, sort_keys=True, separators=(",", ":"))


def stored_example(task: Task, row: Mapping[str, Any]) -> dict[str, str]:
  """The stored example: text fields, the demonstration, and every other key of `row` as `fields` JSON."""
  missing = [key for key in task.required_fields if key not in row]
  reserved = [key for key in RESERVED_FIELDS if key in row]
  if missing or reserved:
    raise ValueError(f"task {task.name!r}: make_example returned {sorted(row)}, which lacks the required "
                     f"field(s) {missing} or uses the reserved name(s) {reserved}.")
  fields = {k: v for k, v in row.items() if k not in ("prompt", "answer")}
  try:
    encoded = encode_fields(fields)
  except (TypeError, ValueError) as e:
    raise ValueError(f"task {task.name!r}: extra fields must be plain JSON values (str, int, float, bool, "
                     f"None, list, dict with str keys): {e}; got {fields!r}.") from None
  return {"prompt": row["prompt"], "answer": row["answer"], "demonstration": task.demonstration(row),
          "fields": encoded}


class PromptSpaceError(ValueError):
  """More distinct prompts asked for than the task has (num_train / num_test too large for it)."""


def _unique_examples(task: Task, rng: np.random.Generator, count: int, exclude: set[str]) -> list[dict]:
  rows, seen = [], set(exclude)
  max_draws = 10 * count + 1000
  for _ in range(max_draws):
    if len(rows) == count:
      break
    row = task.make_example(rng)
    if row["prompt"] not in seen:
      seen.add(row["prompt"])
      rows.append(stored_example(task, row))
  if len(rows) < count:
    raise PromptSpaceError(f"task {task.name!r}: only {len(rows)} distinct prompts (of {count} requested) in "
                           f"{max_draws} draws; the task's prompt space is too small for these sizes. Lower "
                           "num_train/num_test or widen the task (more digits, numbers, operators).")
  return rows


def generate_test_split(task: Task, num_test: int, seed: int) -> list[dict]:
  """The test rows of `generate_splits` alone (drawn first, from their own stream), without the train split."""
  return _unique_examples(task, np.random.default_rng([seed, 1]), num_test, exclude=set())


def generate_splits(task: Task, num_train: int, num_test: int, seed: int) -> dict[str, list[dict]]:
  """Deterministic train/test rows {prompt, answer, demonstration, fields} with no test prompt in train."""
  test = generate_test_split(task, num_test, seed)
  train = _unique_examples(task, np.random.default_rng([seed, 0]), num_train,
                           exclude={r["prompt"] for r in test})
  return {"train": train, "test": test}
