"""tfds builders without TensorFlow: array_record files, idempotent prepare, disjoint splits, JSONL import,
extra fields as canonical JSON."""
import dataclasses
import json
import os

import numpy as np
import pytest

from rlkit.data import TASKS, make_task
from rlkit.data.pipeline import make_iterator
from rlkit.data.tasks import Arithmetic
from rlkit.data.tfds_builders import config_name, generate_splits, prepare, prepare_jsonl
from rlkit.models.tokenizer import CharTokenizer

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
  assert _text(sources["train"][3]) == {"prompt": "q3", "answer": "3", "demonstration": "because #### 3",
                                        "fields": '{"solution":"because #### 3"}'}
  assert _text(sources["test"][0]) == {"prompt": "q", "answer": "a", "demonstration": "a", "fields": "{}"}
  files = _files(data_dir)
  prepare_jsonl({"train": str(train), "test": str(test)}, str(data_dir))
  assert _files(data_dir) == files
  train.write_text("not json\n")
  with pytest.raises(ValueError, match="line 1: invalid JSON"):
    prepare_jsonl({"train": str(train)}, str(data_dir))
  assert _files(data_dir) == files


def test_extra_fields_are_stored_as_canonical_json(tmp_path):
  line = {"prompt": "p", "answer": "a", "z": {"b": [1, {"c": None}], "a": 2.5}, "y": "☃"}
  path = tmp_path / "d.jsonl"
  path.write_text(json.dumps(line, ensure_ascii=False) + "\n", encoding="utf-8")
  stored = prepare_jsonl({"train": str(path)}, str(tmp_path / "data"))["train"][0]["fields"].decode()
  assert stored == '{"y":"\\u2603","z":{"a":2.5,"b":[1,{"c":null}]}}'     # sorted keys, no spaces, ASCII
  assert json.loads(stored) == {"z": line["z"], "y": line["y"]}


def test_missing_required_field_fails_before_writing(tmp_path):
  train, test = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
  train.write_text(json.dumps({"prompt": "q", "answer": "1", "rubric": {"w": 1}}) + "\n")
  test.write_text("\n".join([json.dumps({"prompt": "q", "answer": "1", "rubric": {}}),
                             json.dumps({"prompt": "r", "answer": "2", "rubrik": {}})]) + "\n")
  data_dir = tmp_path / "data"
  with pytest.raises(ValueError, match=r"test.jsonl: 1 malformed(?s:.*)line 2: missing required field "
                                       r"'rubric'"):
    prepare_jsonl({"train": str(train), "test": str(test)}, str(data_dir), required_fields=("rubric",))
  assert not data_dir.exists()
  sources = prepare_jsonl({"train": str(train)}, str(data_dir), required_fields=["rubric"])
  assert json.loads(sources["train"][0]["fields"]) == {"rubric": {"w": 1}}


@dataclasses.dataclass(frozen=True)
class TaggedArithmetic(Arithmetic):
  """Arithmetic whose examples carry extra fields of every JSON kind (`broken` ones that are not JSON)."""
  broken: bool = False
  name: str = dataclasses.field(default="tagged_arithmetic", init=False)
  required_fields: tuple = dataclasses.field(default=("difficulty",), init=False)

  def make_example(self, rng):
    example = super().make_example(rng)
    difficulty = np.int64(1) if self.broken else len(example["prompt"])
    return {**example, "difficulty": difficulty, "meta": {"ops": list(self.ops), "tests": [[1, 2]]}}


@pytest.fixture
def tagged_task(monkeypatch):
  monkeypatch.setitem(TASKS._entries, "tagged_arithmetic", TaggedArithmetic)   # registered for this test only
  return "tagged_arithmetic"


def test_synthetic_extra_fields_are_stored(tmp_path, tagged_task):
  sources = prepare(tagged_task, {"ops": "+-"}, 20, 5, 0, str(tmp_path))
  rows = generate_splits(make_task(tagged_task, ops="+-"), 20, 5, 0)
  for i in range(20):
    row = _text(sources["train"][i])
    assert row == rows["train"][i]
    assert json.loads(row["fields"]) == {"difficulty": len(row["prompt"]), "meta": {"ops": ["+", "-"],
                                                                                    "tests": [[1, 2]]}}
  (batch,) = list(make_iterator(sources["train"], 20, 0, CharTokenizer(), 12, num_epochs=1))
  assert [f["difficulty"] for f in batch["fields"]] == [len(p) for p in batch["prompt"]]
  assert all(f["meta"] == {"ops": ["+", "-"], "tests": [[1, 2]]} for f in batch["fields"])
  countdown = prepare("countdown", {"max_numbers": 3}, 5, 1, 0, str(tmp_path))["train"][0]
  assert json.loads(countdown["fields"]) == {"solution": countdown["demonstration"].decode()}


def test_synthetic_fields_must_be_json_and_have_the_required_ones(tagged_task, monkeypatch):
  with pytest.raises(ValueError, match="extra fields must be plain JSON values"):
    generate_splits(make_task(tagged_task, broken=True), 5, 1, 0)
  monkeypatch.setattr(TaggedArithmetic, "make_example", Arithmetic.make_example)
  with pytest.raises(ValueError, match=r"lacks the required field\(s\) \['difficulty'\]"):
    generate_splits(make_task(tagged_task), 5, 1, 0)
