"""Tokenizers: exact round trips, special ids, errors, the HF wrapper on a tiny trained tokenizer, padding."""
import json

import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models, pre_tokenizers, trainers

from rlkit.models.tokenizer import (DEFAULT_ALPHABET, TOKENIZERS, CharTokenizer, HFTokenizer, Tokenizer,
                                    make_tokenizer, pad_left, pad_right)

CORPUS = ["12+345=357", "the quick brown fox", "7 3 5>26:7*3+5", "hello world, hello tokens"] * 20


# ---------------------------------------------------------------------------------------------- char


def test_char_round_trip_every_character_and_random_strings():
  tok = CharTokenizer()
  assert tok.decode(tok.encode(DEFAULT_ALPHABET)) == DEFAULT_ALPHABET
  rng = np.random.default_rng(0)
  for _ in range(20):
    text = "".join(rng.choice(list(DEFAULT_ALPHABET), size=int(rng.integers(0, 30))))
    assert tok.decode(tok.encode(text, add_bos=True, add_eos=True)) == text


def test_char_special_ids_and_layout():
  tok = CharTokenizer("ab")
  assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.stop_ids, tok.vocab_size) == (0, 1, 2, (2,), 5)
  assert tok.encode("ba", add_bos=True, add_eos=True) == [1, 4, 3, 2]
  assert tok.decode([0, 1, 4, 3, 2], skip_special=False) == "<pad><bos>ba<eos>"
  assert tok.encode_batch(["a", "bb"], add_eos=True) == [[3, 2], [4, 4, 2]]
  assert isinstance(tok, Tokenizer)


def test_char_default_alphabet_covers_the_task_formats():
  tok = CharTokenizer()
  for text in ["12+345=", "-357", "(7-3)*5", "7 3 5>26:", "Q: what is 2/3? #### 42.\n"]:
    assert tok.decode(tok.encode(text)) == text


def test_char_errors_name_the_problem():
  tok = CharTokenizer("0123456789")
  with pytest.raises(ValueError, match=r"'x'.*not in the alphabet '0123456789'"):
    tok.encode("12x")
  with pytest.raises(ValueError, match="repeats"):
    CharTokenizer("abca")
  with pytest.raises(ValueError, match="outside the vocabulary"):
    tok.decode([99])


def test_make_tokenizer_registry():
  assert isinstance(make_tokenizer("char", alphabet="xy"), CharTokenizer)
  assert set(TOKENIZERS.names()) == {"char", "hf"}
  with pytest.raises(KeyError, match="char, hf"):
    make_tokenizer("sentencepiece")


# ---------------------------------------------------------------------------------------------- padding


def test_pad_left_and_right():
  tokens, mask = pad_left([[5, 6], [7]], 3, pad_id=0)
  np.testing.assert_array_equal(tokens, [[0, 5, 6], [0, 0, 7]])
  np.testing.assert_array_equal(mask, [[False, True, True], [False, False, True]])
  assert tokens.dtype == np.int32 and mask.dtype == bool
  tokens, mask = pad_right([[5, 6], []], 3, pad_id=9)
  np.testing.assert_array_equal(tokens, [[5, 6, 9], [9, 9, 9]])
  np.testing.assert_array_equal(mask, [[True, True, False], [False, False, False]])


def test_pad_too_long_raises_with_row_index():
  with pytest.raises(ValueError, match="row 1 has 4 tokens, more than the padded length 3"):
    pad_left([[1], [1, 2, 3, 4]], 3, 0)


# ---------------------------------------------------------------------------------------------- HF


def _bpe() -> tokenizers.Tokenizer:
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<pad>", "<s>", "</s>", "<|im_end|>"],
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
  tok.train_from_iterator(CORPUS, trainer)
  return tok


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
  folder = tmp_path_factory.mktemp("hf_tok")
  tok = _bpe()
  tok.save(str(folder / "tokenizer.json"))
  # Both forms HF writes: a plain string and an AddedToken dict.
  (folder / "tokenizer_config.json").write_text(json.dumps(
      {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}, "pad_token": "<pad>"}))
  (folder / "generation_config.json").write_text(json.dumps(
      {"eos_token_id": [tok.token_to_id("</s>"), tok.token_to_id("<|im_end|>")]}))
  return folder


def test_hf_reads_specials_from_config_and_round_trips(hf_folder):
  raw = tokenizers.Tokenizer.from_file(str(hf_folder / "tokenizer.json"))
  tok = HFTokenizer(hf_folder)
  assert (tok.pad_id, tok.bos_id, tok.eos_id) == tuple(raw.token_to_id(t) for t in ("<pad>", "<s>", "</s>"))
  assert tok.stop_ids == (tok.eos_id, raw.token_to_id("<|im_end|>"))
  assert tok.vocab_size == raw.get_vocab_size()
  for text in ["12+345=357", "hello wörld, ünknown bytes \n", ""]:
    ids = tok.encode(text, add_bos=True, add_eos=True)
    assert ids[0] == tok.bos_id and ids[-1] == tok.eos_id
    assert tok.decode(ids) == text
  assert tok.encode_batch(CORPUS[:3], add_eos=True) == [tok.encode(t, add_eos=True) for t in CORPUS[:3]]
  assert isinstance(tok, Tokenizer)


def test_hf_arguments_override_config_and_missing_eos_fails(hf_folder, tmp_path):
  tok = HFTokenizer(hf_folder, eos_token="<|im_end|>", stop_tokens=["</s>"])
  assert tok.eos_id == tok.stop_ids[0] and len(tok.stop_ids) == 2
  bare = _bpe()   # a Tokenizer object: no config files, so no specials unless given
  with pytest.raises(ValueError, match="no EOS token"):
    HFTokenizer(bare)
  tok = make_tokenizer("hf", path_or_tokenizer_json=bare, eos_token="</s>")
  assert tok.bos_id is None and tok.pad_id == tok.eos_id   # pad falls back to EOS
  with pytest.raises(ValueError, match="no BOS token"):
    tok.encode("hi", add_bos=True)
  with pytest.raises(ValueError, match="not in the vocabulary"):
    HFTokenizer(bare, eos_token="<nope>")
  with pytest.raises(FileNotFoundError, match="no tokenizer file"):
    HFTokenizer(tmp_path)


def test_hf_word_level(tmp_path):
  tok = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"]))
  tok.save(str(tmp_path / "wl.json"))
  wrapped = HFTokenizer(tmp_path / "wl.json", eos_token="[EOS]")
  ids = wrapped.encode("hello world", add_eos=True)
  assert ids[-1] == wrapped.eos_id and len(ids) == 3
  assert wrapped.decode(ids) == "hello world"   # WordLevel without a decoder joins words with spaces


# ---------------------------------------------------------------------------------------------- offsets


def _byte_to_char() -> dict[str, int]:
  """GPT-2's byte-level alphabet, inverted: the symbol a byte-level token string uses for each byte."""
  printable = list(range(33, 127)) + list(range(161, 173)) + list(range(174, 256))
  extra = [b for b in range(256) if b not in printable]
  return {**{chr(b): b for b in printable}, **{chr(256 + i): b for i, b in enumerate(extra)}}


def test_char_offsets_are_one_character_each():
  tok = CharTokenizer()
  text = "12+345=357"
  ids, offsets = tok.encode_with_offsets(text)
  assert ids == tok.encode(text) and offsets == [(i, i + 1) for i in range(len(text))]
  assert "".join(text[s:e] for s, e in offsets) == text
  assert tok.encode_with_offsets("") == ([], [])
  vocab = tok.get_vocab()
  assert vocab["<eos>"] == tok.eos_id and vocab["7"] == tok.encode("7")[0] and len(vocab) == tok.vocab_size


def test_hf_offsets_reconstruct_ascii_text(hf_folder):
  tok = HFTokenizer(hf_folder)
  for text in ["12+345=357", "the quick brown fox", "hello world, hello tokens", ""]:
    ids, offsets = tok.encode_with_offsets(text)
    assert ids == tok.encode(text)
    assert "".join(text[s:e] for s, e in offsets) == text
    assert all(e > s for s, e in offsets)
  assert tok.get_vocab()["</s>"] == tok.eos_id


@pytest.mark.parametrize("text", ["é", "café €5", "€€", "a😀b", "😀😀 ünï €"])
def test_hf_offsets_of_split_characters_cover_every_character_they_touch(hf_folder, text):
  """The convention: a token holding some of a character's UTF-8 bytes gets that whole character's span.
  Checked against the token's own bytes (byte-level symbols mapped back), so it also pins `tokenizers`."""
  tok = HFTokenizer(hf_folder)
  ids, offsets = tok.encode_with_offsets(text)
  sym = _byte_to_char()
  char_of_byte = [i for i, c in enumerate(text) for _ in c.encode("utf-8")]
  pos = 0
  for i, (s, e) in zip(ids, offsets):
    n = len(tok._tok.id_to_token(i))   # one symbol per byte
    assert all(c in sym for c in tok._tok.id_to_token(i))
    assert (s, e) == (char_of_byte[pos], char_of_byte[pos + n - 1] + 1)
    pos += n
  assert pos == len(text.encode("utf-8"))
  # Some character is split (the tiny vocabulary has no merges for these bytes): spans repeat.
  if any(len(c.encode("utf-8")) > 1 for c in text):
    assert len(set(offsets)) < len(offsets)
