"""grain pipelines: batch layout, determinism, exact resume from get_state/set_state, epochs and shards."""
import numpy as np
import pytest

from rlkit.data.pipeline import make_iterator, make_sft_iterator, prompt_batch, sft_batch
from rlkit.data.tfds_builders import prepare
from rlkit.models.tokenizer import CharTokenizer

TOK = CharTokenizer()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
  data_dir = tmp_path_factory.mktemp("tfds")
  return prepare("arithmetic", {"ops": "+-*", "max_digits": 3}, num_train=96, num_test=16, seed=0,
                 data_dir=str(data_dir))


def _take(it, n):
  return [next(it) for _ in range(n)]


def _assert_batches_equal(xs, ys):
  assert len(xs) == len(ys)
  for x, y in zip(xs, ys):
    assert x.keys() == y.keys()
    for k in x:
      np.testing.assert_array_equal(x[k], y[k])


def test_prompt_batch_layout(sources):
  batch = next(make_iterator(sources["train"], 8, 0, TOK, max_prompt_len=12))
  assert batch["prompt_tokens"].shape == (8, 12) and batch["prompt_tokens"].dtype == np.int32
  assert batch["prompt_mask"].dtype == bool and batch["prompt"].dtype == object
  for row in range(8):
    tokens, mask = batch["prompt_tokens"][row], batch["prompt_mask"][row]
    n = mask.sum()
    assert mask[-n:].all() and not mask[:-n].any()           # left-padded: real tokens end at the last column
    assert tokens[-n] == TOK.bos_id and (tokens[:-n] == TOK.pad_id).all()
    assert TOK.decode(tokens[mask]) == batch["prompt"][row]
    assert batch["prompt"][row].endswith("=") and batch["demonstration"][row] == batch["answer"][row]


def test_same_seed_same_batches_other_seed_other_order(sources):
  a = _take(make_iterator(sources["train"], 8, 3, TOK, 12), 15)   # spans more than one epoch (12 batches)
  _assert_batches_equal(a, _take(make_iterator(sources["train"], 8, 3, TOK, 12), 15))
  b = _take(make_iterator(sources["train"], 8, 4, TOK, 12), 1)
  assert list(a[0]["prompt"]) != list(b[0]["prompt"])


@pytest.mark.parametrize("sft", [False, True])
def test_get_state_set_state_resumes_exactly(sources, sft):
  make = (lambda: make_sft_iterator(sources["train"], 8, 1, TOK, 20)) if sft else \
      (lambda: make_iterator(sources["train"], 8, 1, TOK, 12))
  it = make()
  _take(it, 10)
  state = it.get_state()
  expected = _take(it, 5)                                  # crosses the epoch boundary at batch 12
  resumed = make()
  resumed.set_state(state)
  _assert_batches_equal(_take(resumed, 5), expected)


def test_epochs_cover_every_record_once_and_reshuffle(sources):
  batches = list(make_iterator(sources["train"], 8, 0, TOK, 12, num_epochs=2))
  assert len(batches) == 24
  first = [p for b in batches[:12] for p in b["prompt"]]
  second = [p for b in batches[12:] for p in b["prompt"]]
  assert sorted(first) == sorted(second) and len(set(first)) == 96
  assert first != second
  assert len(list(make_iterator(sources["test"], 6, 0, TOK, 12, num_epochs=1))) == 2   # partial batch dropped


def test_shards_are_disjoint_and_cover_the_data(sources):
  shards = [[p for b in make_iterator(sources["train"], 8, 0, TOK, 12, num_epochs=1, shard_index=i,
                                      shard_count=2) for p in b["prompt"]] for i in range(2)]
  assert len(shards[0]) == len(shards[1]) == 48
  assert not set(shards[0]) & set(shards[1]) and len(set(shards[0]) | set(shards[1])) == 96


def test_sft_batch_marks_completion_and_eos():
  records = [{"prompt": "12+3=", "answer": "15"}, {"prompt": "7 3 5>26:", "answer": "7 3 5>26",
                                                  "demonstration": "7*3+5"}]
  batch = sft_batch(records, TOK, max_len=16)
  tokens, loss, attn = batch["tokens"], batch["loss_mask"], batch["attention_mask"]
  assert tokens.shape == loss.shape == attn.shape == (2, 16)
  assert not (loss & ~attn).any()                              # targets are real tokens
  for row, (prompt, completion) in enumerate([("12+3=", "15"), ("7 3 5>26:", "7*3+5")]):
    n = attn[row].sum()
    assert attn[row, :n].all() and not attn[row, n:].any()    # right-padded
    assert tokens[row, 0] == TOK.bos_id and tokens[row, n - 1] == TOK.eos_id
    assert TOK.decode(tokens[row, :n]) == prompt + completion
    assert TOK.decode(tokens[row][loss[row]], skip_special=False) == completion + "<eos>"
  with pytest.raises(ValueError, match="more than the padded length 10"):
    sft_batch(records, TOK, max_len=10)


def test_list_source_and_errors():
  rows = [{"prompt": f"{i}+1=", "answer": str(i + 1), "solution": f"{i}+1 #### {i + 1}"} for i in range(10)]
  batch = next(make_iterator(rows, 4, 0, TOK, 8, add_bos=False))
  assert (batch["prompt_tokens"][batch["prompt_mask"]] != TOK.bos_id).all()
  assert set(batch["demonstration"]) <= {r["solution"] for r in rows}
  with pytest.raises(ValueError, match="more than the padded length 3"):
    prompt_batch(rows[:2], TOK, max_prompt_len=3)
  with pytest.raises(ValueError, match="empty"):
    make_iterator([], 4, 0, TOK, 8)
  with pytest.raises(ValueError, match="shard_index"):
    make_iterator(rows, 4, 0, TOK, 8, shard_index=2, shard_count=2)
