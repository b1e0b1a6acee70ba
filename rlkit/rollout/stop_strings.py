"""Stop strings at the token level: text that ends a decode call however the tokenizer splits it.

A multi-turn policy stops where its turn ends in text ("</call>"), but byte-level BPE has no token boundary
there: the base tokenizer writes "</call><result>" as ")</" "call" "><" "result", so "</call>" ends inside
the token "><", and a model may also spell it with other tokens. A stop set of token ids cannot express that.
Instead each stop string gets a string-matching automaton (KMP) over bytes, lifted to tokens: state q is the
length of the longest prefix of the string that ends the text so far, and

  table[s, q, t] = the state after reading token t's bytes from state q   (m_s: matched, absorbing)

so the sampler advances one int per row and string per drawn token (`rlkit.rollout.resumable.decode_steps`:
a row stops when any string reaches its accept state `accept[s] = m_s`), whatever the tokenization. A match
may end inside a token: the turn then holds the token's extra text (its "<" above), which the environment's
observation continues (`rlkit.rollout.multi_turn`).

Building the table reads every token's bytes once, vectorised over the vocabulary (numpy; ~0.1 s for 150k
tokens and a short string).
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from rlkit.models.tokenizer import token_bytes


class StopTable(NamedTuple):
  table: np.ndarray    # [S, M + 1, V] int32: state after a token (M: the longest string's length)
  accept: np.ndarray   # [S] int32: string s is matched in state accept[s] (its length)


def _byte_automaton(pattern: bytes) -> np.ndarray:
  """[m + 1, 256] int32 KMP automaton of `pattern`: state q (q bytes matched) -> state after one byte; the
  accept state m is absorbing (a matched string stays matched until the turn ends)."""
  m = len(pattern)
  dfa = np.zeros((m + 1, 256), np.int32)
  dfa[0, pattern[0]] = 1
  fallback = 0
  for q in range(1, m):
    dfa[q] = dfa[fallback]
    dfa[q, pattern[q]] = q + 1
    fallback = dfa[fallback, pattern[q]]
  dfa[m] = m
  return dfa


def stop_string_table(tokenizer, strings: Sequence[str]) -> StopTable:
  """The token-level automata of `strings` (non-empty text) over `tokenizer`'s vocabulary."""
  strings = [str(s) for s in strings]
  if not strings or any(not s for s in strings):
    raise ValueError(f"stop strings {strings!r}: give at least one, none empty.")
  pieces = token_bytes(tokenizer)
  width = max(1, max(len(p) for p in pieces))
  codes = np.full((len(pieces), width), -1, np.int32)    # each token's bytes, -1 after its end
  for i, p in enumerate(pieces):
    codes[i, :len(p)] = np.frombuffer(p, np.uint8)
  longest = max(len(s.encode()) for s in strings)
  table = np.zeros((len(strings), longest + 1, len(pieces)), np.int32)
  for s, text in enumerate(strings):
    pattern = text.encode()
    dfa = _byte_automaton(pattern)
    m = len(pattern)
    state = np.broadcast_to(np.arange(m + 1, dtype=np.int32)[:, None], (m + 1, len(pieces))).copy()
    for j in range(width):
      byte = codes[:, j]
      read = byte >= 0
      state = np.where(read[None, :], dfa[state, np.maximum(byte, 0)[None, :]], state)
    table[s, :m + 1] = state
    table[s, m + 1:] = m         # unreachable states of a shorter string: matched
  return StopTable(table, np.array([len(s.encode()) for s in strings], np.int32))
