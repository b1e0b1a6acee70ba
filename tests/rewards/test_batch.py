"""RewardBatch / RewardOutput: batch validation, the output contract (`check_output`), and the row algebra the
trainer's sampling rounds need (`concat_outputs`, `take`)."""
import numpy as np
import pytest

from rlkit.rewards import RewardOutput, check_output, concat_outputs, take
from tests.rewards._verifiers import make_batch


def make_output(rewards, correct=True, failures=None) -> RewardOutput:
  rewards = np.asarray(rewards, np.float64)
  return RewardOutput(rewards=rewards, correct=rewards > 0.5 if correct else None,
                      components={"a": rewards * 2, "b": -rewards}, failures=dict(failures or {}))


def test_batch_converts_dtypes_and_has_a_length():
  batch = make_batch(["x", "y", "z"], fields=[{"rubric": {"items": [1, 2]}}, {}, {"k": 3}])
  assert len(batch) == 3
  assert batch.completion_tokens.dtype == np.int32 and batch.lengths.dtype == np.int32
  assert batch.group_ids.dtype == np.int32 and batch.finished.dtype == np.bool_
  assert batch.fields[0]["rubric"]["items"] == [1, 2]


@pytest.mark.parametrize("field,value,match", [
    ("answers", ["0"], "answers has 1 rows, completions has 3"),
    ("lengths", np.ones(2, np.int32), r"lengths must be a 1-d integer array with 3 rows, got int32 of shape \(2,\)"),
    ("finished", np.ones(3, np.int32), "finished must be a 1-d bool array"),
    ("completion_tokens", np.zeros(3, np.int32), "completion_tokens must be a 2-d integer array"),
    ("group_ids", np.zeros(3, np.float32), "group_ids must be a 1-d integer array"),
])
def test_batch_rejects_inconsistent_fields(field, value, match):
  with pytest.raises(ValueError, match=match):
    make_batch(["x", "y", "z"], **{field: value})


def test_check_output_accepts_a_valid_output():
  out = make_output([1.0, 0.0, 0.5], failures={"timeout": 1})
  assert check_output(out, 3, "mine") is out
  assert check_output(make_output([0.0], correct=False), 1, "mine").correct is None


@pytest.mark.parametrize("change,match", [
    (lambda o: setattr(o, "rewards", o.rewards[:2]), r"rewards must be a float64 array of shape \(3,\), got float64 "
                                                    r"array of shape \(2,\)"),
    (lambda o: setattr(o, "rewards", o.rewards.astype(np.float32)), "rewards must be a float64 array.*got float32"),
    (lambda o: setattr(o, "rewards", [1.0, 0.0, 0.5]), "rewards must be a float64 array.*got list"),
    (lambda o: o.rewards.__setitem__(1, np.nan), "rewards has 1 non-finite value.*first at row 1: nan"),
    (lambda o: setattr(o, "correct", o.rewards), "correct must be a bool array"),
    (lambda o: o.components.__setitem__("c", np.zeros(4)),
     r"components\['c'\] must be a float64 array of shape \(3,\)"),
    (lambda o: o.components["a"].__setitem__(0, np.inf), r"components\['a'\] has 1 non-finite"),
    (lambda o: o.failures.__setitem__("timeout", -1), "failures must map a kind .* got 'timeout': -1"),
    (lambda o: o.failures.__setitem__("timeout", 1.0), "failures .*non-negative int count, got .timeout.: 1.0"),
])
def test_check_output_names_the_reward_and_the_problem(change, match):
  out = make_output([1.0, 0.0, 0.5])
  change(out)
  with pytest.raises(ValueError, match=r"reward 'mine' returned an invalid RewardOutput for 3 rows: " + match):
    check_output(out, 3, "mine")


def test_check_output_rejects_other_types():
  with pytest.raises(ValueError, match="expected a RewardOutput, got tuple"):
    check_output((np.zeros(3), 0), 3, "old_style")


def test_concat_appends_rows_and_sums_failures():
  a = make_output([1.0, 0.0], failures={"timeout": 1})
  b = make_output([0.25, 1.0, 0.0], failures={"timeout": 2, "KeyError": 1})
  out = concat_outputs([a, b])
  np.testing.assert_array_equal(out.rewards, [1.0, 0.0, 0.25, 1.0, 0.0])
  np.testing.assert_array_equal(out.correct, [True, False, False, True, False])
  np.testing.assert_array_equal(out.components["a"], 2 * out.rewards)
  np.testing.assert_array_equal(out.components["b"], -out.rewards)
  assert out.failures == {"timeout": 3, "KeyError": 1}
  assert a.failures == {"timeout": 1}           # inputs untouched
  check_output(out, 5, "concat")


def test_concat_refuses_outputs_of_different_rewards():
  a = make_output([1.0])
  with pytest.raises(ValueError, match="component names differ"):
    concat_outputs([a, RewardOutput(a.rewards, a.correct, {"a": a.rewards}, {})])
  with pytest.raises(ValueError, match="some outputs have `correct`"):
    concat_outputs([a, make_output([1.0], correct=False)])
  with pytest.raises(ValueError, match="at least one"):
    concat_outputs([])


def test_take_selects_rows_in_order_and_keeps_failures():
  out = concat_outputs([make_output([0.0, 1.0, 0.25], failures={"timeout": 1}), make_output([0.75, 0.5])])
  kept = take(out, [4, 0, 1])
  np.testing.assert_array_equal(kept.rewards, [0.5, 0.0, 1.0])
  np.testing.assert_array_equal(kept.correct, [False, False, True])
  np.testing.assert_array_equal(kept.components["a"], [1.0, 0.0, 2.0])
  assert kept.failures == {"timeout": 1}
  assert take(out, []).rewards.shape == (0,)
  assert take(make_output([1.0], correct=False), [0]).correct is None
  with pytest.raises(ValueError, match="indices must be integers"):
    take(out, np.ones(5, bool))
  # take of concat == concat of takes: what the trainer relies on when it filters rounds
  parts = [make_output([0.0, 1.0]), make_output([0.5, 0.25])]
  np.testing.assert_array_equal(take(concat_outputs(parts), [1, 2]).rewards,
                                concat_outputs([take(parts[0], [1]), take(parts[1], [0])]).rewards)


def test_the_reward_batch_module_does_not_import_jax():
  """The verifier worker imports the reward modules; JAX's ~1.5 s import there counted against the per-call
  time limit (rewards/batch.py once took SEGMENT_KINDS from rlkit.core.types; they live in core/labels.py)."""
  import subprocess
  import sys
  code = "import sys, rlkit.rewards.batch; assert 'jax' not in sys.modules, 'jax imported'; print('ok')"
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
  assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]
