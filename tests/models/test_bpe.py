"""Byte-level BPE tokenizers for the cross-tokenizer study: trained deterministically, loadable as rlkit
tokenizers, different merges for different vocab sizes, offsets that rebuild the text."""
import json
import pathlib
import subprocess
import sys

import pytest

from rlkit.models.bpe import SPECIAL_TOKENS, bpe_tokenizer, save_tokenizer_folder, train_bpe
from rlkit.models.tokenizer import HFTokenizer, Tokenizer

CORPUS = [f"{a}+{b}={a + b}" for a in range(0, 400, 7) for b in range(3, 900, 31)]
PROBES = ["12+345=357", "7+8=15", "999+1=1000", "305+62=367"]


@pytest.fixture(scope="module")
def small_and_large():
  return bpe_tokenizer(CORPUS, 280), bpe_tokenizer(CORPUS, 400)


def test_specials_come_first_and_hf_tokenizer_finds_them(tmp_path):
  tok = bpe_tokenizer(CORPUS, 300, folder=str(tmp_path / "tok"))
  assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.stop_ids) == (0, 1, 2, (2,))
  assert isinstance(tok, Tokenizer) and tok.vocab_size == 300
  assert json.loads((tmp_path / "tok" / "tokenizer_config.json").read_text()) == dict(
      zip(("pad_token", "bos_token", "eos_token"), SPECIAL_TOKENS))
  reloaded = HFTokenizer(tmp_path / "tok")
  for text in PROBES + ["", "3 * 4 = 12, é€😀"]:   # unseen characters still encode (full byte alphabet)
    ids = tok.encode(text, add_bos=True, add_eos=True)
    assert ids == reloaded.encode(text, add_bos=True, add_eos=True) and tok.decode(ids) == text


def test_offsets_rebuild_ascii_text(small_and_large):
  for tok in small_and_large:
    for text in PROBES + CORPUS[::97]:
      ids, offsets = tok.encode_with_offsets(text)
      assert ids == tok.encode(text) and "".join(text[s:e] for s, e in offsets) == text


def test_two_vocab_sizes_tokenize_some_strings_differently(small_and_large):
  small, large = small_and_large
  differ = [t for t in PROBES + CORPUS if small.encode_with_offsets(t)[1] != large.encode_with_offsets(t)[1]]
  assert len(differ) > len(CORPUS) // 4
  # More merges, fewer tokens, and never more.
  assert all(len(large.encode(t)) <= len(small.encode(t)) for t in PROBES + CORPUS[::13])
  assert sum(map(len, large.encode_batch(CORPUS))) < sum(map(len, small.encode_batch(CORPUS)))


def test_training_is_deterministic_across_processes(tmp_path):
  here = train_bpe(CORPUS, 300).to_str()
  assert train_bpe(CORPUS, 300).to_str() == here
  code = ("import sys; from rlkit.models.bpe import train_bpe; from tests.models.test_bpe import CORPUS; "
          "sys.stdout.write(train_bpe(CORPUS, 300).to_str())")
  other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=pathlib.Path(__file__).parents[2]).stdout
  assert other == here


def test_errors_name_the_problem(tmp_path):
  with pytest.raises(ValueError, match="corpus is empty"):
    train_bpe([], 300)
  with pytest.raises(ValueError, match="below 259"):
    train_bpe(CORPUS, 100)
  with pytest.raises(ValueError, match="three distinct"):
    train_bpe(CORPUS, 300, special_tokens=("<pad>", "<pad>", "<eos>"))
  with pytest.raises(ValueError, match=r"\['<s>'\] are not in the vocabulary"):
    save_tokenizer_folder(train_bpe(CORPUS, 300), str(tmp_path), ("<pad>", "<s>", "<eos>"))
