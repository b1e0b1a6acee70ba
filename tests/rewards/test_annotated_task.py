"""`annotated_responses` (experiments/drm): examples carry the promised fields and text the features are visible
in; the true distribution of a controversial response is bimodal and of a consensus one unimodal (Sarle's rule
and the density's modes); the ratings are draws from it (moments, group shares); the true quantiles invert the
CDF; any completion maps to the population's features; bad parameters are refused by name."""
import numpy as np
import pytest

from rlkit.data import TASKS, make_task
from rlkit.data.annotated import count_modes, midpoint_levels, mixture_cdf, mixture_mean, mixture_quantiles
from rlkit.data.splits import stored_example
from rlkit.rewards import reward_metrics as M


@pytest.fixture(scope="module")
def task():
  return make_task("annotated_responses", max_digits=2)


@pytest.fixture(scope="module")
def examples(task):
  rng = np.random.default_rng(0)
  return [task.make_example(rng) for _ in range(3000)]


def test_examples_carry_the_promised_fields_in_visible_text(task, examples):
  assert "annotated_responses" in TASKS
  for e in examples[:200]:
    stored_example(task, e)                               # required fields present, plain JSON
    assert len(e["ratings"]) == task.num_ratings and e["controversial"] == e["verbose"]
    number = e["response"].split(" ")[0]
    assert (number == e["answer"]) == e["correct"]
    assert e["correct"] or 1 <= abs(int(number) - int(e["answer"])) <= 3 and int(number) >= 0    # a near miss
    assert (e["response"] == f"{number} as {e['prompt']}{number}") if e["verbose"] else e["response"] == number
    assert task.completion_features(e["response"], e["answer"]) == (e["correct"], e["verbose"])
    assert task.verify(task.demonstration(e), e["answer"]) == 1.0           # demonstrations are always right
    assert e["mixture"] == [list(c) for c in task.mixture(e["correct"], e["verbose"])]
  verbose = np.mean([e["verbose"] for e in examples])
  wrong = np.mean([not e["correct"] for e in examples])
  assert abs(verbose - task.verbose_frac) < 0.03 and abs(wrong - task.wrong_frac) < 0.03


def test_controversial_truth_is_bimodal_and_consensus_truth_unimodal(task):
  levels = midpoint_levels(2000)
  for correct in (True, False):
    contro, consensus = task.mixture(correct, True), task.mixture(correct, False)
    points = np.stack([mixture_quantiles(contro, levels), mixture_quantiles(consensus, levels)])
    np.testing.assert_array_equal(np.asarray(M.is_bimodal(points)), [True, False])
    assert count_modes(contro) == 2 and count_modes(consensus) == 1
  # The design's point: the verbose style has the higher mean but the lower 10% quantile.
  q10 = lambda m: mixture_quantiles(m, [0.1])[0]     # noqa: E731
  assert mixture_mean(task.mixture(True, True)) > mixture_mean(task.mixture(True, False))
  assert q10(task.mixture(True, True)) < q10(task.mixture(True, False))


def test_ratings_are_draws_from_the_true_distribution(task, examples):
  """Per feature combination (~750 examples x 8 ratings each): the pooled ratings' mean and std match the
  mixture's within 4 standard errors, and for verbose ones the share above the mixture's midpoint is group A's."""
  for correct in (True, False):
    for verbose in (True, False):
      r = np.concatenate([e["ratings"] for e in examples if (e["correct"], e["verbose"]) == (correct, verbose)])
      mixture = task.mixture(correct, verbose)
      mean = mixture_mean(mixture)
      std = np.sqrt(sum(w * (s ** 2 + (m - mean) ** 2) for w, m, s in mixture))
      assert abs(r.mean() - mean) < 4 * std / np.sqrt(len(r)), (correct, verbose, r.mean(), mean)
      assert abs(r.std() - std) < 4 * std / np.sqrt(2 * len(r)) + 0.01, (correct, verbose, r.std(), std)
      if verbose:
        above = np.mean(r > mean)
        assert abs(above - task.group_a_share) < 4 * np.sqrt(0.25 / len(r))


def test_quantiles_invert_the_cdf():
  gaussian = ((1.0, 2.0, 0.5),)
  np.testing.assert_allclose(mixture_quantiles(gaussian, [0.5, 0.841344746]), [2.0, 2.5], atol=1e-6)
  mixture = ((0.3, -1.0, 0.2), (0.7, 3.0, 1.0))
  levels = np.array([0.01, 0.2, 0.3, 0.5, 0.99])
  np.testing.assert_allclose(mixture_cdf(mixture, mixture_quantiles(mixture, levels)), levels, atol=1e-9)
  with pytest.raises(ValueError, match=r"levels must lie in \(0, 1\)"):
    mixture_quantiles(gaussian, [0.0])


def test_completions_map_to_features_and_the_eval_hook(task):
  assert task.completion_features("19", "19") == (True, False)
  assert task.completion_features("19 as 12+7=19", "19") == (True, True)
  assert task.completion_features("20 as 12+7=20", "19") == (False, True)
  assert task.completion_features("19!", "19") == (True, True)        # anything after the number is verbose
  assert task.completion_features("", "19") == (False, False)
  counts = [task.eval_counts({"prompt": "12+7=", "answer": "19"}, c) for c in ("19", "19 as 12+7=19", "20")]
  totals = {k: sum(c[k] for c in counts) for k in counts[0]}
  out = task.eval_metrics(totals)
  assert out["annotated/controversial"] == pytest.approx(1 / 3)
  assert out["annotated/true_mean"] == pytest.approx((1.0 + 1.5 + 0.0) / 3)


def test_the_safest_variant_is_right_and_terse(task, examples):
  e = next(x for x in examples if not x["correct"])
  variants = task.variants(e)
  assert sorted((v["correct"], v["verbose"]) for v in variants) == [(False, False), (False, True), (True, False),
                                                                    (True, True)]
  assert {v["response"].split(" ")[0] for v in variants if not v["correct"]} == {e["response"].split(" ")[0]}
  q10 = [mixture_quantiles(v["mixture"], [0.1])[0] for v in variants]
  means = [mixture_mean(v["mixture"]) for v in variants]
  safest, richest = variants[int(np.argmax(q10))], variants[int(np.argmax(means))]
  assert (safest["correct"], safest["verbose"]) == (True, False)
  assert (richest["correct"], richest["verbose"]) == (True, True)


@pytest.mark.parametrize("kwargs,needle", [
    ({"noise": 0.0}, "noise=0.0 is invalid; give a number > 0"),
    ({"group_a_share": 1.0}, r"group_a_share=1.0 is invalid; give a number in \(0, 1\)"),
    ({"num_ratings": 0}, "num_ratings must be an integer >= 1"),
    ({"wrong_frac": 1.5}, r"wrong_frac=1.5 is invalid; give a number in \[0, 1\]"),
    ({"like": float("nan")}, "like=nan is invalid"),
    ({"like": 0.4, "dislike": 0.4}, "would not be bimodal; raise like \\+ dislike"),
    ({"group_a_share": 0.97, "like": 1.2, "dislike": 0.0, "noise": 0.5}, "1 mode"),
    ({"digits": 2}, r"unknown parameter\(s\) \['digits'\]"),
])
def test_bad_parameters_are_refused_by_name(kwargs, needle):
  with pytest.raises(ValueError, match=needle):
    make_task("annotated_responses", **kwargs)
