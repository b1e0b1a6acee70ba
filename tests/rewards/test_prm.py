"""Process verifiers: the ProcessBench metric against hand-computed cases and the official arithmetic, the counts
route, TIPS step-flag rewards under jit, the verdict format, and the registered rewards end to end."""
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.data.processbench import ProcessBenchChains
from rlkit.rewards import REWARDS, VerifierExecutor
from rlkit.rewards import prm
from rlkit.rewards.prm import (MALFORMED, first_flag, format_answer, parse_answer, parse_verdicts,
                               predicted_index, processbench_counts, processbench_f1, processbench_from_counts,
                               processbench_metrics, tips_reward)
from tests.rewards import _verifiers as V


def official_f1(pred, label):
  """The official scripts' arithmetic (QwenLM/ProcessBench code/run_eval.py), rewritten: np.mean over the
  match flags of each class, then the harmonic mean."""
  match = [p == lab for p, lab in zip(pred, label)]
  acc1 = np.mean([m for m, lab in zip(match, label) if lab != -1]) * 100
  acc2 = np.mean([m for m, lab in zip(match, label) if lab == -1]) * 100
  return acc1, acc2, 2 * acc1 * acc2 / (acc1 + acc2)


# ---------------------------------------------------------------------------------------------- metric


def test_f1_hand_case():
  """Erroneous rows 1-3: only row 1 names the exact earliest step (row 2 is one step early, row 3 says "no
  error"); the correct row 0 says "no error"."""
  m = processbench_f1([-1, 2, 0, -1], [-1, 2, 1, 3])
  assert m["num_err"] == 3 and m["num_cor"] == 1
  assert m["acc_err"] == pytest.approx(100 / 3) and m["acc_cor"] == 100.0
  assert m["f1"] == pytest.approx(2 * (100 / 3) * 100 / (100 / 3 + 100)) and m["f1"] == pytest.approx(50.0)


def test_minus_one_convention():
  """A correct sample must be predicted -1 exactly; naming any step on it is a miss, and so is predicting -1 on
  an erroneous one. A malformed prediction (-2) matches nothing."""
  m = processbench_f1([0, -1, MALFORMED, MALFORMED], [-1, 0, -1, 0])
  assert (m["acc_err"], m["acc_cor"], m["f1"]) == (0.0, 0.0, 0.0)
  m = processbench_f1([-1, 0], [-1, 0])
  assert (m["acc_err"], m["acc_cor"], m["f1"]) == (100.0, 100.0, 100.0)


def test_empty_class_is_nan_as_the_official_mean_of_nothing():
  """All-correct and all-wrong subsets: the missing class's accuracy and the F1 are NaN, as the official
  np.mean([]), but without its RuntimeWarning."""
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    all_correct = processbench_f1([-1, -1, 2], [-1, -1, -1])
    all_wrong = processbench_f1([1, 0, 2], [1, 2, 2])
  assert np.isnan(all_correct["acc_err"]) and all_correct["acc_cor"] == pytest.approx(200 / 3)
  assert np.isnan(all_wrong["acc_cor"]) and all_wrong["acc_err"] == pytest.approx(200 / 3)
  assert np.isnan(all_correct["f1"]) and np.isnan(all_wrong["f1"])
  assert (all_correct["num_err"], all_wrong["num_cor"]) == (0, 0)
  with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    assert np.isnan(official_f1([-1, -1, 2], [-1, -1, -1])[2])
    assert np.isnan(official_f1([1, 0, 2], [1, 2, 2])[2])
  assert np.isnan(processbench_f1([], [])["f1"])


def test_f1_is_zero_where_nothing_matches():
  """Our choice: both classes present, no match -> 0 (the official 0/0 is NaN)."""
  assert processbench_f1([0, 1], [-1, 0])["f1"] == 0.0
  assert processbench_f1([-1, 1], [-1, 0])["f1"] == 0.0     # acc_cor = 100, acc_err = 0: the harmonic mean is 0


def test_f1_equals_the_official_arithmetic_on_random_predictions():
  rng = np.random.default_rng(0)
  for _ in range(50):
    label = rng.integers(-1, 4, size=int(rng.integers(2, 40)))
    label[:2] = [-1, 0]                                  # both classes present
    pred = np.where(rng.random(label.size) < 0.5, label, rng.integers(-2, 4, size=label.size))
    if not np.any(pred == label):
      continue
    m = processbench_f1(pred, label)
    np.testing.assert_allclose([m["acc_err"], m["acc_cor"], m["f1"]], official_f1(pred, label), rtol=1e-12)


@pytest.mark.parametrize("pred,label", [([0, 1], [0]), ([0.5], [0]), ([True], [0]), ([0], [-2]),
                                        ([[0]], [[0]])])
def test_f1_refuses_bad_inputs(pred, label):
  with pytest.raises(ValueError, match="ProcessBench"):
    processbench_f1(pred, label)


def test_metrics_per_subset_and_plain_mean():
  subsets = ["gsm8k"] * 4 + ["math"] * 3
  pred = [-1, 2, 0, -1] + [-1, 1, 1]
  label = [-1, 2, 1, 3] + [-1, 1, 0]
  m = processbench_metrics(subsets, pred, label)
  assert m["gsm8k/f1"] == pytest.approx(50.0)
  assert (m["math/acc_err"], m["math/acc_cor"]) == (50.0, 100.0)
  assert m["math/f1"] == pytest.approx(200 / 3)
  assert m["f1"] == pytest.approx((50.0 + 200 / 3) / 2)         # per subset, not pooled over rows
  assert (m["gsm8k/num_err"], m["gsm8k/num_cor"], m["math/num_err"], m["math/num_cor"]) == (3, 1, 2, 1)
  assert np.isnan(processbench_metrics(["a", "b"], [-1, -1], [-1, 0])["f1"])   # subset "a" has no errors


def test_counts_summed_over_processes_equal_the_direct_metrics():
  """Rows split over three 'processes', counts added key by key, then divided once: the same numbers, NaN
  subsets included."""
  rng = np.random.default_rng(1)
  n = 200
  subsets = rng.choice(["gsm8k", "math", "olympiadbench", "all_correct"], size=n).tolist()
  label = rng.integers(-1, 5, size=n)
  label[[i for i, s in enumerate(subsets) if s == "all_correct"]] = -1
  pred = np.where(rng.random(n) < 0.6, label, rng.integers(-2, 5, size=n))
  totals = {}
  for part in np.array_split(np.arange(n), 3):
    local = {}
    for i in part:
      for key, value in processbench_counts(subsets[i], int(pred[i]), int(label[i])).items():
        local[key] = local.get(key, 0.0) + value
    for key, value in local.items():               # what process_sum does, per process
      totals[key] = totals.get(key, 0.0) + value
  direct = processbench_metrics(subsets, pred, label)
  routed = processbench_from_counts(totals)
  assert sorted(routed) == sorted(direct)
  np.testing.assert_array_equal([routed[k] for k in sorted(direct)], [direct[k] for k in sorted(direct)])
  assert np.isnan(direct["all_correct/f1"]) and np.isnan(direct["f1"])
  with pytest.raises(ValueError, match="unexpected key"):
    processbench_from_counts({"gsm8k/hits": 1.0})


# ---------------------------------------------------------------------------------------------- TIPS


FLAGS = np.array([[[0, 0, 1, 0], [0, 0, 0, 0], [0, 0, 0, 1]],      # row 0: 3 real steps, step 3 is padding
                  [[1, 1, 0, 0], [0, 1, 0, 0], [0, 0, 0, 0]]])     # row 1: 2 real steps
MASK = np.array([[1, 1, 1, 0], [1, 1, 0, 0]])


def test_first_flag_hand_cases():
  np.testing.assert_array_equal(first_flag(FLAGS, MASK), [[2, -1, -1], [0, 1, -1]])   # padding flags ignored


def test_tips_reward_hand_cases():
  """Row 0's solution ends wrong: flagging any real step is paid; row 1's is right: only all-clear is paid."""
  np.testing.assert_array_equal(tips_reward(FLAGS, MASK, np.array([1, 0])), [[1, 0, 0], [0, 0, 1]])
  np.testing.assert_array_equal(tips_reward(FLAGS.astype(bool), MASK.astype(bool), np.array([True, False])),
                                [[1, 0, 0], [0, 0, 1]])


def test_tips_reward_is_the_derived_verdict_of_first_flag_and_jits():
  rng = np.random.default_rng(2)
  flags = (rng.random((5, 4, 7)) < 0.2).astype(np.int32)
  mask = (np.arange(7)[None] < rng.integers(1, 8, size=(5, 1))).astype(np.int32)
  bad = rng.integers(0, 2, size=5)
  reward, first = jax.jit(tips_reward)(flags, mask, bad), jax.jit(first_flag)(flags, mask)
  assert reward.dtype == jnp.float32 and first.dtype == jnp.int32 and reward.shape == first.shape == (5, 4)
  np.testing.assert_array_equal(reward, tips_reward(flags, mask, bad))
  np.testing.assert_array_equal(reward, ((np.asarray(first) != -1) == bad[:, None]).astype(np.float32))


# ---------------------------------------------------------------------------------------------- verdicts


@pytest.mark.parametrize("text,n,flags", [
    ("++-+", 4, [0, 0, 1, 0]), (" ++-+\n", 4, [0, 0, 1, 0]), ("+", 1, [0]), ("---", 3, [1, 1, 1]),
    ("++-", 4, None), ("++-+-", 4, None), ("+ +-+", 4, None), ("++x+", 4, None), ("", 2, None), ("  ", 1, None),
    ("++−+", 4, None),                     # a Unicode minus is not '-'
    # worked verdicts: each step's check ("c+b=v:a"), then its verdict; only the verdicts count
    ("38+14=52:55-28+10=38:38+", 2, [1, 0]), (" 8-3=5:5+12-4=-8:8-\n", 2, [0, 1]),
    ("38+14=52:55-", 2, None), ("38+14=52:55", 1, None), ("38+14=52-", 1, None), ("52:55-", 1, None),
    ("38+14=52:55-+", 2, None),            # the two forms do not mix
])
def test_parse_verdicts(text, n, flags):
  assert parse_verdicts(text, n) == flags


def test_predicted_index():
  assert [predicted_index(t, 4) for t in ("++-+", "-+++", "++++", "+++-", "++-", "abcd")] == \
      [2, 0, -1, 3, MALFORMED, MALFORMED]
  with pytest.raises(ValueError, match="n_steps"):
    parse_verdicts("", 0)


def test_answer_round_trip_and_refusals():
  assert parse_answer(format_answer(2, 4)) == (2, 4) and parse_answer(format_answer(-1, 3)) == (-1, 3)
  for bad in ("2", "4/4", "-2/3", "a/3", "1/0", ""):
    with pytest.raises(ValueError, match="<label>/<number of steps>"):
      parse_answer(bad)


# ---------------------------------------------------------------------------------------------- rewards

# completion, answer, final_answer_correct
ROWS = [("++-+", "2/4", False),    # right step, says "incorrect": outcome and process both right
        ("+-++", "2/4", False),    # wrong step, but the derived verdict is right: outcome pays, process does not
        ("++++", "-1/4", True),    # correct solution, all clear
        ("++++", "1/4", True),     # a trap: the final answer is right, so accepting it is paid by the outcome
        ("++-", "2/4", False),     # wrong verdict count: malformed
        ("-+++", "-1/4", True)]    # flags a correct solution


def _batch(rows):
  return V.make_batch([r[0] for r in rows], [r[1] for r in rows],
                      fields=[{"final_answer_correct": r[2]} for r in rows])


def test_tips_outcome_pays_the_derived_verdict(executor):
  out = REWARDS.get("tips_outcome")(None, executor, format_penalty=0.5)(_batch(ROWS))
  np.testing.assert_array_equal(out.rewards, [1, 1, 1, 1, -0.5, 0])
  np.testing.assert_array_equal(out.correct, [True, False, True, False, False, False])
  np.testing.assert_array_equal(out.components["outcome"], [1, 1, 1, 1, 0, 0])
  np.testing.assert_array_equal(out.components["format"], [0, 0, 0, 0, -0.5, 0])
  assert sorted(out.components) == ["format", "outcome"] and out.failures == {}
  default = REWARDS.get("tips_outcome")(None, executor)(_batch(ROWS))
  np.testing.assert_array_equal(default.rewards, [1, 1, 1, 1, 0, 0])


def test_step_labels_pays_the_exact_match(executor):
  out = REWARDS.get("step_labels")(None, executor, format_penalty=0.5)(_batch(ROWS))
  np.testing.assert_array_equal(out.rewards, [1, 0, 1, 0, -0.5, 0])
  np.testing.assert_array_equal(out.correct, out.components["process"] > 0)
  np.testing.assert_array_equal(out.components["process"] + out.components["format"], out.rewards)


def test_correct_is_the_task_verifier(executor):
  """Both rewards log as `correct` exactly what the task's verify (the eval accuracy) accepts."""
  task = ProcessBenchChains()
  verified = [task.verify(c, a) == 1.0 for c, a, _ in ROWS]
  for name in ("tips_outcome", "step_labels"):
    np.testing.assert_array_equal(REWARDS.get(name)(task, executor)(_batch(ROWS)).correct, verified)


def test_rewards_refuse_bad_data_and_kwargs(executor):
  tips = REWARDS.get("tips_outcome")(None, executor)
  with pytest.raises(ValueError, match="final_answer_correct"):
    tips(V.make_batch(["++"], ["-1/2"]))
  with pytest.raises(ValueError, match="final_answer_correct"):
    tips(V.make_batch(["++"], ["-1/2"], fields=[{"final_answer_correct": "yes"}]))
  step_labels = REWARDS.get("step_labels")(None, executor)
  np.testing.assert_array_equal(step_labels(V.make_batch(["++"], ["-1/2"])).rewards, [1.0])   # needs no outcome
  with pytest.raises(ValueError, match="<label>/<number of steps>"):
    step_labels(V.make_batch(["++"], ["-1"]))
  with pytest.raises(ValueError, match="unknown keyword"):
    REWARDS.get("tips_outcome")(None, executor, format_reward=0.1)
  with pytest.raises(ValueError, match="format_penalty"):
    REWARDS.get("step_labels")(None, executor, format_penalty=float("nan"))


def _raises(*_):
  raise ZeroDivisionError("boom")


@pytest.mark.parametrize("name", ["tips_outcome", "step_labels"])
def test_failed_rows_get_the_failure_reward(monkeypatch, name):
  """Inline executor, so the patched row function is the one called."""
  monkeypatch.setattr(prm, "score_verdict", _raises)
  with VerifierExecutor(timeout_s=0) as inline:
    out = REWARDS.get(name)(None, inline, failure_reward=-1.0, format_penalty=0.5)(_batch(ROWS[:2]))
  assert out.failures == {"ZeroDivisionError": 2}
  np.testing.assert_array_equal(out.rewards, [-1.0, -1.0])
  np.testing.assert_array_equal(out.correct, [False, False])
  np.testing.assert_array_equal(out.components["format"], [0.0, 0.0])
