"""Verifier rewards: values, `correct` as the verifier's acceptance (not a reward threshold), failures of the
task's code, kwargs checking, and worker == inline == direct calls."""
import numpy as np
import pytest

from rlkit.core.registry import Registry
from rlkit.data.tasks import Arithmetic, Countdown
from rlkit.rewards import REWARDS, RewardOutput, VerifierExecutor, check_reward_kwargs
from rlkit.rewards import verifier as verifier_lib
from tests.rewards import _verifiers as V


def test_verifier_scores_acceptance(executor):
  reward_fn = REWARDS.get("verifier")(Arithmetic(), executor)
  out = reward_fn(V.make_batch(["357", "356", "abc", " 357 and more", "-0"], ["357"] * 4 + ["0"]))
  np.testing.assert_array_equal(out.rewards, [1, 0, 0, 1, 1])
  np.testing.assert_array_equal(out.correct, [True, False, False, True, True])
  assert list(out.components) == ["verifier"] and out.failures == {}
  np.testing.assert_array_equal(out.components["verifier"], out.rewards)


def test_verifier_format_adds_the_format_bonus(executor):
  reward_fn = REWARDS.get("verifier_format")(Arithmetic(), executor)
  out = reward_fn(V.make_batch(["357", "12", "abc"], ["357"] * 3))
  np.testing.assert_allclose(out.rewards, [1.1, 0.1, 0.0])
  np.testing.assert_array_equal(out.correct, [True, False, False])
  np.testing.assert_allclose(out.components["format"], [0.1, 0.1, 0.0])
  np.testing.assert_array_equal(out.components["verifier"], [1.0, 0.0, 0.0])


def test_verifier_format_correct_is_acceptance_not_a_reward_threshold(executor):
  """A wrong answer that parses earns the format bonus; with a bonus >= 0.5 `reward > 0.5` would call it
  correct, `correct` does not."""
  reward_fn = REWARDS.get("verifier_format")(Arithmetic(), executor, format_reward=0.6)
  out = reward_fn(V.make_batch(["12", "357"], ["357"] * 2))
  np.testing.assert_allclose(out.rewards, [0.6, 1.6])
  np.testing.assert_array_equal(out.rewards > 0.5, [True, True])
  np.testing.assert_array_equal(out.correct, [False, True])


@pytest.mark.parametrize("name", ["verifier", "verifier_format"])
def test_failing_rows_get_the_failure_reward_and_are_counted(executor, name, caplog):
  """The task's own code raises on one row and hangs on another: those rows score `failure_reward`, are not
  correct, earn no format bonus, and the components still sum to the reward."""
  reward_fn = REWARDS.get(name)(V.MisbehavingTask(), executor, failure_reward=-1.0)
  out = reward_fn(V.make_batch(["5", "zero", "spin", "4"], ["5"] * 4))
  assert out.failures == {"ZeroDivisionError": 1, "timeout": 1}
  bonus = 0.1 if name == "verifier_format" else 0.0
  np.testing.assert_allclose(out.rewards, [1 + bonus, -1, -1, bonus])
  np.testing.assert_array_equal(out.correct, [True, False, False, False])
  np.testing.assert_allclose(sum(out.components.values()), out.rewards)
  assert "ZeroDivisionError; first at row 1: division by zero" in caplog.text


def test_worker_inline_and_direct_calls_agree(executor):
  task = Countdown()
  rng = np.random.default_rng(0)
  examples = [task.make_example(rng) for _ in range(64)]
  completions = [ex["solution"] if i % 3 else ex["solution"] + "+1" for i, ex in enumerate(examples)]
  completions[5] = "(" * 300      # malformed and over the parser's length limit
  batch = V.make_batch(completions, [ex["answer"] for ex in examples])
  with VerifierExecutor(timeout_s=0) as inline:
    for name in ("verifier", "verifier_format"):
      in_worker = REWARDS.get(name)(task, executor)(batch)
      in_process = REWARDS.get(name)(task, inline)(batch)
      np.testing.assert_array_equal(in_worker.rewards, in_process.rewards)
      np.testing.assert_array_equal(in_worker.correct, in_process.correct)
  direct = [task.verify(c, a) for c, a in zip(batch.completions, batch.answers)]
  np.testing.assert_array_equal(in_worker.correct, np.array(direct) == 1.0)
  assert 0 < in_worker.correct.sum() < len(batch)


def test_unknown_kwargs_name_the_reward_and_the_valid_keywords(executor):
  with pytest.raises(ValueError, match=r"reward 'verifier_format': unknown keyword\(s\) \['bonus'\]; valid keywords: "
                                       r"\['format_reward', 'failure_reward'\]"):
    REWARDS.get("verifier_format")(Arithmetic(), executor, bonus=1.0)
  with pytest.raises(ValueError, match=r"reward 'verifier': unknown keyword\(s\) \['format_reward'\]"):
    check_reward_kwargs("verifier", {"format_reward": 0.2})
  check_reward_kwargs("verifier", {"failure_reward": 0.0})
  with pytest.raises(ValueError, match="reward 'verifier_format': format_reward must be a finite number, got 'x'"):
    REWARDS.get("verifier_format")(Arithmetic(), executor, format_reward="x")
  with pytest.raises(KeyError, match="Valid reward names: .*verifier, verifier_format"):
    REWARDS.get("verifer")


def test_registered_rewards_have_their_output_checked(monkeypatch, executor):
  monkeypatch.setattr(verifier_lib, "REWARDS", Registry("reward"))

  @verifier_lib.register_reward("broken")
  def make_broken(task, executor, *, scale: float = 1.0):
    def reward_fn(batch):
      return RewardOutput(rewards=np.full(len(batch) + 1, scale), correct=None, components={}, failures={})
    return reward_fn

  assert verifier_lib.REWARDS.get("broken").keywords == ("scale",)
  with pytest.raises(ValueError, match=r"reward 'broken' returned an invalid RewardOutput for 2 rows: rewards must "
                                       r"be a float64 array of shape \(2,\)"):
    verifier_lib.REWARDS.get("broken")(Arithmetic(), executor)(V.make_batch(["1", "2"]))
  with pytest.raises(ValueError, match="already registered"):
    verifier_lib.register_reward("broken")(make_broken)
