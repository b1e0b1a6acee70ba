"""sft.turn_pattern: multi-turn SFT text encoded turn by turn, as the multi-turn collector lays an episode out
(its prompt, each policy turn and each observation encoded apart), not as one string."""
import os

import numpy as np
import pytest

from rlkit.agents.keydoor import KeyDoor
from rlkit.core.errors import ConfigError
from rlkit.data.packing import encode_chunk
from rlkit.data.pipeline import sft_batch, token_lengths
from rlkit.data.turns import check_turn_pattern, encode_turns, split_turns
from rlkit.models.tokenizer import CharTokenizer, make_tokenizer

BASE = os.path.join(os.path.dirname(__file__), "..", "..", "experiments", "base", "model")
ACT = "<act>.*?</act>"
EPISODE = "<act>[^<]*</act>(?=<obs>)"   # an action followed by its observation: the prompt's quoted actions stay whole


@pytest.fixture(scope="module")
def bpe():
  return make_tokenizer("hf", path_or_tokenizer_json=BASE)


@pytest.fixture(scope="module")
def row():
  task = KeyDoor(n_rooms=3)
  example = task.make_example(np.random.default_rng(0))
  return dict(example, demonstration=task.demonstration(example))


def test_split_turns_cuts_at_every_match_and_loses_nothing():
  text = "<act>go east</act><obs>Room 1.</obs><act>take red key</act><obs>Nothing happens.</obs>"
  assert split_turns(text, ACT) == ["<act>go east</act>", "<obs>Room 1.</obs>", "<act>take red key</act>",
                                    "<obs>Nothing happens.</obs>"]
  assert split_turns("intro <act>x</act>", ACT) == ["intro ", "<act>x</act>"]
  assert split_turns(text, "") == [text] and split_turns("", ACT) == []
  assert "".join(split_turns(text, "<obs>|</obs>")) == text


def test_turns_encode_as_the_collector_lays_them_out(bpe, row):
  """Each action and observation encoded on its own (rlkit/train/multi_turn.py encodes an observation alone and
  samples an action token by token): the BPE merges across a boundary ("</obs>" then "<act>") that whole-string
  encoding makes are gone."""
  pieces = split_turns(row["demonstration"], EPISODE)
  assert pieces == split_turns(row["demonstration"], ACT) and len(pieces) == 12     # 6 actions, 6 observations
  assert split_turns(row["prompt"], EPISODE) == [row["prompt"]]                      # encoded whole, as collected
  collector = [i for piece in pieces for i in bpe.encode(piece)] + [bpe.eos_id]
  assert encode_turns(bpe, [row["demonstration"]], EPISODE, add_eos=True) == [collector]
  assert bpe.encode(row["demonstration"], add_eos=True) != collector   # why the option exists
  assert encode_turns(bpe, [row["demonstration"]], "", add_eos=True) == [bpe.encode(row["demonstration"],
                                                                                    add_eos=True)]


def test_sft_batch_and_lengths_use_the_turns(bpe, row):
  batch = sft_batch([row], bpe, 1024, turn_pattern=EPISODE)
  prompt = bpe.encode(row["prompt"], add_bos=bpe.bos_id is not None)
  completion = encode_turns(bpe, [row["demonstration"]], EPISODE, add_eos=True)[0]
  n = len(prompt) + len(completion)
  assert batch["tokens"][0, :n].tolist() == prompt + completion and not batch["attention_mask"][0, n:].any()
  assert batch["loss_mask"][0].nonzero()[0].tolist() == list(range(len(prompt), n))
  prompts, sequences = token_lengths([row], bpe, turn_pattern=EPISODE)
  assert prompts == [len(prompt)] and sequences == [n]
  assert token_lengths([row], bpe)[1] != sequences                     # whole-string encoding counts otherwise
  chunk = encode_chunk([0], [row], bpe, "completion", None, turn_pattern=EPISODE)   # sft.pack: the same ids
  assert chunk["tokens"].tolist() == prompt + completion


def test_a_char_tokenizer_is_unchanged_by_turns(row):
  tok = CharTokenizer(alphabet="".join(sorted(set(row["prompt"] + row["demonstration"]))))
  assert (sft_batch([row], tok, 1024, turn_pattern=EPISODE)["tokens"] == sft_batch([row], tok, 1024)["tokens"]).all()


@pytest.mark.parametrize("pattern, words", [("<act>(", "not a regular expression"), ("x*", "empty string"),
                                            (3, "must be a string")])
def test_bad_patterns_are_refused_with_the_key(pattern, words):
  with pytest.raises(ConfigError, match=words) as e:
    check_turn_pattern(pattern, "sft.turn_pattern")
  assert "sft.turn_pattern" in str(e.value)
  check_turn_pattern("", "sft.turn_pattern")
  check_turn_pattern(ACT, "sft.turn_pattern")
