"""Rewards reach the token estimators whole: components, `correct` and per-segment rewards ([N, S] by segment
kind) arrive as device arrays beside the rewards, so an estimator can place a reward on the tokens of one kind
(a tool call judged apart from the answer)."""
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlkit.core.types import SEGMENT_KINDS, TrainBatch
from rlkit.rewards import RewardOutput, check_output, concat_outputs, take
from rlkit.train.phases.advantages import TOKEN_ESTIMATORS, TokenEstimator, with_advantages

N, R = 4, 5
SEEN = {}


def _by_segment(arrays, batch, cfg, capacity, valid):
  """Each token gets its row's reward for the token's segment kind, plus the `bonus` component."""
  SEEN["arrays"] = arrays
  per_token = jnp.take_along_axis(arrays.segment_rewards, batch.segment_ids, axis=1)
  return per_token + arrays.components["bonus"][:, None], {}


TOKEN_ESTIMATORS.add("test_by_segment", TokenEstimator(_by_segment, needs_values=False))


def _output(n=N) -> RewardOutput:
  rng = np.random.default_rng(0)
  return RewardOutput(rewards=rng.normal(size=n), correct=rng.random(n) > 0.5,
                      components={"bonus": np.arange(n, dtype=np.float64)}, failures={},
                      segment_rewards=rng.normal(size=(n, len(SEGMENT_KINDS))))


def _batch() -> TrainBatch:
  kinds = np.full((N, R), SEGMENT_KINDS["policy"])
  kinds[:, 1] = SEGMENT_KINDS["tool_call"]
  kinds[:, 2] = SEGMENT_KINDS["observation"]
  loss = kinds != SEGMENT_KINDS["observation"]
  zeros = jnp.zeros((N, R), jnp.float32)
  return TrainBatch(tokens=jnp.zeros((N, 2 + R), jnp.int32), attention_mask=jnp.ones((N, 2 + R), bool),
                    loss_mask=jnp.asarray(loss), old_logp=zeros, rollout_logp=zeros, advantages=zeros,
                    token_weights=zeros + 1, group_ids=jnp.arange(N, dtype=jnp.int32), row_source=jnp.zeros(N, jnp.int32),
                    segment_ids=jnp.asarray(kinds, jnp.int32))


def test_a_token_estimator_reads_components_and_per_segment_rewards():
  out = _output()
  cfg = ml_collections.ConfigDict({"advantage": "test_by_segment", "adv_eps": 1e-6})
  batch = with_advantages(_batch(), out, cfg, 2, lambda d: {k: jnp.asarray(v) for k, v in d.items()})
  kinds = np.asarray(_batch().segment_ids)
  want = out.segment_rewards[np.arange(N)[:, None], kinds] + out.components["bonus"][:, None]
  want = np.where(kinds == SEGMENT_KINDS["observation"], 0.0, want)     # never on untrained tokens
  np.testing.assert_allclose(batch.advantages, want.astype(np.float32), rtol=1e-6)
  arrays = SEEN["arrays"]
  np.testing.assert_array_equal(arrays.correct, out.correct)
  np.testing.assert_allclose(arrays.rewards, out.rewards.astype(np.float32))


def test_segment_rewards_are_checked_kept_and_concatenated():
  out = _output()
  assert check_output(out, N, "r") is out
  both = concat_outputs([out, take(out, [3, 0])])
  np.testing.assert_array_equal(both.segment_rewards, np.concatenate([out.segment_rewards,
                                                                      out.segment_rewards[[3, 0]]]))
  bad = RewardOutput(out.rewards, None, {}, {}, segment_rewards=np.zeros((N, 2)))
  with pytest.raises(ValueError, match=r"segment_rewards must be a float64 array of shape \(4, 6\)"):
    check_output(bad, N, "r")
  with pytest.raises(ValueError, match="some outputs have `segment_rewards`"):
    concat_outputs([out, RewardOutput(out.rewards, out.correct, dict(out.components), {})])
