"""JSONL import: GSM8K-style parsing, extra fields, errors that list every bad line, and the `jsonl` task."""
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
                  {"prompt": "Capital of France?", "answer": "Paris", "extra": 1}]


RICH = {"prompt": "Write a haiku.", "answer": "ok",
        "rubric": {"criteria": [{"name": "form", "weight": 0.7}, {"name": "tone", "weight": 0.3}]},
        "tests": [[1, 2], [3, 4]], "difficulty": 3.5, "reference": "old pond / frog", "tags": [],
        "flag": None, "unicode": "naïve ☃"}


def test_extra_fields_are_kept_with_any_json_value(tmp_path):
  path = _write(tmp_path / "d.jsonl", [json.dumps(RICH),
                                       json.dumps({"prompt": "q", "answer": "s #### 4", "solution": "mine"})])
  rich, own = load_jsonl(path)
  assert rich == RICH
  assert own == {"prompt": "q", "answer": "4", "solution": "mine"}        # a line's own solution wins
  task = make_task("jsonl", path=str(path))
  assert task.demonstration(own) == "mine" and task.demonstration(rich) == "ok"


def test_jsonl_task_returns_fresh_copies(tmp_path):
  path = _write(tmp_path / "d.jsonl", [json.dumps(RICH)])
  task = make_task("jsonl", path=str(path))
  example = task.make_example(np.random.default_rng(0))
  example["rubric"]["criteria"].clear()                                  # a reward mutating its input
  assert task.make_example(np.random.default_rng(0)) == RICH


def test_missing_required_fields_are_listed_with_other_bad_lines(tmp_path):
  path = _write(tmp_path / "d.jsonl", [
      json.dumps({"prompt": "a", "answer": "1", "rubric": {}, "tests": []}),
      json.dumps({"prompt": "b", "answer": "1", "tests": [1]}),            # 2: no rubric
      "[1]",                                                               # 3: not an object
      json.dumps({"prompt": "c", "answer": 2}),                            # 4: bad answer, both missing
  ])
  with pytest.raises(ValueError) as info:
    load_jsonl(path, required_fields=("rubric", "tests"))
  message = str(info.value)
  assert "3 malformed line(s)" in message and "and the required field(s) 'rubric', 'tests'" in message
  assert "line 2: missing required field 'rubric'\n" in message
  assert "line 3: expected a JSON object" in message
  assert ("line 4: 'answer' must be a string, got int; missing required field 'rubric'; missing required "
          "field 'tests'") in message
  assert "line 1:" not in message


def test_required_solution_may_come_from_the_answer(tmp_path):
  path = _write(tmp_path / "d.jsonl", [json.dumps({"prompt": "a", "answer": "steps #### 1"}),
                                       json.dumps({"prompt": "b", "answer": "1", "solution": "steps"}),
                                       json.dumps({"prompt": "c", "answer": "1"})])
  with pytest.raises(ValueError, match=r"1 malformed(?s:.*)line 3: missing required field 'solution'"):
    load_jsonl(path, required_fields=["solution"])


def test_reserved_and_badly_typed_fields_are_refused(tmp_path):
  path = _write(tmp_path / "d.jsonl", [json.dumps({"prompt": "p", "answer": "a", "fields": {}}),
                                       json.dumps({"prompt": "p", "answer": "a", "demonstration": "x"}),
                                       json.dumps({"prompt": "p", "answer": "a", "solution": 3})])
  with pytest.raises(ValueError) as info:
    load_jsonl(path)
  message = str(info.value)
  assert "line 1: 'fields' is a reserved name" in message
  assert "line 2: 'demonstration' is a reserved name" in message
  assert "line 3: 'solution' (the SFT demonstration) must be a string, got int" in message


@pytest.mark.parametrize("required", [("rubric",), ["rubric"]])
def test_jsonl_task_required_fields(tmp_path, required):
  path = _write(tmp_path / "d.jsonl", [json.dumps({"prompt": "q", "answer": "1"})])
  assert make_task("jsonl", path=str(path)).required_fields == ()
  with pytest.raises(ValueError, match="line 1: missing required field 'rubric'"):
    make_task("jsonl", path=str(path), required_fields=required)
  path = _write(tmp_path / "d.jsonl", [json.dumps({"prompt": "q", "answer": "1", "rubric": [1]})])
  assert make_task("jsonl", path=str(path), required_fields=required).required_fields == ("rubric",)
  for bad in ("rubric", [1], [""]):
    with pytest.raises(ValueError, match="required_fields must be a tuple or list"):
      make_task("jsonl", path=str(path), required_fields=bad)


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


@pytest.mark.parametrize("line,column", [
    ('{"prompt": "x", "answer": "1"', 30),      # the '}' missing at the end: once reported as column 1
    ('{"prompt": "caf\u00e9" "answer": "1"}', 19),   # the missing ',' after a non-ASCII string
    ('  {"prompt": "x", "answer": }', 29),      # indented
])
def test_malformed_json_is_reported_at_its_column(tmp_path, line, column):
  path = _write(tmp_path / "bad.jsonl", [json.dumps({"prompt": "ok", "answer": "1"}), line])
  with pytest.raises(ValueError, match=rf"line 2: invalid JSON \(.* at column {column}\)"):
    load_jsonl(path)


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
