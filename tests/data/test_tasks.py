"""Tasks: the expression parser, generators (determinism, ranges, solvability) and exact verifiers."""
import re

import numpy as np
import pytest

from rlkit.data import TASKS, make_task
from rlkit.data.tasks import (MAX_EXPRESSION_CHARS, ExpressionError, combine, evaluate_expression,
                              parse_countdown)

# ---------------------------------------------------------------------------------------------- parser


@pytest.mark.parametrize("text,value,numbers", [
    ("2+3*4", 14, [2, 3, 4]), ("(2+3)*4", 20, [2, 3, 4]), ("10-2-3", 5, [10, 2, 3]),
    ("10-(2-3)", 11, [10, 2, 3]), (" 7 * 3 + 5 ", 26, [7, 3, 5]), ("((42))", 42, [42]), ("0", 0, [0]),
])
def test_evaluate_expression(text, value, numbers):
  assert evaluate_expression(text) == (value, numbers)


@pytest.mark.parametrize("text", ["", "  ", "2+", "(2+3", "2+3)", "2 3", "21/3", "-2+3", "2**3", "()",
                                  "2+(*3)", "x", "7*3=21", "1" * (MAX_EXPRESSION_CHARS + 1)])
def test_evaluate_expression_rejects_malformed(text):
  with pytest.raises(ExpressionError):
    evaluate_expression(text)


def test_combine_adds_exactly_the_needed_parentheses():
  """Property: text built by `combine` over random trees evaluates to the tree's value."""
  rng = np.random.default_rng(0)
  ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
  for _ in range(300):
    leaves = [int(v) for v in rng.integers(0, 10, size=int(rng.integers(2, 6)))]
    parts = [((str(v), 3), v) for v in leaves]
    while len(parts) > 1:
      left, lv = parts.pop(int(rng.integers(len(parts))))
      right, rv = parts.pop(int(rng.integers(len(parts))))
      op = "+-*"[int(rng.integers(3))]
      parts.append((combine(left, right, op), ops[op](lv, rv)))
    (text, _), value = parts[0]
    assert evaluate_expression(text)[0] == value, text
  assert combine(("1+2", 1), ("3+4", 1), "-")[0] == "1+2-(3+4)"
  assert combine(("1+2", 1), ("3*4", 2), "*")[0] == "(1+2)*3*4"


# ---------------------------------------------------------------------------------------------- registry


def test_registry_and_parameter_validation():
  assert {"arithmetic", "countdown", "jsonl"} <= set(TASKS.names())
  with pytest.raises(KeyError, match="arithmetic"):
    make_task("arithmetc")
  with pytest.raises(ValueError, match=r"unknown parameter\(s\) \['digits'\].*min_digits"):
    make_task("arithmetic", digits=3)
  for kwargs, message in [({"ops": "/"}, "subset of '\\+-\\*'"), ({"ops": ""}, "non-empty"),
                          ({"min_digits": 3, "max_digits": 2}, "min_digits <= max_digits"),
                          ({"num_operands": 1}, "num_operands"), ({"max_digits": 2.5}, "integer")]:
    with pytest.raises(ValueError, match=message):
      make_task("arithmetic", **kwargs)
  with pytest.raises(ValueError, match="min_value"):
    make_task("countdown", min_value=0)


def test_tasks_declare_the_fields_their_examples_carry():
  for name, kwargs in [("arithmetic", {}), ("countdown", {})]:
    task = make_task(name, **kwargs)
    assert isinstance(task.required_fields, tuple) and all(isinstance(f, str) for f in task.required_fields)
    example = task.make_example(np.random.default_rng(0))
    assert set(task.required_fields) <= set(example)
  assert make_task("countdown").required_fields == ("solution",)
  with pytest.raises(ValueError, match="unknown parameter"):     # fixed by the generator, not by config
    make_task("arithmetic", required_fields=("x",))


@pytest.mark.parametrize("name,kwargs", [("arithmetic", {"ops": "+-*", "num_operands": 3}),
                                         ("countdown", {})])
def test_examples_are_deterministic_per_seed(name, kwargs):
  task = make_task(name, **kwargs)

  def draw(seed):
    rng = np.random.default_rng(seed)
    return [task.make_example(rng) for _ in range(20)]

  assert draw(3) == draw(3)
  assert draw(3) != draw(4)


# ---------------------------------------------------------------------------------------------- arithmetic


def test_arithmetic_examples_are_correct_and_in_range():
  task = make_task("arithmetic", ops="+-*", min_digits=2, max_digits=3)
  rng = np.random.default_rng(0)
  ops = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
  for _ in range(200):
    ex = task.make_example(rng)
    a, op, b = re.fullmatch(r"(\d+)([-+*])(\d+)=", ex["prompt"]).groups()
    assert 2 <= len(a) <= 3 and 2 <= len(b) <= 3 and not a.startswith("0") and not b.startswith("0")
    assert int(ex["answer"]) == ops[op](int(a), int(b))
    assert task.demonstration(ex) == ex["answer"]
    assert task.verify(task.demonstration(ex), ex["answer"]) == 1.0


@pytest.mark.parametrize("completion,extracted", [
    ("357", "357"), ("357abc", "357"), ("12-3", "12"), ("-5", "-5"), ("  42\n", "42"), ("007", "007"),
    ("", None), ("abc", None), ("-", None), ("--5", None), ("+5", None), ("x357", None),
])
def test_arithmetic_extract_answer(completion, extracted):
  assert make_task("arithmetic").extract_answer(completion) == extracted


@pytest.mark.parametrize("completion,answer,score", [
    ("357", "357", 1.0), ("357 is it", "357", 1.0), ("0357", "357", 1.0), ("-12", "-12", 1.0),
    ("358", "357", 0.0), ("12", "-12", 0.0), ("", "357", 0.0), ("three", "3", 0.0), ("35 7", "357", 0.0),
    ("-0", "0", 1.0), ("-00", "0", 1.0), ("0", "-1", 0.0), ("9" * 5000, "357", 0.0),   # int() refuses 5000 digits
])
def test_arithmetic_verify(completion, answer, score):
  assert make_task("arithmetic").verify(completion, answer) == score


# ---------------------------------------------------------------------------------------------- countdown


def test_countdown_examples_are_solvable_with_their_demonstration():
  task = make_task("countdown", min_numbers=3, max_numbers=4, min_value=1, max_value=12, max_target=200)
  rng = np.random.default_rng(1)
  for _ in range(200):
    ex = task.make_example(rng)
    numbers, target = parse_countdown(ex["answer"])
    assert ex["prompt"] == ex["answer"] + ":"
    assert 3 <= len(numbers) <= 4 and all(1 <= n <= 12 for n in numbers) and 1 <= target <= 200
    value, used = evaluate_expression(task.demonstration(ex))
    assert value == target and sorted(used) == sorted(numbers)   # the demonstration uses every number once
    assert task.verify(task.demonstration(ex), ex["answer"]) == 1.0


@pytest.mark.parametrize("completion,score", [
    ("7*3+5", 1.0), ("5+3*7", 1.0), ("(7*3)+5", 1.0), (" 7 * 3 + 5 \nthat's it", 1.0),
    ("7*3+5+5-5", 0.0),   # reuses 5
    ("21+5", 0.0),        # 21 is not given
    ("7*3-5", 0.0),       # wrong value
    ("7*(3+5", 0.0), ("7*3+", 0.0), ("", 0.0), ("\n7*3+5", 0.0), ("7*3+5=26", 0.0),   # malformed
    ("35/7+21", 0.0),     # division is not allowed
])
def test_countdown_verify(completion, score):
  assert make_task("countdown").verify(completion, "7 3 5>26") == score


def test_countdown_verify_multisets_and_subsets():
  task = make_task("countdown")
  assert task.verify("6*6", "6 6 2>36") == 1.0        # a number given twice may be used twice
  assert task.verify("6*6*1", "6 2 1>36") == 0.0      # ... but not when given once
  assert task.verify("9*4", "9 4 2 7>36") == 1.0      # not every number has to be used


def test_countdown_extract_answer():
  task = make_task("countdown")
  assert task.extract_answer(" 7*3+5 \nextra") == "7*3+5"
  assert task.extract_answer("\n") is None
  assert task.extract_answer("") is None
