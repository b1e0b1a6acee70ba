"""Worded and worked tasks of the pretraining corpus (experiments/base): problems the base model must read as
text and solve in steps, beside the terse tasks of tasks.py ("12+345=" -> "357").

  word_problems     "Ann has 12 apples and gets 7 more. How many apples does Ann have now?\n"
                    -> "12+7=19. Answer: 19"
  arithmetic_steps  "Work out 12+34*5.\n" -> "34*5=170, 12+170=182. Answer: 182"   (method "reduce")
                    "Work out 457+385.\n" -> "7+5=12 carry 1, 5+8+1=14 carry 1, 4+3+1=8. Answer: 842" ("columns")
  tool_calls        "What is 23 times 4?\n"
                    -> "<call>mul(23,4)</call><result>92</result><say>23 times 4 is 92.</say>"

All three grade a final answer in a fixed place ("Answer: N"; the tool call itself for `tool_calls`), so a
completion that merely mentions the number somewhere is not credited. `tool_calls` grades the call: in a
single-turn evaluation the model would have to invent the tool's result, which is the environment's job (the
multi-turn collector inserts it); the answer field keeps the call and the value.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Mapping, Optional

import numpy as np

from rlkit.data.tasks import TASKS, _canonical_int, _require, evaluate_expression

_ANSWER = re.compile(r"Answer: (-?\d+)")


def _digits_operand(rng: np.random.Generator, low: int, high: int) -> int:
  """A digit count uniform in [low, high], then a uniform value with that many digits."""
  digits = int(rng.integers(low, high + 1))
  return int(rng.integers(0 if digits == 1 else 10 ** (digits - 1), 10 ** digits))


def _graded_answer(completion_text: str) -> Optional[str]:
  m = _ANSWER.search(completion_text)
  return m.group(1) if m else None


def _verify_answer(completion_text: str, answer: str) -> float:
  got = _graded_answer(completion_text)
  return float(got is not None and _canonical_int(got) == _canonical_int(answer))


# ----------------------------------------------------------------------------------------------------------
# word_problems

NAMES = ("Ann", "Ben", "Cara", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jo")
THINGS = ("apple", "book", "coin", "stamp", "shell", "card", "pen", "egg", "rock", "cup")
# (template, operator); {n} name, {t} thing, {a} {b} {c} numbers. The value is a op b (then - c for "+-").
TEMPLATES = (
    ("{n} has {a} {t}s and gets {b} more. How many {t}s does {n} have now?", "+"),
    ("A box holds {a} {t}s. {n} puts in {b} more. How many {t}s are in the box?", "+"),
    ("{n} had {a} {t}s and gave {b} away. How many {t}s are left?", "-"),
    ("There were {a} {t}s on a shelf. {n} took {b}. How many {t}s are on the shelf now?", "-"),
    ("{n} buys {a} bags with {b} {t}s in each. How many {t}s is that?", "*"),
    ("There are {a} rows of {t}s with {b} in each row. How many {t}s are there?", "*"),
    ("{n} has {a} {t}s, finds {b} more and then loses {c}. How many {t}s does {n} have?", "+-"),
)


@TASKS.register("word_problems")
@dataclasses.dataclass(frozen=True)
class WordProblems:
  """A templated story over one or two operations; the demonstration writes the equation, then the answer.

  Sums and differences take operands of 1..max_digits digits, products a first factor of 1..max_digits and a
  second of one digit; a difference never goes below zero (a story cannot take away more than there is).
  """
  max_digits: int = 2
  name: str = dataclasses.field(default="word_problems", init=False)
  required_fields: tuple = dataclasses.field(default=("equation",), init=False)

  def __post_init__(self):
    _require(isinstance(self.max_digits, (int, np.integer)) and 1 <= self.max_digits <= 6, self.name,
             f"max_digits must be an integer in [1, 6], got {self.max_digits!r}.")

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    template, op = TEMPLATES[int(rng.integers(len(TEMPLATES)))]
    a, b = (_digits_operand(rng, 1, self.max_digits) for _ in range(2))
    c = 0
    if op == "*":
      b = int(rng.integers(2, 10))
      equation = f"{a}*{b}={a * b}"
    elif op == "-":
      a, b = max(a, b), min(a, b)
      equation = f"{a}-{b}={a - b}"
    elif op == "+":
      equation = f"{a}+{b}={a + b}"
    else:
      c = int(rng.integers(0, a + b + 1))
      equation = f"{a}+{b}={a + b}, {a + b}-{c}={a + b - c}"
    value = int(equation.rsplit("=", 1)[1])
    text = template.format(n=NAMES[int(rng.integers(len(NAMES)))], t=THINGS[int(rng.integers(len(THINGS)))],
                           a=a, b=b, c=c)
    return {"prompt": text + "\n", "answer": str(value), "equation": equation}

  def extract_answer(self, completion_text: str) -> Optional[str]:
    return _graded_answer(completion_text)

  def verify(self, completion_text: str, answer: str) -> float:
    return _verify_answer(completion_text, answer)

  def demonstration(self, example: Mapping[str, Any]) -> str:
    return f"{example['equation']}. Answer: {example['answer']}"

  def category(self, example: Mapping[str, Any]) -> str:
    return "two_step" if "," in (example.get("fields") or example)["equation"] else "one_step"


# ----------------------------------------------------------------------------------------------------------
# arithmetic_steps


def reduction_steps(expression: str) -> list[str]:
  """The steps that evaluate an expression without parentheses, products first, then left to right:
  "12+34*5" -> ["34*5=170", "12+170=182"]. Each step is "a op b = c" on the current values."""
  tokens = re.findall(r"\d+|[-+*]", expression)
  values, ops = [int(t) for t in tokens[0::2]], tokens[1::2]
  steps = []
  for round_ops in ("*", "+-"):
    i = 0
    while i < len(ops):
      if ops[i] in round_ops:
        a, b, op = values[i], values[i + 1], ops[i]
        c = a * b if op == "*" else a + b if op == "+" else a - b
        steps.append(f"{a}{op}{b}={c}")
        values[i:i + 2], ops[i:i + 1] = [c], []
      else:
        i += 1
  return steps


def column_steps(a: int, b: int) -> list[str]:
  """Column addition, right to left: "457+385" -> ["7+5=12 carry 1", "5+8+1=14 carry 1", "4+3+1=8"]."""
  da, db = str(a)[::-1], str(b)[::-1]
  steps, carry = [], 0
  for i in range(max(len(da), len(db))):
    x, y = int(da[i]) if i < len(da) else 0, int(db[i]) if i < len(db) else 0
    total = x + y + carry
    step = f"{x}+{y}" + (f"+{carry}" if carry else "") + f"={total}"
    carry = total // 10
    steps.append(step + (f" carry {carry}" if carry else ""))
  return steps


@TASKS.register("arithmetic_steps")
@dataclasses.dataclass(frozen=True)
class ArithmeticSteps:
  """Arithmetic solved in written steps: `reduce` evaluates `num_operands` operands over `ops` one operation
  at a time (products first); `columns` adds two numbers digit by digit with carries. Prompt "Work out E.\\n"."""
  method: str = "reduce"
  ops: str = "+-*"
  min_digits: int = 1
  max_digits: int = 2
  num_operands: int = 3
  name: str = dataclasses.field(default="arithmetic_steps", init=False)
  required_fields: tuple = dataclasses.field(default=("steps",), init=False)

  def __post_init__(self):
    _require(self.method in ("reduce", "columns"), self.name,
             f"method must be 'reduce' or 'columns', got {self.method!r}.")
    _require(isinstance(self.ops, str) and len(self.ops) > 0 and set(self.ops) <= set("+-*"), self.name,
             f"ops must be a non-empty subset of '+-*', got {self.ops!r}.")
    _require(1 <= self.min_digits <= self.max_digits <= 12, self.name,
             f"need 1 <= min_digits <= max_digits <= 12, got {self.min_digits}, {self.max_digits}.")
    _require(self.num_operands >= 2, self.name, f"num_operands must be >= 2, got {self.num_operands}.")

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    if self.method == "columns":
      a, b = (_digits_operand(rng, self.min_digits, self.max_digits) for _ in range(2))
      text, steps = f"{a}+{b}", column_steps(a, b)
    else:
      text = str(_digits_operand(rng, self.min_digits, self.max_digits))
      for _ in range(self.num_operands - 1):
        text += self.ops[int(rng.integers(len(self.ops)))] + str(_digits_operand(rng, self.min_digits,
                                                                                  self.max_digits))
      steps = reduction_steps(text)
    value, _ = evaluate_expression(text)
    return {"prompt": f"Work out {text}.\n", "answer": str(value), "steps": steps}

  def extract_answer(self, completion_text: str) -> Optional[str]:
    return _graded_answer(completion_text)

  def verify(self, completion_text: str, answer: str) -> float:
    return _verify_answer(completion_text, answer)

  def demonstration(self, example: Mapping[str, Any]) -> str:
    return f"{', '.join(example['steps'])}. Answer: {example['answer']}"


# ----------------------------------------------------------------------------------------------------------
# tool_calls

TOOL_OPS = {"add": ("+", "plus"), "sub": ("-", "minus"), "mul": ("*", "times")}
_CALL = re.compile(r"<call>(\w+)\((\d+),(\d+)\)</call>")


def format_call(tool: str, a: int, b: int) -> str:
  return f"<call>{tool}({a},{b})</call>"


@TASKS.register("tool_calls")
@dataclasses.dataclass(frozen=True)
class ToolCalls:
  """A question a calculator answers: the completion calls the tool, reads its result, and says the answer.
  Graded on the call (tool name and arguments exactly); `answer` is "call|value", e.g. "mul(23,4)|92"."""
  tools: str = "add,sub,mul"
  max_digits: int = 4
  name: str = dataclasses.field(default="tool_calls", init=False)
  required_fields: tuple = dataclasses.field(default=(), init=False)

  def __post_init__(self):
    tools = tuple(self.tools.split(",")) if isinstance(self.tools, str) else ()
    _require(bool(tools) and set(tools) <= set(TOOL_OPS), self.name,
             f"tools must be a comma-separated subset of {','.join(TOOL_OPS)}, got {self.tools!r}.")
    _require(isinstance(self.max_digits, (int, np.integer)) and 1 <= self.max_digits <= 9, self.name,
             f"max_digits must be an integer in [1, 9], got {self.max_digits!r}.")

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    tools = self.tools.split(",")
    tool = tools[int(rng.integers(len(tools)))]
    a, b = (_digits_operand(rng, 1, self.max_digits) for _ in range(2))
    if tool == "sub":
      a, b = max(a, b), min(a, b)
    symbol, word = TOOL_OPS[tool]
    value, _ = evaluate_expression(f"{a}{symbol}{b}")
    return {"prompt": f"What is {a} {word} {b}?\n", "answer": f"{tool}({a},{b})|{value}"}

  def extract_answer(self, completion_text: str) -> Optional[str]:
    m = _CALL.search(completion_text)
    return f"{m.group(1)}({int(m.group(2))},{int(m.group(3))})" if m else None

  def verify(self, completion_text: str, answer: str) -> float:
    got = self.extract_answer(completion_text)
    return float(got is not None and got == answer.split("|", 1)[0])

  def demonstration(self, example: Mapping[str, Any]) -> str:
    call, value = example["answer"].split("|", 1)
    tool, args = call.split("(", 1)
    a, b = args.rstrip(")").split(",")
    return (f"{format_call(tool, int(a), int(b))}<result>{value}</result>"
            f"<say>{a} {TOOL_OPS[tool][1]} {b} is {value}.</say>")
