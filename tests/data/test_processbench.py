"""ProcessBench data: the official-layout loader and its errors, the synthetic chains (labels recomputed from
the arithmetic, traps, difficulty, determinism, alphabet), the `processbench_chains` task and the final-answer
baseline's F1."""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from rlkit.data import make_task
from rlkit.data.processbench import (SUBSETS, ProcessBenchChains, final_answer_baseline, load_processbench,
                                     step_checks, step_verdicts, synthetic_processbench, worked_verdicts)
from rlkit.data.splits import generate_splits
from rlkit.models.tokenizer import DEFAULT_ALPHABET
from rlkit.rewards.prm import MALFORMED, parse_answer, predicted_index, processbench_metrics

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def official_row(i, steps=("a", "b", "c"), label=1, final=False):
  return {"id": f"x-{i}", "generator": "Qwen2-7B-Instruct", "problem": f"Problem {i}?", "steps": list(steps),
          "final_answer_correct": final, "label": label}


# ---------------------------------------------------------------------------------------------- loader


def test_loads_a_folder_of_json_and_jsonl_files(tmp_path):
  (tmp_path / "gsm8k.json").write_text(json.dumps([official_row(0), official_row(1, label=-1, final=True)]))
  (tmp_path / "math.jsonl").write_text(json.dumps(official_row(2, steps=["s0", "s1"], label=0)) + "\n\n")
  (tmp_path / "notes.txt").write_text("ignored")
  examples = load_processbench(str(tmp_path))
  assert [(e["subset"], e["id"], e["label"], e["answer"]) for e in examples] == [
      ("gsm8k", "x-0", 1, "1/3"), ("gsm8k", "x-1", -1, "-1/3"), ("math", "x-2", 0, "0/2")]
  first = examples[0]
  assert first["steps"] == ["a", "b", "c"] and first["final_answer_correct"] is False
  assert first["problem"] == "Problem 0?" and first["generator"] == "Qwen2-7B-Instruct"
  assert first["prompt"].startswith("Problem 0?\n\nStep 0: a\nStep 1: b\nStep 2: c\n")
  assert examples == load_processbench(str(tmp_path))     # a fixed template: same files, same prompts


def test_converted_official_files_are_served_and_graded_by_the_processbench_task(tmp_path, capsys):
  from rlkit.data.processbench_convert import main
  (tmp_path / "gsm8k.json").write_text(json.dumps([official_row(0), official_row(1, label=-1, final=True)]))
  out = tmp_path / "pb.jsonl"
  main(["--official", str(tmp_path), "--out", str(out)])
  assert "wrote 2 examples (gsm8k)" in capsys.readouterr().out
  task = make_task("processbench", path=str(out))
  assert [r["answer"] for r in task.rows] == ["1/3", "-1/3"]
  first = task.rows[0]
  assert task.demonstration(first) == "+-+" and task.verify("+-+", first["answer"]) == 1.0
  assert task.verify("+--", first["answer"]) == 1.0 and task.verify("--+", first["answer"]) == 0.0
  assert task.category(first) == "gsm8k"
  assert task.eval_counts(first, "+-+") == {"processbench/gsm8k/num_err": 1.0, "processbench/gsm8k/hits_err": 1.0,
                                            "processbench/gsm8k/num_cor": 0.0, "processbench/gsm8k/hits_cor": 0.0}
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "math.json").write_text(json.dumps([official_row(0, label=7)]))
  with pytest.raises(SystemExit, match="math.json: row 0: field 'label'"):
    main(["--official", str(tmp_path / "bad"), "--out", str(tmp_path / "x.jsonl")])
  assert not (tmp_path / "x.jsonl").exists()


def test_the_readme_conversion_command_runs_as_written(tmp_path):
  """The README's command, run literally in a fresh interpreter: running the task module itself as `__main__`
  registered its tasks a second time and crashed. Every row keeps its subset (the file it came from)."""
  readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
  (command,) = re.findall(r"`(python -m rlkit\.data\.\S+ --official=DIR --out=FILE\.jsonl)`", readme)
  official = tmp_path / "official"
  official.mkdir()
  (official / "gsm8k.json").write_text(json.dumps([official_row(0), official_row(1, label=-1, final=True)]))
  (official / "math.jsonl").write_text(json.dumps(official_row(2, steps=["s0", "s1"], label=0)) + "\n")
  (official / "omnimath.json").write_text(json.dumps([official_row(3, label=2)]))
  out = tmp_path / "pb.jsonl"

  def run(folder, target):
    argv = command.replace("DIR", str(folder)).replace("FILE.jsonl", str(target)).split()
    return subprocess.run([sys.executable] + argv[1:], cwd=ROOT, capture_output=True, text=True, timeout=300)

  proc = run(official, out)
  assert proc.returncode == 0, proc.stderr[-2000:]
  assert "wrote 4 examples (gsm8k, math, omnimath)" in proc.stdout
  rows = [json.loads(line) for line in out.read_text().splitlines()]
  assert [(r["subset"], r["id"], r["answer"]) for r in rows] == [
      ("gsm8k", "x-0", "1/3"), ("gsm8k", "x-1", "-1/3"), ("math", "x-2", "0/2"), ("omnimath", "x-3", "2/3")]
  assert rows == load_processbench(str(official))
  task = make_task("processbench", path=str(out))
  assert [task.category(r) for r in task.rows] == ["gsm8k", "gsm8k", "math", "omnimath"]
  (tmp_path / "bad").mkdir()
  (tmp_path / "bad" / "math.json").write_text(json.dumps([official_row(0, label=-3)]))
  proc = run(tmp_path / "bad", tmp_path / "x.jsonl")
  assert proc.returncode != 0 and "math.json: row 0: field 'label'" in proc.stderr
  assert not (tmp_path / "x.jsonl").exists() and not (tmp_path / "x.jsonl.tmp").exists()


def test_loads_one_file_and_a_json_named_file_holding_json_lines(tmp_path):
  """HF `Dataset.to_json("gsm8k.json")` writes JSON Lines: the content decides, not the name."""
  path = tmp_path / "olympiadbench.json"
  path.write_text("\n".join(json.dumps(official_row(i)) for i in range(3)))
  examples = load_processbench(str(path))
  assert [e["subset"] for e in examples] == ["olympiadbench"] * 3
  assert [parse_answer(e["answer"]) for e in examples] == [(1, 3)] * 3


@pytest.mark.parametrize("change,field", [
    ({"label": 3}, "label"), ({"label": -2}, "label"), ({"label": True}, "label"), ({"label": "1"}, "label"),
    ({"steps": []}, "steps"), ({"steps": ["a", 2]}, "steps"), ({"steps": "a"}, "steps"),
    ({"final_answer_correct": "false"}, "final_answer_correct"), ({"problem": None}, "problem"),
])
def test_refuses_bad_rows_naming_file_row_and_field(tmp_path, change, field):
  rows = [official_row(0), {**official_row(1), **change}]
  (tmp_path / "math.json").write_text(json.dumps(rows))
  with pytest.raises(ValueError) as e:
    load_processbench(str(tmp_path))
  message = str(e.value)
  assert "math.json: row 1: field " + repr(field) in message and "row 0" not in message
  assert "Qwen/ProcessBench layout" in message


def test_reports_every_bad_row_at_once_with_the_fix(tmp_path):
  lines = [official_row(0), {**official_row(1), "label": 3}, {k: v for k, v in official_row(2).items()
                                                              if k != "final_answer_correct"}]
  (tmp_path / "gsm8k.jsonl").write_text("\n".join(map(json.dumps, lines)))
  with pytest.raises(ValueError) as e:
    load_processbench(str(tmp_path))
  message = str(e.value)
  assert "2 problem(s)" in message
  assert "gsm8k.jsonl: row 1 (line 2): field 'label'" in message and "1-based labels" in message
  assert "gsm8k.jsonl: row 2 (line 3): field 'final_answer_correct'" in message


def test_refuses_bad_files_and_folders(tmp_path):
  with pytest.raises(FileNotFoundError, match="neither a file nor a folder"):
    load_processbench(str(tmp_path / "missing"))
  with pytest.raises(ValueError, match="no <subset>.json"):
    load_processbench(str(tmp_path))
  (tmp_path / "gsm8k.jsonl").write_text(json.dumps(official_row(0)) + "\n{oops\n")
  with pytest.raises(ValueError, match="gsm8k.jsonl line 2 is not valid JSON"):
    load_processbench(str(tmp_path))
  (tmp_path / "gsm8k.json").write_text("[]")
  with pytest.raises(ValueError, match="both a .json and a .jsonl"):
    load_processbench(str(tmp_path))
  (tmp_path / "gsm8k.jsonl").unlink()
  with pytest.raises(ValueError, match="gsm8k.json: no rows"):
    load_processbench(str(tmp_path))


# ---------------------------------------------------------------------------------------------- chains


def recompute(example):
  """From the prompt alone: the chain's steps, which steps' own sums are wrong, and whether the final written
  result is the true sum."""
  numbers = [int(n) for n in re.findall(r"\d+", example["prompt"])]
  start, operands, written = numbers[0], numbers[1::2], numbers[2::2]
  previous = [start] + written[:-1]
  steps = [f"{a}+{b}={c}" for a, b, c in zip(previous, operands, written)]
  wrong = [a + b != c for a, b, c in zip(previous, operands, written)]
  return steps, wrong, written[-1] == start + sum(operands)


@pytest.fixture(scope="module")
def chains():
  return synthetic_processbench(seed=0, per_subset=100)


def test_labels_are_the_first_wrong_step_of_the_arithmetic(chains):
  for e in chains:
    steps, wrong, final_ok = recompute(e)
    num_wrong = sum(wrong)
    assert e["steps"] == steps and e["label"] == (wrong.index(True) if num_wrong else -1)
    assert e["final_answer_correct"] == final_ok
    assert parse_answer(e["answer"]) == (e["label"], len(steps))
    if e["trap"]:
      assert final_ok and e["label"] != -1 and num_wrong == 2      # the second error cancels the first
    else:
      assert num_wrong == (e["label"] != -1) and final_ok == (e["label"] == -1)


def test_class_and_trap_counts_per_subset(chains):
  for subset in SUBSETS:
    rows = [e for e in chains if e["subset"] == subset]
    assert len(rows) == 100 and sum(e["label"] != -1 for e in rows) == 50 and sum(e["trap"] for e in rows) == 10
    assert len({e["id"] for e in rows}) == 100


def test_subsets_rise_in_length_and_numbers(chains):
  lengths = {s: sorted({len(e["steps"]) for e in chains if e["subset"] == s}) for s in SUBSETS}
  assert lengths == {"len3": [3, 4], "len4": [4, 5], "len5": [5, 6], "len7": [7, 8]}
  top = [max(int(n) for e in chains if e["subset"] == s for n in re.findall(r"\d+", e["prompt"])) for s in SUBSETS]
  assert top == sorted(top) and top[0] < top[-1]


def test_deterministic_by_seed():
  assert synthetic_processbench(3, 20) == synthetic_processbench(3, 20)
  assert synthetic_processbench(3, 20) != synthetic_processbench(4, 20)


def test_text_fits_the_char_tokenizer(chains):
  alphabet = set(DEFAULT_ALPHABET)
  for e in chains:
    for text in (e["prompt"], step_verdicts(e["steps"]), e["answer"], final_answer_baseline(e)):
      assert set(text) <= alphabet, text
    assert len(e["prompt"]) < 64


# ---------------------------------------------------------------------------------------------- task


def test_task_examples_verify_and_demonstrate():
  task = make_task("processbench_chains", trap_frac=0.5)
  assert isinstance(task, ProcessBenchChains) and task.subsets == tuple(SUBSETS)
  rng = np.random.default_rng(0)
  examples = [task.make_example(rng) for _ in range(200)]
  again = np.random.default_rng(0)
  assert examples == [task.make_example(again) for _ in range(200)]
  assert {task.category(e) for e in examples} == set(SUBSETS)
  assert 0.35 < np.mean([e["label"] != -1 for e in examples]) < 0.65 and any(e["trap"] for e in examples)
  for e in examples:
    assert all(key in e for key in task.required_fields)
    demo = task.demonstration(e)
    assert demo == "".join("-" if w else "+" for w in recompute(e)[1])
    assert task.verify(demo, e["answer"]) == 1.0 and task.extract_answer(demo) == demo
    assert task.verify(demo + "+", e["answer"]) == 0.0               # wrong count: malformed
  assert task.extract_answer(" +-+\n") == "+-+" and task.extract_answer("yes") is None
  assert task.extract_answer("") is None
  assert generate_splits(task, num_train=30, num_test=10, seed=0)["test"][0]["demonstration"]


def test_task_verify_is_the_exact_earliest_step_match():
  task = ProcessBenchChains()
  assert [task.verify(v, "2/4") for v in ("++-+", "++--", "+--+", "++++", "++-", " ++-+ ")] == [1, 1, 0, 0, 0, 1]
  assert [task.verify(v, "-1/3") for v in ("+++", "++-", "+++ +")] == [1, 0, 0]


def test_running_difference_chains_label_and_verify_like_running_sums():
  """op="-": every written number stays >= 0 (an error may be negative only then), the labels are the first
  wrong difference, traps cancel, and the prompt is the steps' own text."""
  task = make_task("processbench_chains", op="-", trap_frac=0.5)
  rng = np.random.default_rng(1)
  for _ in range(2000):
    e = task.make_example(rng)
    numbers = [int(n) for n in re.findall(r"\d+", e["prompt"])]
    start, operands, written = numbers[0], numbers[1::2], numbers[2::2]
    wrong = [a - b != c for a, b, c in zip([start] + written[:-1], operands, written)]
    assert "+" not in e["prompt"] and e["prompt"].count("-") == len(e["steps"]) == len(operands)
    assert e["prompt"] == str(start) + "".join(s[s.index("-"):] for s in e["steps"]) + ">"
    assert e["label"] == (wrong.index(True) if any(wrong) else -1)
    assert e["final_answer_correct"] == (written[-1] == start - sum(operands)) and start - sum(operands) >= 1
    assert sum(wrong) == (2 if e["trap"] else int(e["label"] != -1))
    demo = task.demonstration(e)
    assert demo == step_verdicts(e["steps"]) == "".join("-" if w else "+" for w in wrong)
    assert task.verify(demo, e["answer"]) == 1.0
  assert step_verdicts(["9-4=5", "5-2=4"]) == "+-"


@pytest.mark.parametrize("kwargs", [{"error_frac": 1.5}, {"trap_frac": -0.1}, {"max_error": 0},
                                    {"subsets": ("len9",)}, {"subsets": ()}, {"error_frac": True}, {"op": "*"}])
def test_task_refuses_bad_parameters(kwargs):
  with pytest.raises(ValueError, match="processbench_chains"):
    make_task("processbench_chains", **kwargs)


# ---------------------------------------------------------------------------------------------- baselines


def _f1(chains, verdict_of):
  preds = [predicted_index(verdict_of(e), len(e["steps"])) for e in chains]
  return processbench_metrics([e["subset"] for e in chains], preds, [e["label"] for e in chains]), preds


def test_final_answer_baseline_cannot_localise(chains):
  """It accepts every correct solution and every trap, and finds an error only when it sits in the last step."""
  m, preds = _f1(chains, final_answer_baseline)
  assert MALFORMED not in preds
  for s in SUBSETS:
    assert m[f"{s}/acc_cor"] == 100.0 and m[f"{s}/acc_err"] < 100.0
  assert all(p == -1 for p, e in zip(preds, chains) if e["trap"])
  hits = [p == e["label"] for p, e in zip(preds, chains) if e["label"] != -1]
  assert sum(hits) == sum(e["label"] == len(e["steps"]) - 1 for e in chains if e["label"] != -1)
  assert 0.0 < m["f1"] < 100.0
  oracle, _ = _f1(chains, lambda e: step_verdicts(e["steps"]))     # the supervised target: the upper bound
  assert oracle["f1"] == 100.0 and m["f1"] < oracle["f1"]


@pytest.mark.parametrize("op", ["+", "-"])
def test_checks_target_writes_each_step_undone_then_its_verdict(op):
  """The worked demonstration grades as the step labels do, and each check is the step undone: the value the
  verifier computes is nowhere in the chain's text unless the step is right."""
  rng = np.random.default_rng(4)
  task = make_task("processbench_chains", op=op, sft_target="checks")
  for _ in range(50):
    example = task.make_example(rng)
    target = task.demonstration(example)
    assert task.extract_answer(target) == step_verdicts(example["steps"])
    assert task.verify(target, example["answer"]) == 1.0
  undo = {"+": "-", "-": "+"}[op]
  assert worked_verdicts(["55-14=38", "38-10=28"]) == "38+14=52:55-28+10=38:38+"
  assert worked_verdicts(["5+3=8", "8+4=13"]) == "8-3=5:5+13-4=9:8-"
  assert all(undo in check for check, _ in step_checks(example["steps"]))


def test_format_target_teaches_the_verdict_form_without_error_information():
  rng = np.random.default_rng(3)
  task = make_task("processbench_chains", sft_target="format")
  for _ in range(20):
    example = task.make_example(rng)
    target = task.demonstration(example)
    assert target == "+" * len(example["steps"])
    assert task.verify(target, example["answer"]) == float(example["label"] == -1)
  with pytest.raises(ValueError, match="sft_target must be one of"):
    make_task("processbench_chains", sft_target="labels")
