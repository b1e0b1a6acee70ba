"""`keyword_arithmetic` (CALIF's experiment task): prompts carry the instruction and fit the char tokenizer,
demonstrations follow it on the drawn share, and its eval metrics are the constraint reward's own checks."""
import numpy as np
import pytest

from rlkit.data import make_task
from rlkit.models.tokenizer import DEFAULT_ALPHABET
from rlkit.rewards import REWARDS
from tests.rewards import _verifiers as V


def test_examples_carry_the_instruction_and_a_base_prompt():
  task = make_task("keyword_arithmetic", max_digits=2, follow_frac=0.3)
  rng = np.random.default_rng(0)
  examples = [task.make_example(rng) for _ in range(400)]
  for e in examples:
    word = e["constraints"][0]["word"]
    assert e["prompt"] == f"{e['base_prompt']}[{word}]" and set(e["prompt"]) <= set(DEFAULT_ALPHABET)
    assert task.demonstration(e) == (f"{e['answer']} {word}" if e["follows"] else e["answer"])
  assert 0.25 < np.mean([e["follows"] for e in examples]) < 0.35
  with pytest.raises(ValueError, match="upper-case words"):
    make_task("keyword_arithmetic", words=("blue",))


def test_eval_metrics_are_the_constraint_rewards_checks(executor):
  task = make_task("keyword_arithmetic", max_digits=2)
  example = {"prompt": "17+25=[BLUE]", "answer": "42", "base_prompt": "17+25=",
             "constraints": [{"kind": "keyword", "word": "BLUE"}], "follows": False}
  completions = ["42 BLUE", "BLUE", "42", "41 blue"]
  out = REWARDS.get("constraints")(task, executor)(V.make_batch(completions, ["42"] * 4, fields=[example] * 4))
  for i, c in enumerate(completions):
    counts = task.eval_counts(example, c)
    assert counts["constraint/satisfied"] == out.components["satisfaction"][i]
    assert counts["constraint/content_len"] == out.components["content_length"][i]
    assert counts["constraint/both"] == float(out.correct[i])
  assert [task.eval_counts(example, c)["constraint/both"] for c in completions] == [1.0, 0.0, 0.0, 0.0]
