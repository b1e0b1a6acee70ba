"""`advice_arithmetic`: its rubric parses, the rubric reward scores a pile of digits above a right short answer
exactly when 3 W > 1 under additive scoring and never under the gate, padding after a right answer pays under
both but not under the released protocol's dimensions (its failure clause), and its eval metrics are the
reward's."""
import numpy as np
import pytest

from rlkit.data import make_task
from rlkit.rewards import REWARDS
from rlkit.rewards.rubric_format import parse_rubric
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
    assert (x["prompt"], x["answer"]) == (y["prompt"], y["answer"]) and len(y["rubric"]) == 12
  with pytest.raises(ValueError, match="advice must be a non-empty string of distinct characters"):
    make_task("advice_arithmetic", advice="11")


@pytest.mark.parametrize("w", [0.1, 1.0])
def test_padding_after_the_answer_pays_except_under_the_released_dimensions(executor, w):
  """"42 13" is right (the verifier reads the leading integer) and meets 4 advice items: additive and gated pay
  it more than "42"; the answer dimension's failure clause zeroes it, and the advice dimension (all ten digits)
  is out of reach, so the released score is 1[right, nothing after] / (1 + 10 W)."""
  task = make_task("advice_arithmetic", max_digits=2, advice_points=w)
  example = {"prompt": "17+25=", "answer": "42", "rubric": task.rubric()}
  completions = ["42", "42 13", "42135", "41", "0123456789"]
  batch = V.make_batch(completions, ["42"] * 5, fields=[{"rubric": example["rubric"]}] * 5)
  z = 1 + 10 * w
  additive = REWARDS.get("rubric")(task, executor, mode="additive")(batch)
  gated = REWARDS.get("rubric")(task, executor, mode="gated")(batch)
  released = REWARDS.get("rubric")(task, executor, mode="dimensions")(batch)
  np.testing.assert_allclose(additive.rewards, [(1 + 2 * w) / z, (1 + 4 * w) / z, 5 * w / z, 2 * w / z, 10 * w / z],
                             rtol=1e-6)
  np.testing.assert_allclose(gated.rewards, [(1 + 2 * w) / z, (1 + 4 * w) / z, 0, 0, 0], rtol=1e-6, atol=1e-7)
  np.testing.assert_allclose(released.rewards, [1 / z, 0, 0, 0, 10 * w / z], rtol=1e-6, atol=1e-7)
  for i, completion in enumerate(completions):
    counts = task.eval_counts(example, completion)
    assert counts["rubric/dimensions"] == pytest.approx(released.rewards[i], rel=1e-6, abs=1e-7)
    assert counts["rubric/padded"] == float(i == 1)       # "42135" is one longer integer: nothing after it
    assert counts["rubric/clean"] == float(i == 0)
    assert counts["rubric/advice_met"] == len(set(completion) & set("0123456789"))
  assert set(task.eval_metrics({k: 2.0 for k in counts})) == {
      "rubric/additive", "rubric/gated", "rubric/dimensions", "rubric/advice_met", "rubric/padded", "rubric/clean"}


def test_pad_frac_pads_a_share_of_the_demonstrations_and_zero_draws_nothing():
  bare, padded = make_task("advice_arithmetic", max_digits=2), make_task("advice_arithmetic", max_digits=2,
                                                                         pad_frac=0.5)
  rng = np.random.default_rng(0)
  examples = [bare.make_example(rng) for _ in range(3)]
  assert all("pad" not in e and bare.demonstration(e) == e["answer"] for e in examples)
  rng = np.random.default_rng(1)
  demos = [(e, padded.demonstration(e)) for e in (padded.make_example(rng) for _ in range(200))]
  share = np.mean([d != e["answer"] for e, d in demos])
  assert 0.4 < share < 0.6
  assert all(padded.verify(d, e["answer"]) == 1.0 and (d == e["answer"] or (d[:-2] == e["answer"] and d[-2] == " "))
             for e, d in demos)
  with pytest.raises(ValueError, match=r"pad_frac must be in \[0, 1\]"):
    make_task("advice_arithmetic", pad_frac=1.5)
