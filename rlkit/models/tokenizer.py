"""Tokenizers: one small interface over a character-level tokenizer (for the synthetic tasks) and Hugging
Face `tokenizers` files (for real checkpoints), plus the padding helpers that turn id lists into
static-shape arrays.

Interface (`Tokenizer`): `encode(text, add_bos, add_eos) -> list[int]`, `decode(ids, skip_special) -> str`,
`encode_batch`, and the ids the sampler and the data pipeline need: `vocab_size`, `pad_id`, `bos_id` (None
when the tokenizer has no BOS, as with Qwen), `eos_id`, and `stop_ids` (every id that ends a completion;
EOS first).

`encode_with_offsets(text) -> (ids, offsets)` gives each id's character span `(start, end)` in `text` (str
indices, i.e. code points; no special ids added), which cross-tokenizer distillation aligns
(`rlkit.objectives.xtok`). Convention for tokens that cover part of a character (byte-level BPE splits a
multi-byte UTF-8 character such as "é", "€" or an emoji across tokens): such a token gets the span of every
character it touches, so consecutive tokens may repeat or overlap a span (["Ã", "©"] for "é" both get (0, 1)).
The aligner groups each run of overlapping tokens into one unit and never aligns its tokens one by one: a
character's bytes have no character offset of their own to compare.

`decode_with_offsets(ids) -> (text, offsets)` is the other direction, for the tokens a model SAMPLED: the text
`decode(ids)` gives and each id's span in it, by the same convention. Re-encoding the text is not the same
thing: `encode(decode(ids))` may tokenize differently (a student that sampled "3", "5" where its tokenizer
would write "35"), and the distillation must supervise the ids that were sampled. Special ids (pad, bos, the
stop ids) produce no text: each gets an empty span where it sits (the caller leaves them out, by the
response length or mask).

`get_vocab() -> {token string: id}` (specials included) lets two tokenizers find their shared tokens.

`encode` adds BOS/EOS only when asked. The char tokenizer never makes a special id from text ("<eos>" in a
prompt is five characters); an HF tokenizer does parse its own special tokens out of text, as chat templates
("<|im_start|>...") rely on.

Padding: prompts are left-padded (real tokens end at the last column, so generation appends on the right and
`positions = cumsum(mask) - 1` stays correct); SFT sequences are right-padded. A row longer than the target
length raises rather than being cut, because a silently truncated prompt changes the task.
"""
from __future__ import annotations

import functools
import json
import os
import string
from typing import Any, Optional, Protocol, Sequence, runtime_checkable

import numpy as np

from rlkit.core.registry import Registry

# Order matters: ids are assigned by position, so append new characters at the end only (existing
# checkpoints trained on this alphabet keep their ids).
DEFAULT_ALPHABET = (string.digits + "+-*/=() " + string.ascii_lowercase + string.ascii_uppercase
                    + ".,:;!?'\"#$%&<>[]_^\n")

TOKENIZERS: Registry[Any] = Registry("tokenizer")


@runtime_checkable
class Tokenizer(Protocol):
  """What the data pipeline and the sampler need from a tokenizer."""
  vocab_size: int
  pad_id: int
  bos_id: Optional[int]
  eos_id: int
  stop_ids: tuple[int, ...]

  def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]: ...

  def decode(self, ids: Sequence[int], skip_special: bool = True) -> str: ...

  def encode_batch(self, texts: Sequence[str], add_bos: bool = False,
                   add_eos: bool = False) -> list[list[int]]: ...

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]: ...

  def decode_with_offsets(self, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]: ...

  def get_vocab(self) -> dict[str, int]: ...


def _with_specials(ids: list[int], bos_id: Optional[int], eos_id: int, add_bos: bool, add_eos: bool,
                   who: str) -> list[int]:
  if add_bos and bos_id is None:
    raise ValueError(f"{who} has no BOS token, so add_bos=True is impossible; pass add_bos=False "
                     "(or give the tokenizer a bos_token).")
  return ([bos_id] if add_bos else []) + ids + ([eos_id] if add_eos else [])


@TOKENIZERS.register("char")
class CharTokenizer:
  """One id per character: 0=pad, 1=bos, 2=eos, then the alphabet in order. Round trips exactly."""
  PAD, BOS, EOS = 0, 1, 2
  SPECIAL_TEXT = ("<pad>", "<bos>", "<eos>")

  def __init__(self, alphabet: str = DEFAULT_ALPHABET):
    if not alphabet:
      raise ValueError("CharTokenizer: the alphabet is empty.")
    dupes = sorted({c for c in alphabet if alphabet.count(c) > 1})
    if dupes:
      raise ValueError(f"CharTokenizer: the alphabet repeats {dupes!r}; each character must appear once.")
    self.alphabet = alphabet
    self._to_id = {c: i + 3 for i, c in enumerate(alphabet)}
    self.vocab_size = len(alphabet) + 3
    self.pad_id, self.bos_id, self.eos_id = self.PAD, self.BOS, self.EOS
    self.stop_ids = (self.EOS,)

  def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    try:
      ids = [self._to_id[c] for c in text]
    except KeyError:
      bad = next(c for c in text if c not in self._to_id)
      raise ValueError(f"CharTokenizer: character {bad!r} in {text!r} is not in the alphabet "
                       f"{self.alphabet!r}; extend the alphabet (append at the end).") from None
    return _with_specials(ids, self.bos_id, self.eos_id, add_bos, add_eos, "CharTokenizer")

  def encode_batch(self, texts: Sequence[str], add_bos: bool = False,
                   add_eos: bool = False) -> list[list[int]]:
    return [self.encode(t, add_bos, add_eos) for t in texts]

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    return self.encode(text), [(i, i + 1) for i in range(len(text))]

  def decode_with_offsets(self, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    return _joined([self.decode([i]) for i in ids])

  def get_vocab(self) -> dict[str, int]:
    return {**{t: i for i, t in enumerate(self.SPECIAL_TEXT)}, **self._to_id}

  def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
    out = []
    for i in ids:
      i = int(i)
      if i < 3:
        if not skip_special:
          out.append(self.SPECIAL_TEXT[i])
      elif i < self.vocab_size:
        out.append(self.alphabet[i - 3])
      else:
        raise ValueError(f"CharTokenizer: id {i} is outside the vocabulary (size {self.vocab_size}).")
    return "".join(out)

  def __repr__(self) -> str:
    return f"CharTokenizer(vocab_size={self.vocab_size})"


def _token_text(value: Any) -> Optional[str]:
  """tokenizer_config.json stores a special token as a string or as an AddedToken dict {"content": ...}."""
  if isinstance(value, dict):
    value = value.get("content")
  return value if isinstance(value, str) else None


def _read_json(path: str) -> dict:
  if not os.path.exists(path):
    return {}
  with open(path) as f:
    return json.load(f)


@TOKENIZERS.register("hf")
class HFTokenizer:
  """A Hugging Face `tokenizers` tokenizer (tokenizer.json) behind the rlkit interface.

  Special tokens come from the arguments when given, else from tokenizer_config.json beside tokenizer.json.
  Extra stop ids come from `stop_tokens` and from generation_config.json's `eos_token_id` (Qwen instruct
  models stop on both <|im_end|> and <|endoftext|>). A missing pad token falls back to EOS: padded
  positions are masked, so the id only has to exist.
  """

  def __init__(self, path_or_tokenizer_json: Any, *, bos_token: Optional[str] = None,
               eos_token: Optional[str] = None, pad_token: Optional[str] = None,
               stop_tokens: Sequence[str] = ()):
    import tokenizers  # local: only HF users pay for the import

    if isinstance(path_or_tokenizer_json, tokenizers.Tokenizer):
      self._tok, folder = path_or_tokenizer_json, None
    else:
      path = os.fspath(path_or_tokenizer_json)
      file = os.path.join(path, "tokenizer.json") if os.path.isdir(path) else path
      if not os.path.exists(file):
        raise FileNotFoundError(f"HFTokenizer: no tokenizer file at {file!r}; pass a tokenizer.json or a "
                                "folder that contains one.")
      self._tok, folder = tokenizers.Tokenizer.from_file(file), os.path.dirname(file)
    config = _read_json(os.path.join(folder, "tokenizer_config.json")) if folder else {}
    generation = _read_json(os.path.join(folder, "generation_config.json")) if folder else {}

    def token_id(arg: Optional[str], key: str) -> Optional[int]:
      text = arg if arg is not None else _token_text(config.get(key))
      if text is None:
        return None
      i = self._tok.token_to_id(text)
      if i is None:
        raise ValueError(f"HFTokenizer: {key} {text!r} is not in the vocabulary.")
      return i

    self.bos_id = token_id(bos_token, "bos_token")
    eos_id = token_id(eos_token, "eos_token")
    if eos_id is None:
      raise ValueError("HFTokenizer: no EOS token (none in tokenizer_config.json); pass eos_token=..., since "
                       "generation needs a token that ends a completion.")
    self.eos_id = eos_id
    pad_id = token_id(pad_token, "pad_token")
    self.pad_id = eos_id if pad_id is None else pad_id
    extra = generation.get("eos_token_id", [])
    extra = [extra] if isinstance(extra, int) else list(extra)
    extra += [token_id(t, "stop token") for t in stop_tokens]
    self.stop_ids = tuple(dict.fromkeys([eos_id] + extra))   # EOS first, no duplicates
    self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)
    self._special = {i for i in (self.pad_id, self.bos_id, *self.stop_ids) if i is not None}
    # decode_with_offsets: ids with no text (ours and the tokenizer's own specials, as `decode` skips them).
    self._no_text = self._special | {i for i, t in self._tok.get_added_tokens_decoder().items() if t.special}
    self._byte_level = isinstance(self._tok.decoder, tokenizers.decoders.ByteLevel)

  def encode(self, text: str, add_bos: bool = False, add_eos: bool = False) -> list[int]:
    ids = self._tok.encode(text, add_special_tokens=False).ids
    return _with_specials(ids, self.bos_id, self.eos_id, add_bos, add_eos, "HFTokenizer")

  def encode_batch(self, texts: Sequence[str], add_bos: bool = False,
                   add_eos: bool = False) -> list[list[int]]:
    encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
    return [_with_specials(e.ids, self.bos_id, self.eos_id, add_bos, add_eos, "HFTokenizer")
            for e in encodings]

  def encode_with_offsets(self, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    # `tokenizers` reports character offsets from a str input, and a token holding part of a character's
    # bytes gets that whole character: the module's convention, checked in tests/models/test_tokenizer.py.
    # A ByteLevel post-processor with trim_offsets=True (RoBERTa's) drops spaces from the spans, and `align`
    # then refuses the pair (the tokenizations cover different characters).
    enc = self._tok.encode(text, add_special_tokens=False)
    return list(enc.ids), [(int(s), int(e)) for s, e in enc.offsets]

  def decode_with_offsets(self, ids: Sequence[int]) -> tuple[str, list[tuple[int, int]]]:
    """`decode(ids)` and each id's character span in it (module docstring); specials: empty spans.

    Byte-level BPE (a `ByteLevel` decoder: GPT-2, Llama 3, Qwen) is exact: each token's bytes (its symbols
    mapped back through the byte table; a token with other characters, e.g. an added token, is its own UTF-8,
    as `tokenizers` decodes it), concatenated and decoded as `tokenizers` does (each invalid byte run is one
    U+FFFD), so a token holding part of a character gets that whole character's span. Other decoders
    (SentencePiece's Metaspace, WordPiece) fall back to decoding token by token, each id in the context of
    the ids before it (so a leading "▁" or "##" reads as in `decode`): the text is the concatenation of the
    pieces, which can differ from `decode(ids)` where a decoder rewrites earlier text (space clean-up), and
    byte-fallback pieces of one character each read as U+FFFD.
    """
    ids = [int(i) for i in ids]
    bad = [i for i in ids if not 0 <= i < self.vocab_size]
    if bad:
      raise ValueError(f"HFTokenizer: id {bad[0]} is outside the vocabulary (size {self.vocab_size}).")
    if not self._byte_level:
      return _joined([self._piece(ids, k) if i not in self._no_text else "" for k, i in enumerate(ids)])
    return _lossy_utf8_offsets([self._bytes(i) for i in ids])

  def _bytes(self, i: int) -> bytes:
    """Byte-level BPE: token i's bytes (its symbols through the byte table; an added token is its own UTF-8)."""
    token = "" if i in self._no_text else self._tok.id_to_token(i)
    table = _byte_level_table()
    return bytes(table[c] for c in token) if all(c in table for c in token) else token.encode()

  def token_bytes(self) -> list[bytes]:
    """Every id's bytes (specials: empty): exact for byte-level BPE, else each token decoded on its own."""
    if self._byte_level:
      return [self._bytes(i) for i in range(self.vocab_size)]
    return [b"" if i in self._no_text else self._tok.decode([i]).encode() for i in range(self.vocab_size)]

  def _piece(self, ids: list[int], k: int, context: int = 4) -> str:
    """Token k's text: what it adds to the decoding of the (up to `context`) ids before it."""
    before = [i for i in ids[max(0, k - context):k] if i not in self._no_text]
    head, both = self._tok.decode(before), self._tok.decode(before + [ids[k]])
    return both[len(head):] if both.startswith(head) else self._tok.decode([ids[k]])

  def get_vocab(self) -> dict[str, int]:
    return self._tok.get_vocab(with_added_tokens=True)

  def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
    ids = [int(i) for i in ids]
    if skip_special:
      # Our specials may not be flagged "special" inside tokenizer.json, so filter them here too.
      ids = [i for i in ids if i not in self._special]
    return self._tok.decode(ids, skip_special_tokens=skip_special)

  def __repr__(self) -> str:
    return f"HFTokenizer(vocab_size={self.vocab_size}, eos_id={self.eos_id})"


@functools.lru_cache(maxsize=1)
def _byte_level_table() -> dict[str, int]:
  """GPT-2's byte-level alphabet (`tokenizers.pre_tokenizers.ByteLevel.alphabet()`), symbol -> byte: printable
  bytes stand for themselves, the other 68 for chr(256 + k) in byte order."""
  printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
  others = [b for b in range(256) if b not in printable]
  return {**{chr(b): b for b in printable}, **{chr(256 + k): b for k, b in enumerate(others)}}


def _lossy_utf8_offsets(pieces: Sequence[bytes]) -> tuple[str, list[tuple[int, int]]]:
  """The text of the concatenated `pieces` (UTF-8, each maximal invalid byte run one U+FFFD, as Rust's
  `from_utf8_lossy` and Python's "replace" both do) and each piece's span: every character it holds a byte of;
  an empty piece gets an empty span where it sits (the whole character when it sits inside one)."""
  data = b"".join(pieces)
  chars, owner, at = [], [], 0           # owner[b]: the character byte b belongs to
  while at < len(data):
    try:
      good, bad = data[at:].decode("utf-8"), 0
    except UnicodeDecodeError as e:    # e.start: the valid prefix; e.end - e.start: the invalid run
      good, bad = data[at:at + e.start].decode("utf-8"), e.end - e.start
    for c in good:
      owner += [len(chars)] * len(c.encode("utf-8"))
      chars.append(c)
    owner += [len(chars)] * bad
    chars += ["\ufffd"] * (bad > 0)
    at = len(owner)
  offsets, pos = [], 0
  for p in pieces:
    if p:
      offsets.append((owner[pos], owner[pos + len(p) - 1] + 1))
    elif 0 < pos < len(data) and owner[pos - 1] == owner[pos]:   # between two bytes of one character
      offsets.append((owner[pos], owner[pos] + 1))
    else:
      c = owner[pos] if pos < len(data) else len(chars)
      offsets.append((c, c))
    pos += len(p)
  return "".join(chars), offsets


def _joined(pieces: Sequence[str]) -> tuple[str, list[tuple[int, int]]]:
  ends = np.cumsum([len(p) for p in pieces], dtype=np.int64)
  return "".join(pieces), [(int(e) - len(p), int(e)) for p, e in zip(pieces, ends)]


def token_bytes(tokenizer: Tokenizer) -> list[bytes]:
  """The bytes of every id of `tokenizer`'s vocabulary (special tokens: empty), for text matching at the token
  level (`rlkit.rollout.stop_strings`): the tokenizer's own `token_bytes()` where it has one, else each id
  decoded on its own (a piece that is part of a character then reads as U+FFFD)."""
  if hasattr(tokenizer, "token_bytes"):
    return tokenizer.token_bytes()
  return [tokenizer.decode([i], skip_special=True).encode() for i in range(tokenizer.vocab_size)]


def make_tokenizer(kind: str, **kw) -> Tokenizer:
  """Builds the tokenizer registered as `kind` ("char" or "hf") from config keyword arguments."""
  return TOKENIZERS.get(kind)(**kw)


def _pad(rows: Sequence[Sequence[int]], length: int, pad_id: int,
         left: bool) -> tuple[np.ndarray, np.ndarray]:
  tokens = np.full((len(rows), length), pad_id, np.int32)
  mask = np.zeros((len(rows), length), bool)
  for r, row in enumerate(rows):
    n = len(row)
    if n > length:
      raise ValueError(f"row {r} has {n} tokens, more than the padded length {length}; raise the length "
                       "(e.g. max_prompt_len) or filter long examples out of the data.")
    cols = slice(length - n, length) if left else slice(0, n)
    tokens[r, cols] = row
    mask[r, cols] = True
  return tokens, mask


def pad_left(rows: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Left-pads id lists to `(tokens int32 [N, length], mask bool [N, length])`; a longer row raises."""
  return _pad(rows, length, pad_id, left=True)


def pad_right(rows: Sequence[Sequence[int]], length: int, pad_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Right-pads id lists to `(tokens int32 [N, length], mask bool [N, length])`; a longer row raises."""
  return _pad(rows, length, pad_id, left=False)


def bucket_length(n: int) -> int:
  """The smallest power of two >= n, at least 8: padding to it bounds the shapes a jitted consumer compiles."""
  return 1 << max(3, (n - 1).bit_length())


def left_padded_batches(rows: Sequence[Sequence[int]], batch_size: int, pad_id: int):
  """Yields `(start, tokens, mask)` for consecutive chunks of `batch_size` id lists, each left-padded to the
  `bucket_length` of its longest row and filled up to `batch_size` with one-token pad rows (whose results the
  caller drops): fixed shapes, so a jitted consumer compiles once per bucket."""
  for start in range(0, len(rows), batch_size):
    chunk = list(rows[start:start + batch_size])
    width = bucket_length(max(len(r) for r in chunk))
    yield (start, *pad_left(chunk + [[pad_id]] * (batch_size - len(chunk)), width, pad_id))


def decode_responses(tokenizer: Tokenizer, response: np.ndarray, lengths: np.ndarray) -> list[str]:
  """Text of each row's sampled response `response[i, :lengths[i]]` (special tokens dropped)."""
  return [tokenizer.decode(response[i, :lengths[i]].tolist(), skip_special=True) for i in range(len(lengths))]
