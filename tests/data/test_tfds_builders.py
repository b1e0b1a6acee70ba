"""tfds builders without TensorFlow: array_record files, idempotent prepare, disjoint splits, JSONL import."""
import json
import os

import pytest

from rlkit.data import make_task
from rlkit.data.tfds_builders import config_name, generate_splits, prepare, prepare_jsonl

ARITH = {"ops": "+-", "min_digits": 1, "max_digits": 2}


def _files(root):
  return {os.path.join(d, f): os.stat(os.path.join(d, f)).st_mtime_ns
          for d, _, fs in os.walk(root) for f in fs}


def _text(record):
  return {k: v.decode() for k, v in record.items()}


def test_prepare_writes_array_record_and_is_idempotent(tmp_path):
  sources = prepare("arithmetic", ARITH, num_train=300, num_test=60, seed=0, data_dir=str(tmp_path))
  assert {k: len(v) for k, v in sources.items()} == {"train": 300, "test": 60}
  files = _files(tmp_path)
  records = [f for f in files if ".array_record-" in f]
  assert len(records) == 2 and any("-train." in f for f in records) and any("-test." in f for f in records)

  again = prepare("arithmetic", dict(reversed(list(ARITH.items()))), 300, 60, 0, str(tmp_path))
  assert _files(tmp_path) == files                       # nothing rewritten
  assert [again["test"][i] for i in range(60)] == [sources["test"][i] for i in range(60)]

  # Stored rows are exactly the generated rows, in generation order.
  rows = generate_splits(make_task("arithmetic", **ARITH), 300, 60, 0)
  assert [_text(sources["train"][i]) for i in range(300)] == rows["train"]


def test_configs_do_not_collide(tmp_path):
  a = config_name("arithmetic", {"seed": 0, "x": [1, 2]})
  assert a == config_name("arithmetic", {"x": [1, 2], "seed": 0})   # key order does not matter
  assert a != config_name("arithmetic", {"seed": 1, "x": [1, 2]})
  with pytest.raises(ValueError, match="plain JSON values"):
    config_name("arithmetic", {"x": object()})
  prepare("arithmetic", ARITH, 50, 10, 0, str(tmp_path))
  other = prepare("arithmetic", ARITH, 50, 10, 1, str(tmp_path))
  assert len(os.listdir(tmp_path / "task_dataset")) == 2
  assert _text(other["train"][0]) != _text(prepare("arithmetic", ARITH, 50, 10, 0, str(tmp_path))["train"][0])


def test_splits_are_disjoint_unique_and_deterministic():
  task = make_task("arithmetic", ops="+", min_digits=1, max_digits=1)   # only 100 distinct prompts
  rows = generate_splits(task, num_train=70, num_test=30, seed=5)
  train, test = [r["prompt"] for r in rows["train"]], [r["prompt"] for r in rows["test"]]
  assert len(set(train)) == 70 and len(set(test)) == 30 and not set(train) & set(test)
  assert rows == generate_splits(task, 70, 30, 5)
  assert rows != generate_splits(task, 70, 30, 6)
  with pytest.raises(ValueError, match="prompt space is too small"):
    generate_splits(task, num_train=90, num_test=30, seed=0)


def test_countdown_demonstrations_are_stored(tmp_path):
  sources = prepare("countdown", {"max_numbers": 3}, 20, 5, 0, str(tmp_path))
  task = make_task("countdown", max_numbers=3)
  for i in range(20):
    row = _text(sources["train"][i])
    assert task.verify(row["demonstration"], row["answer"]) == 1.0


def test_bad_parameters_fail_before_writing(tmp_path):
  with pytest.raises(ValueError, match="unknown parameter"):
    prepare("arithmetic", {"digits": 2}, 10, 2, 0, str(tmp_path))
  with pytest.raises(ValueError, match="num_train >= 1"):
    prepare("arithmetic", {}, 0, 2, 0, str(tmp_path))
  assert os.listdir(tmp_path) == []


def test_prepare_jsonl(tmp_path):
  train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
  train.write_text("\n".join(json.dumps({"prompt": f"q{i}", "answer": f"because #### {i}"})
                             for i in range(7)))
  test.write_text(json.dumps({"prompt": "q", "answer": "a"}) + "\n")
  data_dir = tmp_path / "data"
  sources = prepare_jsonl({"train": str(train), "test": str(test)}, str(data_dir))
  assert {k: len(v) for k, v in sources.items()} == {"train": 7, "test": 1}
  assert _text(sources["train"][3]) == {"prompt": "q3", "answer": "3", "demonstration": "because #### 3"}
  assert _text(sources["test"][0]) == {"prompt": "q", "answer": "a", "demonstration": "a"}
  files = _files(data_dir)
  prepare_jsonl({"train": str(train), "test": str(test)}, str(data_dir))
  assert _files(data_dir) == files
  train.write_text("not json\n")
  with pytest.raises(ValueError, match="line 1: invalid JSON"):
    prepare_jsonl({"train": str(train)}, str(data_dir))
  assert _files(data_dir) == files
