"""`advice_arithmetic`: its rubric parses, the rubric reward scores a pile of digits above a right short answer
exactly when 3 W > 1 under additive scoring and never under the gate, and its eval metrics are the reward's."""
import numpy as np
import pytest

from rlkit.data import make_task
from rlkit.rewards import REWARDS
from rlkit.rewards.rubric import parse_rubric
from tests.rewards import _verifiers as V


@pytest.mark.parametrize("w,pile_wins", [(0.1, False), (0.5, True), (1.0, True)])
def test_a_pile_of_digits_beats_the_answer_only_under_additive_scoring(executor, w, pile_wins):
  task = make_task("advice_arithmetic", max_digits=2, advice_points=w)
  example = {"prompt": "17+25=", "answer": "42", "rubric": task.rubric()}
  parse_rubric(example["rubric"], "the test example")
  batch = V.make_batch(["42", "42135"], ["42", "42"], fields=[{"rubric": example["rubric"]}] * 2)
  additive = REWARDS.get("rubric")(task, executor, mode="additive")(batch)
  gated = REWARDS.get("rubric")(task, executor, mode="gated")(batch)
  np.testing.assert_allclose(additive.rewards, [(1 + 2 * w) / (1 + 10 * w), 5 * w / (1 + 10 * w)], rtol=1e-6)
  assert (additive.rewards[1] > additive.rewards[0]) == pile_wins
  assert gated.rewards[1] == 0.0 and gated.rewards[0] == pytest.approx(additive.rewards[0])
  np.testing.assert_array_equal(additive.correct, [True, False])
  for i, completion in enumerate(batch.completions):      # the eval hook scores as the reward does
    counts = task.eval_counts(example, completion)
    assert counts["rubric/additive"] == pytest.approx(additive.rewards[i], rel=1e-6)
    assert counts["rubric/gated"] == pytest.approx(gated.rewards[i], rel=1e-6)
  assert task.eval_counts(example, "42135")["rubric/advice_met"] == 5


def test_examples_are_the_arithmetic_tasks_with_a_rubric():
  plain, advice = make_task("arithmetic", max_digits=2), make_task("advice_arithmetic", max_digits=2)
  a, b = np.random.default_rng(0), np.random.default_rng(0)
  for _ in range(5):
    x, y = plain.make_example(a), advice.make_example(b)
    assert (x["prompt"], x["answer"]) == (y["prompt"], y["answer"]) and len(y["rubric"]) == 11
  with pytest.raises(ValueError, match="advice must be a non-empty string of distinct characters"):
    make_task("advice_arithmetic", advice="11")
