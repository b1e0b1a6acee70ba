"""Tokenizing SFT text the way a multi-turn collector lays it out: each turn apart.

A multi-turn collector (rlkit/train/multi_turn.py) tokenizes every turn on its own: the prompt, each policy
turn (sampled token by token, ending at its stop string) and each observation the environment answers
(`tokenizer.encode(observation)`), and concatenates the ids. A BPE tokenizer encodes the same text as one string
differently wherever a merge crosses a turn boundary: with rlkit's base tokenizer "...</obs>" + "<act>..." joined
merges "><" into one token that the collector never produces. An SFT on demonstrations encoded whole therefore
teaches token sequences the policy never sees at those boundaries (measured on experiments/srd's key-door task:
every action's first token). `sft.turn_pattern` (a regular expression; "" keeps whole-string encoding) names the
turns: the prompt and the completion are cut at its matches, each match and each text between two matches is
encoded apart, and the ids are concatenated, BOS before the first piece and EOS after the last as before. The
prompt is cut too, for contexts that hold turns of their own (SRD's teacher reads its hindsight block encoded
apart from the prompt); the collector encodes a prompt whole, so the pattern should not match inside an ordinary
prompt: the key-door prompt's instructions quote `<act>go east</act>`, hence its pattern
`<act>[^<]*</act>(?=<obs>)`, an action followed by its observation.

  split_turns("<act>go east</act><obs>Room 1.</obs>", "<act>[^<]*</act>(?=<obs>)")
    -> ["<act>go east</act>", "<obs>Room 1.</obs>"]
"""
from __future__ import annotations

import re
from typing import Sequence

from rlkit.core.errors import ConfigError


def split_turns(text: str, pattern: str) -> list[str]:
  """`text` cut at every match of `pattern` (each match a piece, the text between matches a piece; empty pieces
  dropped); `[text]` for pattern "". Concatenating the pieces gives `text` back."""
  if not pattern:
    return [text]
  pieces, at = [], 0
  for m in re.finditer(pattern, text, re.S):
    pieces += [text[at:m.start()], m.group(0)]
    at = m.end()
  return [p for p in pieces + [text[at:]] if p]


def encode_turns(tokenizer, texts: Sequence[str], pattern: str, add_bos: bool = False,
                 add_eos: bool = False) -> list[list[int]]:
  """`tokenizer.encode_batch(texts, add_bos, add_eos)`, each text's pieces (`split_turns`) encoded apart."""
  if not pattern:
    return tokenizer.encode_batch(list(texts), add_bos=add_bos, add_eos=add_eos)
  split = [split_turns(t, pattern) for t in texts]
  ids = iter(tokenizer.encode_batch([p for pieces in split for p in pieces]))
  bos = tokenizer.encode("", add_bos=add_bos)   # the tokenizer's own specials (it refuses a BOS it lacks)
  eos = tokenizer.encode("", add_eos=add_eos)
  return [bos + [i for _ in pieces for i in next(ids)] + eos for pieces in split]


def check_turn_pattern(pattern, key: str) -> None:
  """A ConfigError naming `key` unless `pattern` is "" or a regular expression that matches no empty string."""
  if not isinstance(pattern, str):
    raise ConfigError(f"{key}={pattern!r} must be a string: a regular expression naming the turns, or \"\".")
  if not pattern:
    return
  try:
    compiled = re.compile(pattern, re.S)
  except re.error as e:
    raise ConfigError(f"{key}={pattern!r} is not a regular expression ({e}); e.g. '<act>.*?</act>' tokenizes "
                      "every action apart from the text around it.") from None
  if compiled.fullmatch(""):
    raise ConfigError(f"{key}={pattern!r} matches the empty string, so it would cut the text everywhere; make it "
                      "match at least one character (e.g. '<act>.*?</act>').")
