"""R-Quest: rewards for a model that writes its own practice questions (DESIGN, ../shared/methods/llm.md §5).

R-Quest is our design, not a paper's method; only the frontier term u is R-Zero's (FOUND). A proposer writes a
question q, a solver samples G answers, p̂ = the share agreeing with the majority answer, and

  u(q)  = 1 − 2|p̂ − ½|                                   R-Zero's uncertainty ("frontier") term
  v(q)  = checker-valid(q) · 1[p̂ ≥ τ_cons]                parses, well-posed, solver consensus
  d(q)  = 1[fingerprint(q) ∈ memory bank ∪ earlier rows]  semantic duplicate, persistent across iterations
  r(q)  = v · (u − λ_dup · d) − λ_inv · (1 − v)           proposer reward
  r_rej = 1[judge(q) == checker-valid(q)]                 reject head: the model's VALID/INVALID call on a draft
  r_R0  = u − λ_rep · rep(q)                              R-Zero-style baseline, rep = within-batch trigram overlap

The question language, its checker and the fingerprints that d(q) compares: rlkit/rewards/question_checker.py.
`PROPOSER_REWARDS` names the proposer rewards a stage can use (`rquest`, `rzero`).

The memory bank is a NamedTuple of fixed-shape numpy arrays (a pytree: orbax saves and restores it exactly),
kept compact in recency order: slots [0, cursor) hold the live fingerprints, oldest last-seen first; adding a
known fingerprint refreshes its step and moves it to the newest end, and past the capacity the oldest are
evicted. Functions are pure: they return a new bank. The stage that runs proposer, checker and solver and keeps
the banks in its state: rlkit/train/rquest_stage.py.
"""
from __future__ import annotations

import itertools
from collections import Counter
from typing import NamedTuple, Optional, Sequence

import numpy as np

from rlkit.core.registry import Registry

JUDGE_SUFFIX = "?"          # reject head prompt: the question then "?"; completion "V" (valid) or "I" (invalid)
JUDGE_VALID, JUDGE_INVALID = "V", "I"


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


class ProposerInputs(NamedTuple):
  """What a proposer reward sees of N questions."""
  texts: list          # [N] question texts
  valid: np.ndarray    # [N] bool: the checker accepts the question
  agree: np.ndarray    # [N] float64 p̂, the solver's agreement with its majority answer
  dup: np.ndarray      # [N] bool d(q): the fingerprint is in the memory bank or earlier in the batch


# name -> fn(inputs: ProposerInputs, settings) -> (reward [N] float64, trains_solver [N] bool); `settings` is the
# stage's `rquest` config section. trains_solver: the questions the solver learns from.
PROPOSER_REWARDS: Registry = Registry("proposer reward")


@PROPOSER_REWARDS.register("rquest")
def _rquest_scores(x: ProposerInputs, settings):
  """R-Quest: the checker and the solver's consensus gate the frontier term; known fingerprints cost λ_dup."""
  v = consensus_valid(x.valid, x.agree, tau_cons=settings.tau_cons)
  return np.asarray(rquest_reward(v, x.agree, x.dup, lam_dup=settings.lam_dup, lam_inv=settings.lam_inv),
                    np.float64), v


@PROPOSER_REWARDS.register("rzero")
def _rzero_scores(x: ProposerInputs, settings):
  """The R-Zero-style baseline: frontier minus surface repetition; the solver learns from every question that got
  an answer (no checker, no memory)."""
  rep = surface_repetition(x.texts, threshold=settings.rep_threshold)
  return np.asarray(rzero_reward(x.agree, rep, lam_rep=settings.lam_rep), np.float64), np.asarray(x.agree) > 0


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
