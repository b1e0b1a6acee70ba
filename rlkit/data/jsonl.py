"""User data from JSONL: one `{"prompt": ..., "answer": ...}` object per line, and the `jsonl` task that
serves and grades it.

GSM8K-style answers ("<worked solution> #### 42") are split: the text after the last '####' becomes
`answer` and the full text is kept as `solution` (the SFT demonstration). Grading extracts the final answer
from the completion (the text after its last '####', else its last number) and compares numerically when
both sides are numbers ("1,000" == "1000.0"), else as stripped strings.

Every malformed line is reported in one error, so a user fixes a file in one pass.
"""
from __future__ import annotations

import dataclasses
import json
import os
import re
from decimal import Decimal, InvalidOperation
from typing import Mapping, Optional

import numpy as np

from rlkit.data.tasks import TASKS

_FINAL_MARK = "####"
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
MAX_REPORTED_LINES = 20   # the error lists the first ones in full and counts the rest


def split_final_answer(text: str) -> tuple[str, Optional[str]]:
  """"steps #### 42" -> ("42", "steps #### 42"); text without '####' -> (text stripped, None)."""
  if _FINAL_MARK not in text:
    return text.strip(), None
  return text.rsplit(_FINAL_MARK, 1)[1].strip(), text


def _parse_line(line: str) -> tuple[Optional[dict], Optional[str]]:
  """Returns (row, None) or (None, the problem)."""
  try:
    obj = json.loads(line)
  except json.JSONDecodeError as e:
    return None, f"invalid JSON ({e.msg} at column {e.colno})"
  if not isinstance(obj, dict):
    return None, f"expected a JSON object, got {type(obj).__name__}"
  problems = []
  for key in ("prompt", "answer"):
    if key not in obj:
      problems.append(f"missing key {key!r}")
    elif not isinstance(obj[key], str):
      problems.append(f"{key!r} must be a string, got {type(obj[key]).__name__}")
  if problems:
    return None, "; ".join(problems)
  answer, solution = split_final_answer(obj["answer"])
  if not answer:
    return None, "empty answer (nothing after '####')" if solution else "empty answer"
  row = {"prompt": obj["prompt"], "answer": answer}
  if solution is not None:
    row["solution"] = solution
  return row, None


def load_jsonl(path: str) -> list[dict[str, str]]:
  """Reads `{"prompt", "answer"}` lines into rows {"prompt", "answer"[, "solution"]}; blank lines are skipped.

  Raises FileNotFoundError (missing file) or one ValueError listing every malformed line, or saying the
  file is empty.
  """
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"JSONL file not found: {path!r}")
  rows, bad = [], []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      row, problem = _parse_line(line)
      if problem:
        bad.append((number, problem))
      else:
        rows.append(row)
  if bad:
    shown = [f"  line {n}: {p}" for n, p in bad[:MAX_REPORTED_LINES]]
    if len(bad) > MAX_REPORTED_LINES:
      shown.append(f"  ... and {len(bad) - MAX_REPORTED_LINES} more (lines "
                   f"{', '.join(str(n) for n, _ in bad[MAX_REPORTED_LINES:])})")
    raise ValueError(f"{path}: {len(bad)} malformed line(s); each line must be a JSON object with string "
                     "'prompt' and 'answer':\n" + "\n".join(shown))
  if not rows:
    raise ValueError(f"{path}: the file is empty (no JSON lines); expected one "
                     '{"prompt": ..., "answer": ...} object per line.')
  return rows


def _as_number(text: str) -> Optional[Decimal]:
  text = text.strip().replace(",", "").lstrip("$").rstrip(".")
  try:
    value = Decimal(text)
  except InvalidOperation:
    return None
  return value if value.is_finite() else None   # "NaN" and "Infinity" parse, but are not answers


def extract_final_answer(completion_text: str) -> Optional[str]:
  """The text after the last '####' (first line of it), else the last number in the text, else None."""
  if _FINAL_MARK in completion_text:
    tail = completion_text.rsplit(_FINAL_MARK, 1)[1].strip()
    return tail.split("\n", 1)[0].strip() or None
  numbers = _NUMBER.findall(completion_text)
  return numbers[-1] if numbers else None


def answers_match(predicted: str, answer: str) -> bool:
  """Numeric equality when both parse as numbers, else equality of the stripped strings."""
  p, a = _as_number(predicted), _as_number(answer)
  if p is not None and a is not None:
    return p == a
  return predicted.strip() == answer.strip()


@TASKS.register("jsonl")
@dataclasses.dataclass(frozen=True)
class JsonlTask:
  """Serves rows of a JSONL file: `make_example` draws a uniform row; grading as in the module docstring."""
  path: str = ""
  name: str = dataclasses.field(default="jsonl", init=False)
  rows: tuple = dataclasses.field(default=(), init=False, repr=False, compare=False)

  def __post_init__(self):
    if not self.path:
      raise ValueError("task 'jsonl': set path to a JSONL file of {\"prompt\", \"answer\"} lines.")
    object.__setattr__(self, "rows", tuple(load_jsonl(self.path)))   # frozen: set once, here

  def make_example(self, rng: np.random.Generator) -> dict[str, str]:
    return dict(self.rows[int(rng.integers(len(self.rows)))])

  def extract_answer(self, completion_text: str) -> Optional[str]:
    return extract_final_answer(completion_text)

  def verify(self, completion_text: str, answer: str) -> float:
    predicted = self.extract_answer(completion_text)
    return float(predicted is not None and answers_match(predicted, answer))

  def demonstration(self, example: Mapping[str, str]) -> str:
    return example.get("solution") or example["answer"]
