"""The pretraining corpus's tasks: worded and worked skills (rlkit/data/skills.py) and the `mixture` of skills
(rlkit/data/mixture.py): demonstrations that their own verifiers accept, strict grading, held-out prompts
never in train, skill shares that follow the weights, and clear errors."""
import collections

import numpy as np
import pytest

import rlkit.data  # noqa: F401  (registers the tasks)
from rlkit.data.skills import column_steps, reduction_steps
from rlkit.data.splits import generate_splits
from rlkit.data.tasks import evaluate_expression, make_task

SKILLS = {"add": {"task": "arithmetic", "weight": 3.0, "kwargs": {"ops": "+", "max_digits": 3}},
          "story": {"task": "word_problems", "weight": 1.0},
          "check": {"task": "processbench_chains", "kwargs": {"sft_target": "steps"}},
          "tool": {"task": "tool_calls", "weight": 1.0, "kwargs": {"max_digits": 2}}}


@pytest.mark.parametrize("name,kwargs", [("word_problems", {}), ("arithmetic_steps", {}),
                                         ("arithmetic_steps", {"method": "columns", "max_digits": 4}),
                                         ("tool_calls", {}), ("mixture", {"skills": SKILLS})])
def test_demonstrations_pass_and_wrong_answers_fail(name, kwargs):
  task, rng = make_task(name, **kwargs), np.random.default_rng(0)
  for _ in range(200):
    example = task.make_example(rng)
    demo = task.demonstration(example)
    assert task.verify(demo, example["answer"]) == 1.0, (example, demo)
    assert task.verify("", example["answer"]) == 0.0


def test_worked_steps_compute_the_value():
  assert reduction_steps("12+34*5") == ["34*5=170", "12+170=182"]
  assert reduction_steps("9-4-3") == ["9-4=5", "5-3=2"]                     # left to right
  assert column_steps(457, 385) == ["7+5=12 carry 1", "5+8+1=14 carry 1", "4+3+1=8"]
  task, rng = make_task("arithmetic_steps", num_operands=4), np.random.default_rng(1)
  for _ in range(100):
    example = task.make_example(rng)
    expression = example["prompt"][len("Work out "):-2]
    assert int(example["steps"][-1].rsplit("=", 1)[1]) == evaluate_expression(expression)[0]


def test_answers_are_graded_in_their_place_only():
  story = make_task("word_problems")
  assert story.verify("12+7=19. Answer: 19", "19") == 1.0
  assert story.verify("12+7=19", "19") == 0.0                                # no "Answer:": not graded
  assert story.verify("Answer: 18, not 19", "19") == 0.0
  tool = make_task("tool_calls")
  assert tool.verify("<call>mul(23,4)</call><result>91</result>", "mul(23,4)|92") == 1.0   # the call is graded
  assert tool.verify("<call>mul(4,23)</call>", "mul(23,4)|92") == 0.0
  assert tool.verify("mul(23,4)", "mul(23,4)|92") == 0.0


def test_mixture_follows_weights_and_keeps_each_skills_own_fields():
  task, rng = make_task("mixture", skills=SKILLS), np.random.default_rng(2)
  examples = [task.make_example(rng) for _ in range(3000)]
  shares = collections.Counter(e["skill"] for e in examples)
  weights = {"add": 3.0, "story": 1.0, "check": 1.0, "tool": 1.0}
  for skill, w in weights.items():
    assert abs(shares[skill] / 3000 - w / 6) < 0.03, shares
  check = next(e for e in examples if e["skill"] == "check")
  assert "steps" in check and task.category(check) == "check"
  assert task.demonstration(check) == make_task("processbench_chains").demonstration(
      {**check, "answer": check["answer"].split("\t")[1]})
  assert task.verify("19", "add\t19") == 1.0 and task.verify("19", "story\t19") == 0.0   # the skill's own grader


def test_mixture_held_out_prompts_are_never_trained_on():
  task = make_task("mixture", skills=SKILLS)
  splits = generate_splits(task, 2000, 200, seed=0)
  test = {r["prompt"] for r in splits["test"]}
  assert not test & {r["prompt"] for r in splits["train"]}
  assert {task.category(r) for r in splits["test"]} == set(SKILLS)          # every skill is held out


@pytest.mark.parametrize("skills,match", [
    ({}, "skills must map"),
    ({"a": {"task": "arithmetic", "weight": 0}}, "weight must be a number > 0"),
    ({"a": {"task": "arithmetic", "wieght": 1}}, "takes 'weight' and 'kwargs' only"),
    ({"a\tb": {"task": "arithmetic"}}, "without a tab"),
    ({"a": {"task": "arithmetic", "kwargs": {"digits": 3}}}, "unknown parameter"),
])
def test_mixture_refuses_bad_skills(skills, match):
  with pytest.raises(ValueError, match=match):
    make_task("mixture", skills=skills)
