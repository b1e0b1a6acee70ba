"""JSONL import: GSM8K-style parsing, errors that list every bad line, and the `jsonl` task's grading."""
import json

import numpy as np
import pytest

from rlkit.data import make_task
from rlkit.data.jsonl import extract_final_answer, load_jsonl

GSM8K_SOLUTION = ("Natalia sold 48/2 = <<48/2=24>>24 clips in May.\n"
                  "She sold 48+24 = <<48+24=72>>72 clips.\n#### 72")


def _write(path, lines):
  path.write_text("\n".join(lines) + "\n", encoding="utf-8")
  return path


def test_gsm8k_style_answer_is_split(tmp_path):
  path = _write(tmp_path / "d.jsonl", [json.dumps({"prompt": "How many clips?", "answer": GSM8K_SOLUTION}),
                                       "",
                                       json.dumps({"prompt": "Capital of France?", "answer": " Paris ",
                                                   "extra": 1})])
  rows = load_jsonl(path)
  assert rows == [{"prompt": "How many clips?", "answer": "72", "solution": GSM8K_SOLUTION},
                  {"prompt": "Capital of France?", "answer": "Paris"}]


def test_malformed_lines_are_all_listed(tmp_path):
  path = _write(tmp_path / "bad.jsonl", [
      json.dumps({"prompt": "ok", "answer": "1"}),
      '{"prompt": "x", "answer": ',                 # 2: bad JSON
      json.dumps({"prompt": "no answer"}),           # 3: missing key
      "",                                            # 4: blank, skipped
      json.dumps({"prompt": "p", "answer": 42}),     # 5: not a string
      json.dumps(["prompt", "answer"]),             # 6: not an object
      json.dumps({"prompt": "p", "answer": "steps ####  "}),   # 7: nothing after ####
  ])
  with pytest.raises(ValueError) as info:
    load_jsonl(path)
  message = str(info.value)
  assert "5 malformed line(s)" in message and str(path) in message
  for line, problem in [(2, "invalid JSON"), (3, "missing key 'answer'"), (5, "'answer' must be a string"),
                        (6, "expected a JSON object"), (7, "empty answer (nothing after '####')")]:
    assert f"line {line}: {problem}" in message
  assert "line 1:" not in message and "line 4:" not in message


def test_many_bad_lines_are_counted(tmp_path):
  path = _write(tmp_path / "bad.jsonl", ["nope"] * 25)
  with pytest.raises(ValueError, match=r"(?s)25 malformed.*and 5 more \(lines 21, 22, 23, 24, 25\)"):
    load_jsonl(path)


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_empty_file_is_refused(tmp_path, content):
  path = tmp_path / "empty.jsonl"
  path.write_text(content)
  with pytest.raises(ValueError, match="the file is empty"):
    load_jsonl(path)


def test_missing_file(tmp_path):
  with pytest.raises(FileNotFoundError, match="nowhere.jsonl"):
    load_jsonl(tmp_path / "nowhere.jsonl")


@pytest.mark.parametrize("completion,extracted", [
    ("so #### 72", "72"), ("#### 7 #### 72\nbye", "72"), ("she has 3 apples and 72 pears.", "72"),
    ("-3.5 degrees", "-3.5"), ("$1,000", "1,000"), ("no numbers", None), ("#### ", None), ("", None),
])
def test_extract_final_answer(completion, extracted):
  assert extract_final_answer(completion) == extracted


@pytest.mark.parametrize("completion,answer,score", [
    ("48/2=24, 48+24=72\n#### 72", "72", 1.0), ("The answer is 72.", "72", 1.0), ("#### 72.0", "72", 1.0),
    ("#### 1,000", "1000", 1.0), ("#### $5", "5", 1.0), ("#### 71", "72", 0.0), ("I don't know", "72", 0.0),
    ("72 then 73", "72", 0.0), ("#### Paris", "Paris", 1.0), ("#### paris", "Paris", 0.0),
    ("#### nan", "nan", 1.0), ("#### NaN", "72", 0.0),
])
def test_jsonl_task_verify(tmp_path, completion, answer, score):
  path = _write(tmp_path / "d.jsonl", [json.dumps({"prompt": "q", "answer": "1"})])
  assert make_task("jsonl", path=str(path)).verify(completion, answer) == score


def test_jsonl_task_serves_rows(tmp_path):
  path = _write(tmp_path / "d.jsonl", [json.dumps({"prompt": f"q{i}", "answer": f"s{i} #### {i}"})
                                       for i in range(10)])
  task = make_task("jsonl", path=str(path))
  draws = [task.make_example(np.random.default_rng(0)) for _ in range(2)]
  assert draws[0] == draws[1]
  ex = draws[0]
  assert task.demonstration(ex) == ex["solution"] and task.verify(ex["solution"], ex["answer"]) == 1.0
  with pytest.raises(ValueError, match="set path"):
    make_task("jsonl")
