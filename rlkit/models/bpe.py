"""Byte-level BPE tokenizers trained on a task's own language, for the cross-tokenizer distillation study
(methods/llm.md §6): a teacher and a student that read the same text ("12+345=357") through different merges.

Training is GPT-2 style: the ByteLevel pre-tokenizer (its regex splits digits from operators, so merges stay
inside numbers and words) over the full 256-byte initial alphabet, so any text encodes, including characters
the corpus never showed. Two vocab sizes on one corpus give two merge lists, hence different tokenizations of
some strings (fewer merges leave "357" as "35" + "7"). `tokenizers`' BPE trainer breaks count ties by the pair
itself, so the same corpus and settings give the same tokenizer.json, byte for byte.

The saved folder (tokenizer.json + tokenizer_config.json naming pad/bos/eos) loads with
`HFTokenizer(folder)` like a Hugging Face checkpoint's tokenizer.
"""
from __future__ import annotations

import json
import os
from typing import Iterable, Optional

# pad, bos, eos: the first ids of the vocabulary (the trainer adds specials first, in this order).
SPECIAL_TOKENS = ("<pad>", "<bos>", "<eos>")
_BYTES = 256


def train_bpe(texts: Iterable[str], vocab_size: int, special_tokens: tuple[str, str, str] = SPECIAL_TOKENS,
              split_digits: bool = False):
  """A `tokenizers.Tokenizer` with byte-level BPE learned from `texts`, of at most `vocab_size` tokens.

  :param special_tokens: (pad, bos, eos) strings; they get ids 0, 1, 2.
  :param split_digits: every digit its own token (as Qwen's tokenizer does): no merge ever joins digits, so a
    number's tokens are its digits, the same in every number (what a small model learning arithmetic needs).
  :returns: the tokenizer; the vocabulary is smaller than `vocab_size` when the corpus runs out of merges.
  """
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers

  texts = list(texts)
  if not texts:
    raise ValueError("train_bpe: the corpus is empty; pass the task's texts (e.g. prompts + answers).")
  if len(special_tokens) != 3 or len(set(special_tokens)) != 3:
    raise ValueError(f"train_bpe: special_tokens must be three distinct strings (pad, bos, eos), got "
                     f"{special_tokens!r}.")
  floor = _BYTES + len(special_tokens)
  if vocab_size < floor:
    raise ValueError(f"train_bpe: vocab_size={vocab_size} is below {floor} (256 bytes + 3 specials), the "
                     "smallest byte-level vocabulary; raise it (each token above the floor is one merge).")
  tok = tokenizers.Tokenizer(models.BPE())
  byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.pre_tokenizer = (pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), byte_level])
                       if split_digits else byte_level)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(special_tokens),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tok.train_from_iterator(texts, trainer)
  return tok


def save_tokenizer_folder(tok, folder: str, special_tokens: tuple[str, str, str] = SPECIAL_TOKENS) -> str:
  """Writes `tok` as `folder/tokenizer.json` plus a tokenizer_config.json naming (pad, bos, eos), the files
  `HFTokenizer(folder)` reads its special ids from; returns `folder`."""
  pad, bos, eos = special_tokens
  missing = [t for t in special_tokens if tok.token_to_id(t) is None]
  if missing:
    raise ValueError(f"save_tokenizer_folder: special tokens {missing} are not in the vocabulary; train with "
                     "train_bpe(..., special_tokens=...) naming them.")
  os.makedirs(folder, exist_ok=True)
  tok.save(os.path.join(folder, "tokenizer.json"))
  with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
    json.dump({"pad_token": pad, "bos_token": bos, "eos_token": eos}, f, indent=1)
  return folder


def bpe_tokenizer(texts: Iterable[str], vocab_size: int, folder: Optional[str] = None, split_digits: bool = False):
  """`train_bpe` wrapped as an rlkit `HFTokenizer` (pad/bos/eos set), saved to and loaded from `folder` when
  given (so a run can name it in config as `hf` with `path_or_tokenizer_json=folder`)."""
  from rlkit.models.tokenizer import HFTokenizer

  tok = train_bpe(texts, vocab_size, split_digits=split_digits)
  if folder is not None:
    return HFTokenizer(save_tokenizer_folder(tok, folder))
  pad, bos, eos = SPECIAL_TOKENS
  return HFTokenizer(tok, pad_token=pad, bos_token=bos, eos_token=eos)
