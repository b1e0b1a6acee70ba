"""`rquest_questions`: R-Quest's question language as a task (DESIGN, ../shared/methods/llm.md §5;
rlkit/rewards/question_checker.py has the checker and fingerprints, rlkit/train/rquest_stage.py the stage).

A question binds one or two variables and asks for an expression over them: `a=3,b=5:a*b+2`. The task has
two roles, one per model of the R-Quest stage:

  role="solve"    prompt "a=3,b=5:a*b+2="  answer "17"     the solver: held-out accuracy and its SFT data.
                  Every example also carries `bindings` ("a=3,b=5:"), the proposer's prompt in the stage.
  role="propose"  prompt "a=3,b=5:"        demonstration "a*b+2"   the proposer's SFT data: given the bound
                  values, write the expression (`verify`: the question it makes is valid). A share `judge_frac`
                  of the examples are reject-head examples instead: prompt "a=3,b=5:a*c?" (a question and
                  rquest.JUDGE_SUFFIX), demonstration "V" or "I" as the checker decides, about half invalid.

Questions are drawn by `random_question`: bound values in [0, max_bound], names from `names`, 1 to
`max_operators` operators over the bound variables (each used at least once) and literals in [0, max_literal],
kept only when `check_validity` accepts them (so the solver's data never contains what the checker rejects).
Invalid drafts for the reject head come from `corrupt`: a valid question with one of the checker's failure
modes injected (an unbound variable, a bound variable replaced by a literal, a dangling operator, a zero
term), labelled by the checker itself, never by the corruption's intent.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Mapping, Optional

import numpy as np

from rlkit.data.tasks import _LEADING_INT, TASKS, _canonical_int, _require
from rlkit.rewards import question_checker as checker   # attributes read at call time: the reward worker
                                                       # imports the checker first, and it imports this package
from rlkit.rewards.rquest import judge_prompt, judge_target, parse_judgment

ROLES = ("solve", "propose")
OPERATORS = "+-*"


def _expression(rng: np.random.Generator, names: list, operators: int, max_literal: int) -> str:
  """A random expression with `operators` binary operators whose leaves include every name once at least."""
  leaves = list(names) + [None] * (operators + 1 - len(names))
  rng.shuffle(leaves)
  leaves = [str(int(rng.integers(0, max_literal + 1))) if x is None else x for x in leaves]
  text = leaves[0]
  for leaf in leaves[1:]:
    op = OPERATORS[int(rng.integers(len(OPERATORS)))]
    if op == "*" and rng.random() < 0.5 and ("+" in text or "-" in text):
      text = f"({text})"              # sometimes the product of a sum: parentheses appear in the language
    text = f"{text}{op}{leaf}"
  return text


def random_question(rng: np.random.Generator, *, names: str = "abxy", max_bound: int = 9, max_literal: int = 9,
                    max_operators: int = 2, max_value: int = 1000) -> tuple[str, str, int]:
  """(bindings "a=3,b=5:", expression "a*b+2", answer): a question the checker accepts (drawn until one is)."""
  for _ in range(1000):
    arity = int(rng.integers(1, 3))
    chosen = [names[i] for i in rng.choice(len(names), size=arity, replace=False)]
    bindings = ",".join(f"{n}={int(rng.integers(0, max_bound + 1))}" for n in chosen) + ":"
    operators = int(rng.integers(max(1, arity - 1), max_operators + 1))
    expression = _expression(rng, chosen, operators, max_literal)
    valid, _, answer = checker.check_validity(bindings + expression, max_value=max_value)
    if valid:
      return bindings, expression, int(answer)
  raise ValueError(f"random_question: no valid question in 1000 draws (names={names!r}, max_bound={max_bound}, "
                   f"max_operators={max_operators}, max_value={max_value}); widen max_value.")


def corrupt(rng: np.random.Generator, bindings: str, expression: str) -> str:
  """The expression with one of the checker's failure modes injected (the checker labels the result)."""
  bound = [part.split("=")[0] for part in bindings[:-1].split(",")]
  kind = int(rng.integers(4))
  if kind == 0:                                   # an unbound variable
    free = [c for c in "abcxyz" if c not in bound]
    return expression.replace(bound[int(rng.integers(len(bound)))], free[int(rng.integers(len(free)))], 1)
  if kind == 1:                                   # a bound variable no longer used
    return expression.replace(bound[int(rng.integers(len(bound)))], str(int(rng.integers(10))))
  if kind == 2:                                   # a dangling operator: does not parse
    return expression + OPERATORS[int(rng.integers(len(OPERATORS)))]
  return f"{bound[0]}*0+{expression}" if rng.random() < 0.5 else f"{bound[0]}"    # dead or trivial


@TASKS.register("rquest_questions")
@dataclasses.dataclass(frozen=True)
class Questions:
  """Questions `bindings:expression` for R-Quest's solver (role="solve") or proposer (role="propose")."""
  role: str = "solve"
  names: str = "abxy"          # variable names a question may bind
  max_bound: int = 9           # bound values in [0, max_bound]
  max_literal: int = 9         # literals in [0, max_literal]
  max_operators: int = 2       # 1 to this many binary operators
  max_value: int = 1000        # |answer| limit of the checker (its MAX_VALUE)
  judge_frac: float = 0.0      # role="propose": share of reject-head examples (question? -> V or I)
  name: str = dataclasses.field(default="rquest_questions", init=False)
  required_fields: tuple = dataclasses.field(default=(), init=False)

  def __post_init__(self):
    _require(self.role in ROLES, self.name, f"role must be one of {list(ROLES)}, got {self.role!r}.")
    _require(isinstance(self.names, str) and 2 <= len(set(self.names)) == len(self.names)
             and self.names.isalpha() and self.names.islower(), self.name,
             f"names must be at least 2 distinct lower-case letters, got {self.names!r}.")
    for key in ("max_bound", "max_literal", "max_operators", "max_value"):
      value = getattr(self, key)
      _require(isinstance(value, (int, np.integer)) and not isinstance(value, bool) and value >= 0, self.name,
               f"{key} must be a non-negative integer, got {value!r}.")
    _require(1 <= self.max_operators <= 4, self.name, f"max_operators must be in [1, 4], got {self.max_operators}.")
    _require(isinstance(self.judge_frac, (int, float)) and 0.0 <= self.judge_frac <= 1.0, self.name,
             f"judge_frac must be in [0, 1], got {self.judge_frac!r}.")
    _require(self.role == "propose" or not self.judge_frac, self.name,
             "judge_frac is the proposer's reject-head share; use it with role='propose'.")
    if self.role == "solve":                   # the stage reads the proposer's prompt from every example
      object.__setattr__(self, "required_fields", ("bindings",))

  def _question(self, rng):
    return random_question(rng, names=self.names, max_bound=self.max_bound, max_literal=self.max_literal,
                           max_operators=self.max_operators, max_value=self.max_value)

  def make_example(self, rng: np.random.Generator) -> dict[str, Any]:
    bindings, expression, answer = self._question(rng)
    if self.role == "solve":
      return {"prompt": f"{bindings}{expression}=", "answer": str(answer), "bindings": bindings}
    if rng.random() < self.judge_frac:
      draft = expression if rng.random() < 0.5 else corrupt(rng, bindings, expression)
      valid = checker.check_validity(bindings + draft, max_value=self.max_value)[0]
      return {"prompt": judge_prompt(bindings + draft), "answer": judge_target(valid), "expression": ""}
    return {"prompt": bindings, "answer": bindings, "expression": expression}

  def extract_answer(self, completion_text: str) -> Optional[str]:
    if self.role == "solve":
      m = _LEADING_INT.match(completion_text)
      return m.group(1) if m else None
    return completion_text.strip()

  def verify(self, completion_text: str, answer: str) -> float:
    """solve: the integer is right; propose: the question `answer + completion` is valid, or for a reject-head
    example (answer "V" or "I") the verdict is the checker's."""
    if self.role == "solve":
      got = self.extract_answer(completion_text)
      return float(got is not None and _canonical_int(got) == _canonical_int(answer))
    if not answer.endswith(":"):
      return float(parse_judgment(completion_text) == (answer == judge_target(True)))
    return float(checker.check_validity(answer + completion_text.strip(), max_value=self.max_value)[0])

  def demonstration(self, example: Mapping[str, Any]) -> str:
    return example.get("expression") or example["answer"]

