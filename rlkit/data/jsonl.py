"""User data from JSONL: one `{"prompt": ..., "answer": ..., **extra fields}` object per line, and the
`jsonl` task that serves and grades it.

GSM8K-style answers ("<worked solution> #### 42") are split: the text after the last '####' becomes
`answer` and the full text is kept as `solution` (the SFT demonstration), unless the line has its own
string `solution`. Every other key of a line is kept as an extra field, whatever its JSON value (a rubric as
a nested object, a list of test cases, a difficulty number, a reference text), for rewards that need it.
`demonstration` and `fields` are reserved names (see `rlkit.data.tasks`). Grading extracts the final answer
from the completion (the text after its last '####', else its last number) and compares numerically when
both sides are numbers ("1,000" == "1000.0"), else as stripped strings.

Every malformed line, including one that lacks a required field, is reported in one error, so a user fixes a
file in one pass.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import os
import re
from decimal import Decimal, InvalidOperation
from typing import Any, ClassVar, Mapping, Optional, Sequence

import numpy as np

from rlkit.data.tasks import RESERVED_FIELDS, TASKS

_FINAL_MARK = "####"
_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")
MAX_REPORTED_LINES = 20   # the error lists the first ones in full and counts the rest


def split_final_answer(text: str) -> tuple[str, Optional[str]]:
  """"steps #### 42" -> ("42", "steps #### 42"); text without '####' -> (text stripped, None)."""
  if _FINAL_MARK not in text:
    return text.strip(), None
  return text.rsplit(_FINAL_MARK, 1)[1].strip(), text


def as_field_names(value: Any, where: str) -> tuple[str, ...]:
  """`required_fields` as a tuple of names; a tuple or list of strings (config gives either), else raises."""
  if not isinstance(value, (tuple, list)) or not all(isinstance(name, str) and name for name in value):
    raise ValueError(f"{where}: required_fields must be a tuple or list of field names (non-empty strings), "
                     f"got {value!r}.")
  return tuple(value)


def _parse_line(line: str, required_fields: tuple[str, ...]) -> tuple[Optional[dict], Optional[str]]:
  """Returns (row, None) or (None, the problem)."""
  try:
    # Without its line ending: an error at the end of the line (a missing '}') would otherwise be reported
    # past the newline, as "column 1" of a line that does not exist.
    obj = json.loads(line.rstrip("\r\n"))
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
  if "solution" in obj and not isinstance(obj["solution"], str):
    problems.append(f"'solution' (the SFT demonstration) must be a string, got "
                    f"{type(obj['solution']).__name__}")
  problems += [f"{key!r} is a reserved name; rename the field" for key in RESERVED_FIELDS if key in obj]
  splits = isinstance(obj.get("answer"), str) and _FINAL_MARK in obj["answer"]   # gives a solution
  problems += [f"missing required field {key!r}" for key in required_fields
               if key not in obj and key not in ("prompt", "answer") and not (key == "solution" and splits)]
  if problems:
    return None, "; ".join(problems)
  answer, solution = split_final_answer(obj["answer"])
  if not answer:
    return None, "empty answer (nothing after '####')" if solution else "empty answer"
  row = {**obj, "answer": answer}
  if solution is not None:
    row.setdefault("solution", solution)   # a line's own solution wins
  return row, None


def load_jsonl(path: str, required_fields: Sequence[str] = ()) -> list[dict[str, Any]]:
  """Reads JSONL lines into rows {"prompt", "answer", **extra fields}; blank lines are skipped.

  A row keeps every key of its line (`answer` split as in the module docstring, `solution` added when the
  answer has '####'). Raises FileNotFoundError (missing file) or one ValueError listing every malformed
  line, a line without one of `required_fields` included, or saying the file is empty.
  """
  path = os.fspath(path)
  required_fields = as_field_names(required_fields, path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"JSONL file not found: {path!r}")
  rows, bad = [], []
  with open(path, encoding="utf-8") as f:
    for number, line in enumerate(f, start=1):
      if not line.strip():
        continue
      row, problem = _parse_line(line, required_fields)
      if problem:
        bad.append((number, problem))
      else:
        rows.append(row)
  if bad:
    shown = [f"  line {n}: {p}" for n, p in bad[:MAX_REPORTED_LINES]]
    if len(bad) > MAX_REPORTED_LINES:
      shown.append(f"  ... and {len(bad) - MAX_REPORTED_LINES} more (lines "
                   f"{', '.join(str(n) for n, _ in bad[MAX_REPORTED_LINES:])})")
    required = [repr(key) for key in required_fields if key not in ("prompt", "answer")]
    also = f" and the required field(s) {', '.join(required)}" if required else ""
    raise ValueError(f"{path}: {len(bad)} malformed line(s); each line must be a JSON object with string "
                     f"'prompt' and 'answer'{also}:\n" + "\n".join(shown))
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
  """Serves rows of a JSONL file: `make_example` draws a uniform row; grading as in the module docstring.

  `required_fields`: extra fields every line must have (e.g. ("rubric",) for a rubric reward); a line
  without one fails loading with its line number.

  `SPLIT_FILES`: the run config's `data.<key>` that holds each split's file (the train file is also this
  task's `path`); a task that declares it serves files instead of generating its splits.
  """
  SPLIT_FILES: ClassVar[dict] = {"train": "train_jsonl", "test": "test_jsonl"}
  path: str = ""
  required_fields: tuple = ()
  name: str = dataclasses.field(default="jsonl", init=False)
  rows: tuple = dataclasses.field(default=(), init=False, repr=False, compare=False)

  def __post_init__(self):
    if not self.path:
      raise ValueError("task 'jsonl': set path to a JSONL file of {\"prompt\", \"answer\"} lines.")
    # frozen: set once, here
    object.__setattr__(self, "required_fields", as_field_names(self.required_fields, "task 'jsonl'"))
    object.__setattr__(self, "rows", tuple(load_jsonl(self.path, self.required_fields)))

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    return copy.deepcopy(self.rows[int(rng.integers(len(self.rows)))])   # extra fields may be mutable

  def extract_answer(self, completion_text: str) -> Optional[str]:
    return extract_final_answer(completion_text)

  def verify(self, completion_text: str, answer: str) -> float:
    predicted = self.extract_answer(completion_text)
    return float(predicted is not None and answers_match(predicted, answer))

  def demonstration(self, example: Mapping[str, Any]) -> str:
    return example.get("solution") or example["answer"]

  def category(self, example: Mapping[str, Any]) -> str:
    """A line's optional "category" field (say a subject or a difficulty), for `eval.by_category`; lines
    without one are "none". `example` is a row (extra fields at the top) or a decoded record (in `fields`)."""
    return str((example.get("fields") or example).get("category", "none"))
