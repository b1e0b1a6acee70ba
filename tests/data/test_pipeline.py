"""grain pipelines: batch layout, determinism, exact resume from get_state/set_state, epochs, extra fields,
and per-process slices of one global batch order."""
import json

import grain
import numpy as np
import pytest

from rlkit.data.jsonl import load_jsonl
from rlkit.data.pipeline import (as_text_record, decode_record, make_iterator, make_sft_iterator,
                                 prompt_batch, sft_batch)
from rlkit.data.tfds_builders import prepare, prepare_jsonl
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
      if x[k].dtype == object:   # assert_array_equal does not compare arrays of dicts
        assert list(x[k]) == list(y[k]), k
      else:
        np.testing.assert_array_equal(x[k], y[k])


def _concat(batches):
  return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


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
  assert batch["fields"].shape == (8,) and list(batch["fields"]) == [{}] * 8   # present when there are none


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


@pytest.mark.parametrize("sft", [False, True])
def test_single_process_order_is_the_frozen_record_pipeline(sources, sft):
  """P=1 batches are those of the earlier pipeline, which shuffled and batched the records themselves."""
  src = sources["train"]
  frozen = grain.MapDataset.source(src).shuffle(seed=3).repeat(None)
  frozen = frozen.batch(8, drop_remainder=True, batch_fn=list)
  it = make_sft_iterator(src, 8, 3, TOK, 20) if sft else make_iterator(src, 8, 3, TOK, 12)
  for step, batch in enumerate(_take(it, 15)):                  # 12 batches per epoch
    assert list(batch["prompt"]) == [r["prompt"].decode() for r in frozen[step]]
  # And the shuffle itself is frozen: a grain upgrade that changes it would change every past experiment.
  rows = [{"prompt": f"{i}=", "answer": str(i), "i": i} for i in range(10)]
  order = [f["i"] for b in make_iterator(rows, 5, 0, TOK, 8, num_epochs=2) for f in b["fields"]]
  assert order == [0, 4, 6, 7, 8, 3, 1, 9, 5, 2, 5, 7, 6, 0, 4, 8, 9, 2, 1, 3]


@pytest.mark.parametrize("sft", [False, True])
@pytest.mark.parametrize("processes", [2, 4])
def test_process_slices_concatenate_to_the_global_batch(sources, sft, processes):
  def make(p, n):
    kw = dict(process_index=p, process_count=n)
    return (make_sft_iterator(sources["train"], 8, 5, TOK, 20, **kw) if sft else
            make_iterator(sources["train"], 8, 5, TOK, 12, **kw))

  steps = 15                                                   # crosses the epoch boundary at batch 12
  per_process = [_take(make(p, processes), steps) for p in range(processes)]
  assert all(len(b["prompt"]) == 8 // processes for bs in per_process for b in bs)
  _assert_batches_equal([_concat(parts) for parts in zip(*per_process)], _take(make(0, 1), steps))


class _CountingSource:
  def __init__(self, source):
    self.source, self.read = source, []

  def __len__(self):
    return len(self.source)

  def __getitem__(self, i):
    self.read.append(i)
    return self.source[i]


def test_each_process_reads_only_its_rows(sources):
  counted = [_CountingSource(sources["train"]) for _ in range(2)]
  batches = [list(make_iterator(c, 8, 0, TOK, 12, num_epochs=1, process_index=p, process_count=2))
             for p, c in enumerate(counted)]
  assert [len(c.read) for c in counted] == [48, 48] and not set(counted[0].read) & set(counted[1].read)
  assert [sources["train"][i]["prompt"].decode() for i in counted[0].read] == \
      [p for b in batches[0] for p in b["prompt"]]


def test_two_process_iterators_resume_exactly(sources):
  for p in range(2):
    make = lambda: make_iterator(sources["train"], 8, 1, TOK, 12, process_index=p, process_count=2)  # noqa
    it = make()
    _take(it, 10)
    state = it.get_state()
    expected = _take(it, 5)
    resumed = make()
    resumed.set_state(state)
    _assert_batches_equal(_take(resumed, 5), expected)


def test_process_arguments_are_checked(sources):
  src = sources["train"]
  with pytest.raises(ValueError, match=r"global batch(?s:.*)10 rows do not divide by process_count=4"):
    make_iterator(src, 10, 0, TOK, 12, process_count=4)
  with pytest.raises(ValueError, match="process_index < process_count"):
    make_sft_iterator(src, 8, 0, TOK, 20, process_index=2, process_count=2)
  with pytest.raises(ValueError, match="last global batch has 6 of 10 rows"):       # 96 = 9 * 10 + 6
    make_iterator(src, 10, 0, TOK, 12, num_epochs=1, drop_remainder=False, process_count=2)
  assert len(list(make_iterator(src, 10, 0, TOK, 12, num_epochs=1, drop_remainder=False))) == 10


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
  with pytest.raises(ValueError, match="process_index"):
    make_iterator(rows, 4, 0, TOK, 8, process_index=2, process_count=2)


RICH = [{"prompt": f"q{i}", "answer": f"work #### {i}", "rubric": {"items": [{"w": 0.5, "text": "clear"}]},
         "tests": [[i, i + 1], []], "difficulty": i / 2, "reference": f"ref {i} ☃", "flag": i % 2 == 0,
         "none": None} for i in range(6)]


def _expected_fields(line):
  fields = {k: v for k, v in line.items() if k not in ("prompt", "answer")}
  return {**fields, "solution": line["answer"]}               # the '####' answer is the solution too


@pytest.mark.parametrize("sft", [False, True])
def test_jsonl_fields_reach_the_batch_unchanged(tmp_path, sft):
  path = tmp_path / "train.jsonl"
  path.write_text("\n".join(json.dumps(r, ensure_ascii=False) for r in RICH) + "\n", encoding="utf-8")
  stored = prepare_jsonl({"train": str(path)}, str(tmp_path / "data"), required_fields=("rubric",))["train"]
  make = (lambda src: make_sft_iterator(src, 6, 0, TOK, 40, num_epochs=1)) if sft else \
      (lambda src: make_iterator(src, 6, 0, TOK, 8, num_epochs=1))
  (batch,) = list(make(stored))
  by_prompt = {line["prompt"]: line for line in RICH}
  assert sorted(batch["prompt"]) == sorted(by_prompt)
  for prompt, fields in zip(batch["prompt"], batch["fields"]):
    assert fields == _expected_fields(by_prompt[prompt])
  (from_rows,) = list(make(load_jsonl(path)))                  # a list source gives the same batch
  _assert_batches_equal([from_rows], [batch])


def test_decode_record_of_every_source_kind():
  stored = {"prompt": b"p", "answer": b"a", "demonstration": b"d", "fields": b'{"k":[1,{"x":null}]}'}
  decoded = decode_record(stored)
  assert decoded == {"prompt": "p", "answer": "a", "demonstration": "d", "fields": {"k": [1, {"x": None}]}}
  assert decode_record(decoded) == decoded and as_text_record is decode_record
  row = {"prompt": "p", "answer": "a", "solution": "s", "k": (1, 2), "nested": {"m": [3]}}
  assert decode_record(row) == {"prompt": "p", "answer": "a", "solution": "s",
                                "fields": {"solution": "s", "k": [1, 2], "nested": {"m": [3]}}}
  decode_record(row)["fields"]["nested"]["m"].append(4)       # a reward that mutates its fields ...
  assert row["nested"] == {"m": [3]}                           # ... cannot change the source
