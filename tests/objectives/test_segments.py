"""SLCA-GRPO's segment advantages (rlkit/objectives/segments.py) and the `slca` token estimator with its config
section (rlkit/train/slca.py): one kind is GRPO exactly, each kind's credit stays on its own tokens, the weights
scale after normalisation, the gate, flat and padding rows, and the errors."""
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

from rlkit.core.labels import SEGMENT_KINDS
from rlkit.core.types import TrainBatch
from rlkit.objectives import group_advantages
from rlkit.objectives.segments import gate_rewards, segment_advantages
from rlkit.rewards import RewardOutput
from rlkit.train import slca
from rlkit.train.phases.advantages import token_advantages, with_advantages

G, N, R = 4, 8, 6
TOOL, SUMMARY, OBS, POLICY = (SEGMENT_KINDS[k] for k in ("tool_call", "summary", "observation", "policy"))


def _rewards(seed=0):
  rng = np.random.default_rng(seed)
  r = np.zeros((N, len(SEGMENT_KINDS)), np.float32)
  r[:, TOOL] = rng.integers(0, 2, N)
  r[:, SUMMARY] = rng.normal(size=N)
  r[:, POLICY] = rng.normal(size=N)
  return r


def _ids():
  """Each row: two tool-call tokens, two observation tokens, two summary tokens."""
  return jnp.asarray(np.tile([TOOL, TOOL, OBS, OBS, SUMMARY, SUMMARY], (N, 1)), jnp.int32)


def test_one_kind_over_every_token_is_grpo_exactly():
  r = _rewards()
  ids = jnp.full((N, R), POLICY, jnp.int32)
  adv = segment_advantages(jnp.asarray(r), ids, (POLICY,), (1.0,), G)
  np.testing.assert_array_equal(adv, token_advantages("group", r[:, POLICY], G, R, 1e-6))


def test_each_kind_gets_its_own_group_advantage_and_no_other():
  r = _rewards()
  adv = np.asarray(segment_advantages(jnp.asarray(r), _ids(), (TOOL, SUMMARY), (1.0, 1.0), G))
  tool = np.asarray(group_advantages("group", jnp.asarray(r[:, TOOL]), G))
  summary = np.asarray(group_advantages("group", jnp.asarray(r[:, SUMMARY]), G))
  np.testing.assert_array_equal(adv[:, :2], np.repeat(tool[:, None], 2, 1))
  np.testing.assert_array_equal(adv[:, 4:], np.repeat(summary[:, None], 2, 1))
  assert (adv[:, 2:4] == 0).all()                              # observations: no credit
  # The point of SLCA: a noisier summary judgment moves only the summary tokens.
  noisy = r.copy()
  noisy[:, SUMMARY] += np.random.default_rng(1).normal(size=N) * 3
  again = np.asarray(segment_advantages(jnp.asarray(noisy), _ids(), (TOOL, SUMMARY), (1.0, 1.0), G))
  np.testing.assert_array_equal(again[:, :2], adv[:, :2])
  assert not np.allclose(again[:, 4:], adv[:, 4:])


def test_weights_scale_after_normalisation_and_centring_only_skips_the_std():
  r = jnp.asarray(_rewards())
  one = np.asarray(segment_advantages(r, _ids(), (TOOL, SUMMARY), (1.0, 1.0), G))
  weighted = np.asarray(segment_advantages(r, _ids(), (TOOL, SUMMARY), (0.5, 2.0), G))
  np.testing.assert_array_equal(weighted[:, :2], 0.5 * one[:, :2])
  np.testing.assert_array_equal(weighted[:, 4:], 2.0 * one[:, 4:])
  centred = np.asarray(segment_advantages(r, _ids(), (SUMMARY,), (1.0,), G, scale=False))
  s = np.asarray(r[:, SUMMARY]).reshape(-1, G)
  np.testing.assert_allclose(centred[:, 4], (s - s.mean(1, keepdims=True)).reshape(-1), rtol=1e-6)


def test_the_gate_zeroes_the_other_kinds_of_rows_whose_call_failed():
  r = _rewards()
  gated = np.asarray(gate_rewards(jnp.asarray(r), (TOOL, SUMMARY), 1.0))
  failed = r[:, TOOL] < 1.0
  assert failed.any() and (~failed).any()
  assert (gated[failed, SUMMARY] == 0).all()
  np.testing.assert_array_equal(gated[~failed, SUMMARY], r[~failed, SUMMARY])
  np.testing.assert_array_equal(gated[:, TOOL], r[:, TOOL])
  np.testing.assert_array_equal(gated[:, POLICY], r[:, POLICY])      # a kind not gated


def test_flat_groups_and_padding_rows_get_zero():
  r = _rewards()
  r[:G, TOOL] = 1.0                                            # the first group's calls all succeed: flat
  valid = np.ones(N, bool)
  valid[G + 1] = False
  adv = np.asarray(segment_advantages(jnp.asarray(r), _ids(), (TOOL, SUMMARY), (1.0, 1.0), G,
                                      valid=jnp.asarray(valid)))
  assert (adv[:G, :2] == 0).all() and (adv[G + 1] == 0).all()
  assert (adv[:G, 4:] != 0).any()                              # its summaries still differ


def _batch() -> TrainBatch:
  """Four rows of one group: policy tokens, a tool-call token and an observation token (not trained)."""
  n, r = 4, 5
  kinds = np.full((n, r), POLICY)
  kinds[:, 1], kinds[:, 2] = TOOL, OBS
  zeros = jnp.zeros((n, r), jnp.float32)
  return TrainBatch(tokens=jnp.zeros((n, 2 + r), jnp.int32), attention_mask=jnp.ones((n, 2 + r), bool),
                    loss_mask=jnp.asarray(kinds != OBS), old_logp=zeros, rollout_logp=zeros, advantages=zeros,
                    token_weights=zeros + 1, group_ids=jnp.zeros(n, jnp.int32), row_source=jnp.zeros(n, jnp.int32),
                    segment_ids=jnp.asarray(kinds, jnp.int32))


def _cfg(**slca_fields):
  cfg = ml_collections.ConfigDict({"advantage": "slca", "adv_eps": 1e-6, "slca": slca.slca_defaults()})
  cfg.slca.update(slca_fields)
  return cfg


def test_the_estimator_reads_the_reward_and_the_batch_and_every_field_acts():
  """`rl.advantage=slca` through the stage's advantage phase (policy, tool_call and observation tokens); each
  field of `rl.slca` changes the advantages."""
  batch = _batch()
  n = batch.loss_mask.shape[0]
  rng = np.random.default_rng(3)
  seg = rng.normal(size=(n, len(SEGMENT_KINDS)))
  seg[:, TOOL] = [1.0, 0.0, 0.0, 1.0]
  out = RewardOutput(rewards=seg.sum(1), correct=None, components={}, failures={}, segment_rewards=seg)

  def advantages(**fields):
    return np.asarray(with_advantages(batch, out, _cfg(**fields), n, lambda b: b).advantages)
  base = advantages(kinds="tool_call,policy", weights="1,1")
  ids = np.asarray(batch.segment_ids)
  tool = np.asarray(group_advantages("group", jnp.asarray(seg[:, TOOL], jnp.float32), n))
  np.testing.assert_array_equal(base[ids == TOOL], np.broadcast_to(tool[:, None], ids.shape)[ids == TOOL])
  assert (base[ids == OBS] == 0).all()
  for fields in ({"kinds": "tool_call", "weights": "1"}, {"weights": "1,3"}, {"scale": False}, {"gate": True},
                 {"gate": True, "gate_threshold": 0.0}):
    changed = advantages(**{"kinds": "tool_call,policy", "weights": "1,1", **fields})
    if fields == {"gate": True, "gate_threshold": 0.0}:       # every call passes a threshold of 0: no change
      np.testing.assert_array_equal(changed, base)
    else:
      assert not np.array_equal(changed, base), fields


def test_a_reward_without_segment_rewards_stops_with_the_fix():
  batch = _batch()
  out = RewardOutput(rewards=np.arange(4.0), correct=None, components={}, failures={})
  with pytest.raises(ValueError, match="needs per-segment rewards.*segment_rewards"):
    with_advantages(batch, out, _cfg(), 4, lambda b: b)


@pytest.mark.parametrize("fields,message", [
    ({"kinds": ""}, "names no segment kind"),
    ({"kinds": "tool_call,answer"}, "'answer' is not a segment kind"),
    ({"kinds": "pad"}, "'pad' is not a segment kind that holds tokens"),
    ({"kinds": "summary,summary", "weights": "1,1"}, "names a kind twice"),
    ({"weights": "1"}, "gives 1 weight\\(s\\) for 2 kind\\(s\\)"),
    ({"weights": "1,x"}, "not a comma-separated list of numbers"),
    ({"weights": "1,-1"}, "negative weight"),
    ({"kinds": "tool_call", "weights": "1", "gate": True}, "gate=True gates the kinds after the first"),
])
def test_config_errors_name_the_key(fields, message):
  with pytest.raises(ValueError, match=message):
    slca.check(_cfg(**fields), "rl")
