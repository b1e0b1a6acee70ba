"""R-Quest: rewards for a model that writes its own practice questions (DESIGN, ../shared/methods/llm.md §5).

R-Quest is our design, not a paper's method; only the frontier term u is R-Zero's (FOUND). A proposer writes a
question q, a solver samples G answers, p̂ = the share agreeing with the majority answer, and

  u(q)  = 1 − 2|p̂ − ½|                                   R-Zero's uncertainty ("frontier") term
  v(q)  = checker-valid(q) · 1[p̂ ≥ τ_cons]                parses, well-posed, solver consensus
  d(q)  = 1[fingerprint(q) ∈ memory bank ∪ earlier rows]  semantic duplicate, persistent across iterations
  r(q)  = v · (u − λ_dup · d) − λ_inv · (1 − v)           proposer reward
  r_rej = 1[judge(q) == checker-valid(q)]                 reject head: the model's VALID/INVALID call on a draft
  r_R0  = u − λ_rep · rep(q)                              R-Zero-style baseline, rep = within-batch trigram overlap

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

The memory bank is a NamedTuple of fixed-shape numpy arrays (a pytree: orbax saves and restores it exactly),
kept compact in recency order: slots [0, cursor) hold the live fingerprints, oldest last-seen first; adding a
known fingerprint refreshes its step and moves it to the newest end, and past the capacity the oldest are
evicted. Functions are pure: they return a new bank. Host-side code runs in the executor's worker through the
module-level `analyse_question` (its result packs to floats: a uint64 as two 32-bit halves). The proposer and
solver stages, the prompt source and the bank's place in the train state live in the trainer.
"""
from __future__ import annotations

import hashlib
import itertools
import re
from collections import Counter
from typing import NamedTuple, Optional, Sequence, Union

import numpy as np

from rlkit.data.tasks import MAX_EXPRESSION_CHARS, ExpressionError

MAX_VARIABLES = 2
MAX_VALUE = 1000            # default answer range: |answer| <= MAX_VALUE
MAX_CHARS = 48              # default question length
PRIME = (1 << 61) - 1       # Mersenne prime modulus of the identity test
NUM_POINTS = 8
LEVELS = ("instance", "skill")
REASONS = ("ok", "length", "parse", "rebound", "arity", "unbound", "unused", "trivial", "range", "consensus")
JUDGE_SUFFIX = "?"          # reject head prompt: the question then "?"; completion "V" (valid) or "I" (invalid)
JUDGE_VALID, JUDGE_INVALID = "V", "I"

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


# ----------------------------------------------------------------------------------------------- memory bank

class MemoryBank(NamedTuple):
  """Fingerprints seen across iterations; slots [0, cursor) are live, oldest last-seen first."""
  hashes: np.ndarray      # [C] uint64, 0 in empty slots
  steps: np.ndarray       # [C] int64 step each fingerprint was last added at, -1 in empty slots
  valid: np.ndarray       # [C] bool, arange(C) < cursor
  cursor: np.ndarray      # [] int64 number of live entries: the next slot written


def bank_init(capacity: int) -> MemoryBank:
  if isinstance(capacity, bool) or not isinstance(capacity, (int, np.integer)) or capacity < 1:
    raise ValueError(f"bank_init: capacity must be a positive integer, got {capacity!r}.")
  return MemoryBank(np.zeros(capacity, np.uint64), np.full(capacity, -1, np.int64), np.zeros(capacity, bool),
                    np.asarray(0, np.int64))


def _as_fingerprints(fps) -> np.ndarray:
  return np.asarray(fps, dtype=np.uint64).reshape(-1)


def bank_contains(bank: MemoryBank, fps, *, now: Optional[int] = None, max_age: Optional[int] = None) -> np.ndarray:
  """bool[N]: fingerprint n is in the bank (and, with now and max_age, was last seen at a step >= now − max_age:
  a decaying memory)."""
  if (now is None) != (max_age is None):
    raise ValueError("bank_contains: pass both now and max_age, or neither.")
  live = bank.valid if max_age is None else bank.valid & (bank.steps >= now - max_age)
  return np.isin(_as_fingerprints(fps), bank.hashes[live])


def bank_add(bank: MemoryBank, fps, step: int) -> MemoryBank:
  """The bank with `fps` added at `step` (a duplicate within the call counts once; a known fingerprint gets the
  new step and becomes the newest); past the capacity the oldest last-seen entries are evicted."""
  capacity, count = bank.hashes.shape[0], int(bank.cursor)
  if count and step < bank.steps[count - 1]:
    raise ValueError(f"bank_add: step {step} is before the bank's latest step {int(bank.steps[count - 1])}.")
  fps = _as_fingerprints(fps)
  first = np.sort(np.unique(fps, return_index=True)[1])
  fresh = fps[first]                                 # first occurrences, in call order
  old = ~np.isin(bank.hashes[:count], fresh)
  hashes = np.concatenate([bank.hashes[:count][old], fresh])[-capacity:]
  steps = np.concatenate([bank.steps[:count][old], np.full(fresh.size, step, np.int64)])[-capacity:]
  n = hashes.size
  return MemoryBank(np.concatenate([hashes, np.zeros(capacity - n, np.uint64)]),
                    np.concatenate([steps, np.full(capacity - n, -1, np.int64)]),
                    np.arange(capacity) < n, np.asarray(n, np.int64))


def duplicate_flags(bank: MemoryBank, fps, *, within_batch: bool = True, now: Optional[int] = None,
                    max_age: Optional[int] = None) -> np.ndarray:
  """d(q), bool[N]: in the bank, or (within_batch) equal to an earlier row's fingerprint (the first one of a
  batch is the novel one). Call before `bank_add` of the same batch."""
  fps = _as_fingerprints(fps)
  dup = bank_contains(bank, fps, now=now, max_age=max_age)
  if within_batch:
    seen = np.zeros(fps.size, bool)
    seen[np.sort(np.unique(fps, return_index=True)[1])] = True
    dup |= ~seen
  return dup


# ---------------------------------------------------------------------------------------------------- rewards

def _array(x):
  return np.asarray(x, np.float64) if isinstance(x, (list, tuple, int, float, bool)) else x


def frontier(agree_frac):
  """u = 1 − 2|p̂ − ½| (R-Zero): 1 at p̂ = ½, 0 when the solver always or never agrees. numpy or jax arrays."""
  return 1.0 - 2.0 * abs(_array(agree_frac) - 0.5)


def rquest_reward(valid, agree_frac, dup, *, lam_dup: float = 0.5, lam_inv: float = 0.5):
  """r = v·(u − λ_dup·d) − λ_inv·(1 − v), elementwise over any shape; numpy or jax arrays (jit-able)."""
  valid, dup = _array(valid) * 1.0, _array(dup) * 1.0
  return valid * (frontier(agree_frac) - lam_dup * dup) - lam_inv * (1.0 - valid)


def solver_agreement(answers: Sequence[Sequence[Optional[str]]]) -> tuple[list[Optional[str]], np.ndarray]:
  """(majority answer [N], p̂ [N] float64) from G solver answers per question. p̂ is the share of all G
  samples equal to the majority; None (no answer extracted) never agrees. A tie goes to the answer sampled
  first; a row with no answer has majority None and p̂ = 0. Answers compare as given: canonicalise first."""
  majority, agree = [], np.zeros(len(answers), np.float64)
  for i, row in enumerate(answers):
    counts = Counter(a for a in row if a is not None)     # insertion order = order of first sampling
    if not counts:
      majority.append(None)
      continue
    best = max(counts.items(), key=lambda item: item[1])   # max keeps the first of equal counts
    majority.append(best[0])
    agree[i] = best[1] / len(row)
  return majority, agree


def consensus_valid(valid, agree_frac, *, tau_cons: float = 0.25) -> np.ndarray:
  """v = checker-valid ∧ p̂ ≥ τ_cons (a consistent-but-wrong majority still passes: the known pitfall)."""
  return np.asarray(valid, bool) & (np.asarray(agree_frac, np.float64) >= tau_cons)


def _trigrams(text: str) -> frozenset:
  return frozenset(text[i:i + 3] for i in range(len(text) - 2)) if len(text) >= 3 else frozenset([text])


def surface_repetition(texts: Sequence[str], *, threshold: float = 0.5) -> np.ndarray:
  """rep [N] in [0, 1]: the share of the other N − 1 questions of the batch whose character-trigram Jaccard
  similarity to this one is >= threshold. A cluster-free stand-in for R-Zero's penalty (the size of the
  question's BLEU-distance cluster over the batch size): surface only, and within the batch only."""
  grams = [_trigrams(t) for t in texts]
  n = len(grams)
  rep = np.zeros(n, np.float64)
  for i, j in itertools.combinations(range(n), 2):
    if len(grams[i] & grams[j]) >= threshold * len(grams[i] | grams[j]):
      rep[i] += 1.0
      rep[j] += 1.0
  return rep / max(n - 1, 1)


def rzero_reward(agree_frac, repetition, *, lam_rep: float = 1.0):
  """The baseline: u − λ_rep·rep, with no validity gate and no memory."""
  return frontier(agree_frac) - lam_rep * _array(repetition)


# ------------------------------------------------------------------------------------------------ reject head

def judge_prompt(question_text: str) -> str:
  return question_text + JUDGE_SUFFIX


def judge_target(valid: bool) -> str:
  """The completion a correct reject head writes (the SFT demonstration)."""
  return JUDGE_VALID if valid else JUDGE_INVALID


def parse_judgment(completion: str) -> Optional[bool]:
  """True for "V", False for "I" (the first non-space character), None for anything else."""
  head = completion.lstrip()[:1]
  return True if head == JUDGE_VALID else False if head == JUDGE_INVALID else None


def reject_reward(said_valid: Sequence[Optional[bool]], valid) -> np.ndarray:
  """1 where the reject head's judgment matches the checker, 0 where it does not or it gave none (None)."""
  valid = np.asarray(valid, bool).reshape(-1)
  if len(said_valid) != valid.size:
    raise ValueError(f"reject_reward: {len(said_valid)} judgments for {valid.size} questions.")
  return np.array([s is not None and bool(s) == v for s, v in zip(said_valid, valid)], np.float64)
