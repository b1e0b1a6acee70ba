"""Tasks: a prompt generator plus an exact verifier, keyed by config string in `TASKS`.

A task is a small frozen dataclass (its fields are the config) with:
  required_fields                  -> names of the extra fields every example must carry (a tuple of str)
  make_example(rng)                -> {"prompt", "answer", **extra fields}
  extract_answer(completion_text)  -> the part of the completion that is graded, or None
  verify(completion_text, answer)  -> 1.0 if correct else 0.0 (exact; never raises on model output)
  demonstration(example)           -> the target completion text for SFT (without EOS: the tokenizer adds it)

`answer` is whatever the verifier needs, as a string: the integer for `arithmetic`, and the puzzle itself
("7 3 5>26") for `countdown`, whose verifier must know which numbers were allowed.

Every key of an example other than `prompt` and `answer` is an *extra field*: any JSON value (a rubric as a
nested object, test cases as a list, a difficulty number, `solution` — the SFT demonstration where a task
has one). Extra fields travel with the example to the batch (`batch["fields"]`) and on to the rewards.
`demonstration` and `fields` are reserved: they name the stored SFT target and the decoded extra fields.

Expressions are evaluated by a tiny recursive-descent parser over integers, + - * and parentheses (never
`eval`): model output is untrusted text.
"""
from __future__ import annotations

import dataclasses
import re
from collections import Counter
from typing import Any, Mapping, Optional, Protocol, runtime_checkable

import numpy as np

from rlkit.core.registry import Registry

TASKS: Registry[Any] = Registry("task")
RESERVED_FIELDS = ("demonstration", "fields")


@runtime_checkable
class Task(Protocol):
  name: str
  required_fields: tuple[str, ...]

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]: ...

  def extract_answer(self, completion_text: str) -> Optional[str]: ...

  def verify(self, completion_text: str, answer: str) -> float: ...

  def demonstration(self, example: Mapping[str, Any]) -> str: ...


def make_task(name: str, **kwargs) -> Task:
  """Builds the task registered as `name`; an unknown parameter fails with the list of valid ones."""
  cls = TASKS.get(name)
  valid = [f.name for f in dataclasses.fields(cls) if f.init]
  unknown = sorted(set(kwargs) - set(valid))
  if unknown:
    raise ValueError(f"task {name!r}: unknown parameter(s) {unknown}; valid parameters: {valid}.")
  return cls(**kwargs)


def _require(ok: bool, task: str, message: str) -> None:
  if not ok:
    raise ValueError(f"task {task!r}: {message}")


# ----------------------------------------------------------------------------------------------------------
# Expressions: integers, + - *, parentheses. No unary minus, no division (so every value is an integer).

MAX_EXPRESSION_CHARS = 256    # bounds parser recursion and work on arbitrary model output
_TOKEN = re.compile(r"\s*(?:(\d+)|([-+*()]))")


class ExpressionError(ValueError):
  """The text is not a well-formed expression over integers, + - * and parentheses."""


def tokenize_expression(text: str) -> list[str]:
  if len(text) > MAX_EXPRESSION_CHARS:
    raise ExpressionError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
  tokens, pos = [], 0
  text = text.rstrip()
  while pos < len(text):
    m = _TOKEN.match(text, pos)
    if not m:
      raise ExpressionError(f"unexpected character {text[pos:].lstrip()[:1]!r} at {pos}")
    tokens.append(m.group(1) or m.group(2))
    pos = m.end()
  return tokens


def evaluate_expression(text: str) -> tuple[int, list[int]]:
  """Returns (value, the integer literals used, in order); raises ExpressionError when malformed."""
  tokens = tokenize_expression(text)
  numbers: list[int] = []
  pos = 0

  def peek() -> Optional[str]:
    return tokens[pos] if pos < len(tokens) else None

  def take() -> str:
    nonlocal pos
    if pos >= len(tokens):
      raise ExpressionError("expression ends early")
    pos += 1
    return tokens[pos - 1]

  def factor() -> int:
    tok = take()
    if tok == "(":
      value = expr()
      if take() != ")":
        raise ExpressionError("missing ')'")
      return value
    if not tok.isdigit():
      raise ExpressionError(f"expected a number or '(', got {tok!r}")
    numbers.append(int(tok))
    return int(tok)

  def term() -> int:
    value = factor()
    while peek() == "*":
      take()
      value *= factor()
    return value

  def expr() -> int:
    value = term()
    while peek() in ("+", "-"):
      value = value + term() if take() == "+" else value - term()
    return value

  if not tokens:
    raise ExpressionError("empty expression")
  value = expr()
  if pos != len(tokens):
    raise ExpressionError(f"unexpected {tokens[pos]!r} after a complete expression")
  return value, numbers


_PRECEDENCE = {"+": 1, "-": 1, "*": 2}
_ATOM = 3


def combine(left: tuple[str, int], right: tuple[str, int], op: str) -> tuple[str, int]:
  """Joins two (text, precedence) expressions with `op`, adding only the parentheses precedence requires."""
  (lt, lp), (rt, rp), p = left, right, _PRECEDENCE[op]
  if lp < p:
    lt = f"({lt})"
  if rp < p or (op == "-" and rp == p):    # a-(b-c) and a-(b+c) need them; a*(b*c) and a+(b-c) do not
    rt = f"({rt})"
  return f"{lt}{op}{rt}", p


def _validate_ops(task: str, ops: str) -> None:
  _require(isinstance(ops, str) and len(ops) > 0 and set(ops) <= set("+-*"), task,
           f"ops must be a non-empty subset of '+-*', got {ops!r}.")


# ----------------------------------------------------------------------------------------------------------
# arithmetic: "12+345=" -> "357"

_LEADING_INT = re.compile(r"\s*(-?\d+)")


def _canonical_int(text: str) -> str:
  """"-007" -> "-7", "-0" -> "0". Compared as text: int() refuses strings over 4300 digits, and a model
  can emit that many."""
  text = text.strip()
  negative, digits = text.startswith("-"), text.lstrip("-").lstrip("0") or "0"
  return "-" + digits if negative and digits != "0" else digits


@TASKS.register("arithmetic")
@dataclasses.dataclass(frozen=True)
class Arithmetic:
  """Integer arithmetic with standard precedence, e.g. prompt "12+345*2=", completion "702".

  Each operand gets a digit count uniform in [min_digits, max_digits] and then a uniform value with that
  many digits, so short and long operands are equally common.
  """
  ops: str = "+"
  min_digits: int = 1
  max_digits: int = 3
  num_operands: int = 2
  name: str = dataclasses.field(default="arithmetic", init=False)
  required_fields: tuple = dataclasses.field(default=(), init=False)

  def __post_init__(self):
    _validate_ops(self.name, self.ops)
    for key in ("min_digits", "max_digits", "num_operands"):
      _require(isinstance(getattr(self, key), (int, np.integer)), self.name,
               f"{key} must be an integer, got {getattr(self, key)!r}.")
    _require(1 <= self.min_digits <= self.max_digits <= 18, self.name,
             f"need 1 <= min_digits <= max_digits <= 18, got {self.min_digits}, {self.max_digits}.")
    _require(self.num_operands >= 2, self.name, f"num_operands must be >= 2, got {self.num_operands}.")

  def _operand(self, rng: np.random.Generator) -> int:
    digits = int(rng.integers(self.min_digits, self.max_digits + 1))
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return int(rng.integers(low, 10 ** digits))

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    text = str(self._operand(rng))
    for _ in range(self.num_operands - 1):
      text += self.ops[int(rng.integers(len(self.ops)))] + str(self._operand(rng))
    value, _ = evaluate_expression(text)
    return {"prompt": text + "=", "answer": str(value)}

  def extract_answer(self, completion_text: str) -> Optional[str]:
    """The leading integer (optional '-'), up to the first non-digit; leading whitespace is ignored."""
    m = _LEADING_INT.match(completion_text)
    return m.group(1) if m else None

  def verify(self, completion_text: str, answer: str) -> float:
    got = self.extract_answer(completion_text)
    return float(got is not None and _canonical_int(got) == _canonical_int(answer))

  def demonstration(self, example: Mapping[str, Any]) -> str:
    return example["answer"]

  def category(self, example: Mapping[str, Any]) -> str:
    """The operators of the prompt, in the order of `ops` ("+", "-", "+-"): the skill a problem tests, for
    `eval.by_category`. Operands are never negative, so every '-' is an operator."""
    used = set(example["prompt"])
    return "".join(op for op in "+-*" if op in used)


# ----------------------------------------------------------------------------------------------------------
# countdown: "7 3 5>26:" -> "7*3+5"


def format_countdown(numbers: list[int], target: int) -> str:
  return " ".join(map(str, numbers)) + f">{target}"


def parse_countdown(answer: str) -> tuple[list[int], int]:
  """Inverse of `format_countdown`: "7 3 5>26" -> ([7, 3, 5], 26)."""
  numbers, _, target = answer.partition(">")
  return [int(n) for n in numbers.split()], int(target)


@TASKS.register("countdown")
@dataclasses.dataclass(frozen=True)
class Countdown:
  """Reach the target with the given numbers (each at most once), + - * and parentheses.

  Examples are generated by combining all the numbers in a random binary tree with random operators, so a
  solution always exists (that expression is the demonstration); targets outside [1, max_target] are
  redrawn. The answer string is the puzzle, "7 3 5>26", since the verifier needs the allowed numbers.
  """
  min_numbers: int = 3
  max_numbers: int = 4
  min_value: int = 1
  max_value: int = 20
  ops: str = "+-*"
  max_target: int = 1000
  name: str = dataclasses.field(default="countdown", init=False)
  required_fields: tuple = dataclasses.field(default=("solution",), init=False)   # the demonstration

  def __post_init__(self):
    _validate_ops(self.name, self.ops)
    for key in ("min_numbers", "max_numbers", "min_value", "max_value", "max_target"):
      _require(isinstance(getattr(self, key), (int, np.integer)), self.name,
               f"{key} must be an integer, got {getattr(self, key)!r}.")
    _require(2 <= self.min_numbers <= self.max_numbers <= 8, self.name,
             f"need 2 <= min_numbers <= max_numbers <= 8, got {self.min_numbers}, {self.max_numbers}.")
    _require(1 <= self.min_value <= self.max_value, self.name,
             f"need 1 <= min_value <= max_value, got {self.min_value}, {self.max_value}.")
    _require(self.max_target >= 1, self.name, f"max_target must be >= 1, got {self.max_target}.")

  def _expression(self, rng: np.random.Generator, numbers: list[int]) -> tuple[str, int]:
    parts = [(str(n), _ATOM) for n in numbers]
    while len(parts) > 1:
      i, j = rng.choice(len(parts), size=2, replace=False)
      op = self.ops[int(rng.integers(len(self.ops)))]
      joined = combine(parts[i], parts[j], op)
      parts = [p for k, p in enumerate(parts) if k not in (i, j)] + [joined]
    text = parts[0][0]
    return text, evaluate_expression(text)[0]

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    for _ in range(1000):
      count = int(rng.integers(self.min_numbers, self.max_numbers + 1))
      numbers = [int(n) for n in rng.integers(self.min_value, self.max_value + 1, size=count)]
      text, target = self._expression(rng, numbers)
      if 1 <= target <= self.max_target:
        puzzle = format_countdown(numbers, target)
        return {"prompt": puzzle + ":", "answer": puzzle, "solution": text}
    raise ValueError(f"task 'countdown': no target in [1, {self.max_target}] after 1000 draws; "
                     "raise max_target or add '+' to ops.")

  def extract_answer(self, completion_text: str) -> Optional[str]:
    """The expression: the completion's first line, stripped; None if it is empty."""
    line = completion_text.split("\n", 1)[0].strip()
    return line or None

  def verify(self, completion_text: str, answer: str) -> float:
    expression = self.extract_answer(completion_text)
    if expression is None:
      return 0.0
    allowed, target = parse_countdown(answer)
    try:
      value, used = evaluate_expression(expression)
    except ExpressionError:
      return 0.0
    if Counter(used) - Counter(allowed):      # some number used more often than it was given
      return 0.0
    return float(value == target)

  def demonstration(self, example: Mapping[str, Any]) -> str:
    return example["solution"]
