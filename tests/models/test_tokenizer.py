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


# ---------------------------------------------------------------------------------------- decode offsets


def test_char_decode_offsets_are_one_character_each_and_specials_empty():
  tok = CharTokenizer()
  ids = [tok.bos_id] + tok.encode("12+3") + [tok.pad_id] + tok.encode("=4") + [tok.eos_id]
  text, offsets = tok.decode_with_offsets(ids)
  assert text == tok.decode(ids) == "12+3=4"
  assert offsets == [(0, 0), (0, 1), (1, 2), (2, 3), (3, 4), (4, 4), (4, 5), (5, 6), (6, 6)]
  assert tok.decode_with_offsets([]) == ("", [])
  with pytest.raises(ValueError, match="outside the vocabulary"):
    tok.decode_with_offsets([tok.vocab_size])


@pytest.fixture(scope="module")
def merged():
  """A byte-level BPE with merges for digits and for the bytes of é / € (so a sampled split differs from
  the encoding)."""
  from rlkit.models.bpe import bpe_tokenizer
  return bpe_tokenizer(["12+345=357 café €5", "é€é€ 12 35 357"] * 20, 300)


@pytest.mark.parametrize("text", ["12+345=357", "é", "café €5", "€€", "a😀b", "😀😀 ünï €", ""])
def test_hf_decode_offsets_of_an_encoding_are_the_encode_offsets(hf_folder, merged, text):
  for tok in (HFTokenizer(hf_folder), merged):
    ids, offsets = tok.encode_with_offsets(text)
    assert tok.decode_with_offsets(ids) == (text, offsets)


def _byte_token(tok, b: int) -> int:
  """The id of the one-byte token for byte `b`."""
  sym = {v: k for k, v in _byte_to_char().items()}[b]
  return tok.get_vocab()[sym]


def test_hf_decode_offsets_describe_the_sampled_ids_not_a_re_encoding(merged):
  """Sampled ids that their tokenizer would not write: "3", "5", "7" where it writes "357", and the two bytes of
  "é" one by one where it has a token for both. The offsets are those ids' own spans."""
  digits = [merged.get_vocab()[c] for c in "357"]
  bytes_e = [_byte_token(merged, b) for b in "é".encode()]
  ids = digits + bytes_e + [merged.get_vocab()["5"]]
  text, offsets = merged.decode_with_offsets(ids)
  assert text == merged.decode(ids) == "357é5"
  assert len(merged.encode("357")) == len(merged.encode("é")) == 1   # the re-encoding tokenizes differently
  assert offsets == [(0, 1), (1, 2), (2, 3), (3, 4), (3, 4), (4, 5)]
  assert merged.encode_with_offsets(text)[1] != offsets


def test_hf_decode_offsets_of_specials_and_invalid_bytes(merged):
  """Specials add no text (an empty span where they sit; inside a split character, that character's span);
  invalid UTF-8 decodes to U+FFFD as `decode` does, and every token touching it gets its span."""
  e1, e2 = (_byte_token(merged, b) for b in "é".encode())
  a = merged.get_vocab()["1"]
  text, offsets = merged.decode_with_offsets([merged.bos_id, a, e1, merged.pad_id, e2, merged.eos_id])
  assert text == "1é" and offsets == [(0, 0), (0, 1), (1, 2), (1, 2), (1, 2), (2, 2)]
  text, offsets = merged.decode_with_offsets([a, e2, e2, a, e1])          # stray continuation bytes, a cut lead
  assert text == merged.decode([a, e2, e2, a, e1]) == "1\ufffd\ufffd1\ufffd"
  assert offsets == [(0, 1), (1, 2), (2, 3), (3, 4), (4, 5)]


def test_hf_decode_offsets_of_random_ids_match_decode_and_stay_in_order(merged):
  rng = np.random.default_rng(0)
  for _ in range(300):
    ids = rng.integers(0, merged.vocab_size, rng.integers(0, 10)).tolist()
    text, offsets = merged.decode_with_offsets(ids)
    assert text == merged.decode(ids) and len(offsets) == len(ids)
    spans = np.asarray(offsets, np.int64).reshape(-1, 2)
    assert (spans[:, 0] <= spans[:, 1]).all() and (np.diff(spans, axis=0) >= 0).all()
    assert spans.max(initial=0) <= len(text)


def test_hf_decode_offsets_fall_back_to_token_by_token_decoding():
  """A decoder that is not byte-level (WordLevel joins words with spaces): each token's text is what it adds
  to the decoding of the tokens before it, so the pieces rebuild `decode`."""
  tok = tokenizers.Tokenizer(models.WordLevel(unk_token="[UNK]"))
  tok.pre_tokenizer = pre_tokenizers.Whitespace()
  tok.train_from_iterator(CORPUS, trainers.WordLevelTrainer(special_tokens=["[UNK]", "[EOS]"]))
  wrapped = HFTokenizer(tok, eos_token="[EOS]")
  ids = wrapped.encode("hello world hello", add_eos=True)
  text, offsets = wrapped.decode_with_offsets(ids)
  assert text == wrapped.decode(ids) == "hello world hello"
  assert offsets == [(0, 5), (5, 11), (11, 17), (17, 17)]
