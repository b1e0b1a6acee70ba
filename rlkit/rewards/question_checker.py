"""R-Quest's checker (DESIGN, ../shared/methods/llm.md §5): whether a proposed question is valid, its exact
answer, and its semantic fingerprints (rlkit/rewards/rquest.py builds the rewards on them).

Question format: one or two variables bound in the text, ':', then an expression over them and non-negative
integers with + - * and parentheses: `a=3,b=5:a*b+2` (spaces between tokens are ignored). A question without a
variable is plain arithmetic, whose only semantic fingerprint is its answer, so the format needs one.

Fingerprints (a probabilistic polynomial identity test). The expression is a polynomial f over Z in its
variables. We evaluate f mod p = 2^61 − 1 at 8 fixed pseudo-random points (derived from blake2b of a fixed
label, so they are stable across processes and library versions) and hash the values to 64 bits. By
Schwartz-Zippel two different polynomials of degree ≤ d agree at a random point with probability ≤ d/p, so at
8 points with probability ≤ (d/p)^8 (d ≤ max_chars/2: negligible), plus a 64-bit hash collision (~n²/2^65 in a
bank of n). Variable names are canonicalised by trying every assignment of the question's variables to the two
point columns and keeping the smallest hash (renaming-invariant, not order-of-binding-dependent).

  level="skill"     the function only, up to renaming its variables: equates a+b and b+a, 2*(a+b) and 2*a+2*b,
                    x*y+2 and a*b+2 with any bound values, and a-b with b-a (b-a is a-b with a and b renamed),
                    and a+1 with b+1. Integer coefficients are part of the skill: a*b+2 and a*b+3 differ.
  level="instance"  the function AND the bound values, under one common renaming: the same question asked
                    twice. Equates a=3,b=5:a+b with b=5,a=3:b+a and x=3,y=5:x+y, and a=3,b=5:a-b with
                    a=5,b=3:b-a (a rename); tells a=3,b=5:a-b from a=3,b=5:b-a (answers −2 and 2) and
                    a=3:a*4 from a=4:a*4.
What neither level sees: equivalences beyond polynomial identity ("the same skill" with other coefficients, or
a*b vs a*a); a number moved between a literal and a variable (a=3:a*4, a=4:3*a and a=3,b=4:a*b all ask 3*4 and
are three instances of three skills); integer polynomials whose coefficients differ by a multiple of p (they
need literals near 2^61). It over-merges nothing but probability-≈0 coincidences: equal polynomials ARE merged,
including rewrites a learner might count as different (distributivity).

Validity reasons (`REASONS`, fixed strings for metrics), checked in this order: "length" (empty or longer than
max_chars), "parse", "rebound" (a variable bound twice), "arity" (not 1 or 2 variables bound), "unbound" (a
variable used but not bound), "unused" (the value does not depend on a bound variable: absent, or cancelled as
in b-b, which would let a proposer mint new instances by changing a dead value), "trivial" (no operator, or
the function is one of its variables, as a+0 or a*1: the answer is in the text), "range" (|answer| >
max_value), and "consensus" (the solver's agreement below τ_cons, from `consensus_valid`). Every parsed
question has a unique integer answer (no division), computed exactly.

Host-side code runs in the reward executor's worker through the module-level `analyse_question` (its
result packs to floats: a uint64 as two 32-bit halves).
"""
from __future__ import annotations

import hashlib
import itertools
import re
from typing import NamedTuple, Optional, Union

import numpy as np

from rlkit.data.tasks import MAX_EXPRESSION_CHARS, ExpressionError

MAX_VARIABLES = 2
MAX_VALUE = 1000            # default answer range: |answer| <= MAX_VALUE
MAX_CHARS = 48              # default question length
PRIME = (1 << 61) - 1       # Mersenne prime modulus of the identity test
NUM_POINTS = 8
LEVELS = ("instance", "skill")
REASONS = ("ok", "length", "parse", "rebound", "arity", "unbound", "unused", "trivial", "range", "consensus")

_TOKEN = re.compile(r"\s*(?:(\d+)|([a-z])|([-+*()]))")
_BINDING = re.compile(r"\s*([a-z])\s*=\s*(\d+)\s*")


def _point(k: int, column: int) -> int:
  digest = hashlib.blake2b(f"rlkit.rquest.point/{k}/{column}".encode(), digest_size=8).digest()
  return int.from_bytes(digest, "little") % (PRIME - 1) + 1


# POINTS[k][c]: column c of point k. Columns 0 and 1 take the question's variables; column 2 is the
# alternative value used to test whether f depends on a variable.
POINTS = tuple(tuple(_point(k, c) for c in range(MAX_VARIABLES + 1)) for k in range(NUM_POINTS))


# ------------------------------------------------------------------------------------------------- questions

Node = Union[int, str, tuple]    # a literal, a variable name, or (op, left, right)


class Question(NamedTuple):
  text: str
  bindings: tuple[tuple[str, int], ...]   # (name, value) in text order; a name may repeat (then "rebound")
  expression: Node
  used: tuple[str, ...]                   # distinct variables of the expression, in order of first use
  num_operators: int


def _parse_expression(text: str) -> tuple[Node, int]:
  """Recursive descent over the grammar of rlkit.data.tasks, with single lowercase letters as atoms."""
  tokens, pos = [], 0
  text = text.rstrip()
  while pos < len(text):
    m = _TOKEN.match(text, pos)
    if not m:
      raise ExpressionError(f"unexpected character at {pos}")
    tokens.append(int(m.group(1)) if m.group(1) else m.group(2) or m.group(3))
    pos = m.end()
  pos, ops = 0, 0

  def take():
    nonlocal pos
    if pos >= len(tokens):
      raise ExpressionError("expression ends early")
    pos += 1
    return tokens[pos - 1]

  def factor() -> Node:
    tok = take()
    if tok == "(":
      node = expr()
      if take() != ")":
        raise ExpressionError("missing ')'")
      return node
    if isinstance(tok, int) or tok.isalpha():
      return tok
    raise ExpressionError(f"expected a number, a variable or '(', got {tok!r}")

  def chain(operand, operators) -> Node:
    nonlocal ops
    node = operand()
    while pos < len(tokens) and tokens[pos] in operators:
      op = take()
      node, ops = (op, node, operand()), ops + 1
    return node

  def term() -> Node:
    return chain(factor, ("*",))

  def expr() -> Node:
    return chain(term, ("+", "-"))

  if not tokens:
    raise ExpressionError("empty expression")
  node = expr()
  if pos != len(tokens):
    raise ExpressionError(f"unexpected {tokens[pos]!r} after a complete expression")
  return node, ops


def _variables(node: Node, out: list) -> list:
  if isinstance(node, str):
    if node not in out:
      out.append(node)
  elif isinstance(node, tuple):
    _variables(node[1], out)
    _variables(node[2], out)
  return out


def parse_question(text: str) -> Optional[Question]:
  """`bindings:expression` as a Question, or None when the text is not of that form (never raises)."""
  if not isinstance(text, str) or len(text) > MAX_EXPRESSION_CHARS or text.count(":") != 1:
    return None
  head, body = text.split(":")
  bindings = []
  for part in head.split(",") if head.strip() else []:
    m = _BINDING.fullmatch(part)
    if not m:
      return None
    bindings.append((m.group(1), int(m.group(2))))
  try:
    expression, num_operators = _parse_expression(body)
  except ExpressionError:
    return None
  return Question(text, tuple(bindings), expression, tuple(_variables(expression, [])), num_operators)


def evaluate(node: Node, env: dict, modulus: Optional[int] = None) -> int:
  """The value of the expression with variables from `env`: exact, or mod `modulus`."""
  if isinstance(node, int):
    return node % modulus if modulus else node
  if isinstance(node, str):
    return env[node]
  op, left, right = node
  a, b = evaluate(left, env, modulus), evaluate(right, env, modulus)
  value = a + b if op == "+" else a - b if op == "-" else a * b
  return value % modulus if modulus else value


def _values_at_points(q: Question, column: dict, override: Optional[tuple[str, int]] = None) -> tuple[int, ...]:
  """f mod p at each point, variable `name` read from column column[name] (or `override`'s column)."""
  cols = dict(column, **dict([override])) if override else column
  return tuple(evaluate(q.expression, {n: POINTS[k][c] for n, c in cols.items()}, PRIME) for k in range(NUM_POINTS))


def _check_limits(max_value: int, max_chars: int) -> None:
  if isinstance(max_value, bool) or not isinstance(max_value, (int, np.integer)) or not 0 <= max_value <= 2 ** 53:
    raise ValueError(f"rquest: max_value must be an integer in [0, 2**53], got {max_value!r}.")
  if isinstance(max_chars, bool) or not isinstance(max_chars, (int, np.integer)) \
      or not 1 <= max_chars <= MAX_EXPRESSION_CHARS:
    raise ValueError(f"rquest: max_chars must be an integer in [1, {MAX_EXPRESSION_CHARS}], got {max_chars!r}.")


def check_validity(text: str, *, max_value: int = MAX_VALUE,
                   max_chars: int = MAX_CHARS) -> tuple[bool, str, Optional[int]]:
  """(valid, reason, answer): the reasons are in `REASONS` (module docstring); the answer only when valid."""
  _check_limits(max_value, max_chars)
  if not isinstance(text, str) or not text.strip() or len(text) > max_chars:
    return False, "length", None
  q = parse_question(text)
  if q is None:
    return False, "parse", None
  names = [name for name, _ in q.bindings]
  if len(set(names)) != len(names):
    return False, "rebound", None
  if not 1 <= len(names) <= MAX_VARIABLES:
    return False, "arity", None
  if set(q.used) - set(names):
    return False, "unbound", None
  column = {name: c for c, name in enumerate(names)}
  base = _values_at_points(q, column)
  if any(_values_at_points(q, column, (name, MAX_VARIABLES)) == base for name in names):
    return False, "unused", None
  if q.num_operators == 0 or any(base == tuple(p[c] for p in POINTS) for c in column.values()):
    return False, "trivial", None
  answer = evaluate(q.expression, dict(q.bindings))
  if abs(answer) > max_value:
    return False, "range", None
  return True, "ok", answer


def fingerprint(question: Union[Question, str], level: str = "instance") -> int:
  """A 64-bit semantic hash (module docstring: what each level equates and misses). Defined for any parsed
  question with at most two variable names; a text that does not parse raises a ValueError."""
  if level not in LEVELS:
    raise ValueError(f"fingerprint: unknown level {level!r}; valid levels: {list(LEVELS)}.")
  q = parse_question(question) if isinstance(question, str) else question
  if q is None:
    raise ValueError(f"fingerprint: {question!r} is not a question of the form 'a=3,b=5:a*b+2'.")
  names = sorted({name for name, _ in q.bindings} | set(q.used))
  if len(names) > MAX_VARIABLES:
    raise ValueError(f"fingerprint: {q.text!r} has {len(names)} variables; at most {MAX_VARIABLES}.")
  bound = {name: tuple(v for n, v in q.bindings if n == name) for name in names}
  best = None
  for columns in itertools.permutations(range(MAX_VARIABLES), len(names)):
    column = dict(zip(names, columns))
    key = f"{level}|{','.join(map(str, _values_at_points(q, column)))}"
    if level == "instance":     # the bound values, by column: the same renaming as the function's
      key += "|" + repr([next((bound[n] for n in names if column[n] == c), None) for c in range(MAX_VARIABLES)])
    digest = int.from_bytes(hashlib.blake2b(key.encode(), digest_size=8).digest(), "little")
    best = digest if best is None else min(best, digest)
  return best


ANALYSIS_FIELDS = ("valid", "reason", "answer", "instance_hi", "instance_lo", "skill_hi", "skill_lo")
ANALYSIS_FALLBACK = (0.0, float(REASONS.index("parse")), 0.0, 0.0, 0.0, 0.0, 0.0)   # a row that raised or hung


def analyse_question(text: str, max_value: int = MAX_VALUE, max_chars: int = MAX_CHARS) -> tuple[float, ...]:
  """One executor row (`ANALYSIS_FIELDS`, all exact in float64): validity, reason index, answer, and both
  fingerprints as 32-bit halves (0 where the text has no fingerprint). Decode with `unpack_analyses`."""
  valid, reason, answer = check_validity(text, max_value=max_value, max_chars=max_chars)
  q = parse_question(text) if isinstance(text, str) and len(text) <= max_chars else None
  halves = []
  for level in LEVELS:
    try:
      fp = fingerprint(q, level) if q is not None else 0
    except ValueError:          # more than two variable names: invalid ("arity" or "unbound"), no fingerprint
      fp = 0
    halves += [float(fp >> 32), float(fp & 0xFFFFFFFF)]
  return (float(valid), float(REASONS.index(reason)), float(answer or 0), *halves)


def unpack_analyses(values: np.ndarray) -> dict:
  """[N, 7] float64 rows of `analyse_question` -> valid bool[N], reason list[str], answer int64[N], and
  instance / skill fingerprints uint64[N]."""
  values = np.asarray(values, np.float64).reshape(-1, len(ANALYSIS_FIELDS))

  def fp(hi: int, lo: int) -> np.ndarray:
    return (values[:, hi].astype(np.uint64) << np.uint64(32)) | values[:, lo].astype(np.uint64)
  return {"valid": values[:, 0] > 0.5, "reason": [REASONS[int(i)] for i in values[:, 1]],
          "answer": values[:, 2].astype(np.int64), "instance": fp(3, 4), "skill": fp(5, 6)}
