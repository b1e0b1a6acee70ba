"""Trajectory types: the trained loss mask is separate from the attended mask, segment and turn ids, the row
source and segment kind registries; single-turn rows get defaults under which every number is unchanged."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.core.registry import IdRegistry
from rlkit.core.types import ROW_SOURCE, ROW_SOURCES, SEGMENT_KINDS, Rollout, TrainBatch
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.rollout.sampler import SamplingConfig
from rlkit.train.rl_config import rl_defaults
from rlkit.train.steps import default_step_inputs, make_rl_loss, rl_counts
from tests.fast_compile import fast_compile

CFG = TransformerConfig(vocab_size=32, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=16, rope_theta=10_000.0)
MODEL = Transformer(CFG)
P, R, N = 3, 6, 4


def _rollout(**kw) -> Rollout:
  rng = np.random.default_rng(0)
  mask = np.arange(R)[None] < np.array([6, 4, 2, 5])[:, None]
  fields = dict(prompt=jnp.asarray(rng.integers(3, 32, (N, P)), jnp.int32), prompt_mask=jnp.ones((N, P), bool),
                response=jnp.asarray(rng.integers(3, 32, (N, R)), jnp.int32), response_mask=jnp.asarray(mask),
                logprobs=jnp.asarray(np.where(mask, -1.0, 0.0), jnp.float32), lengths=jnp.asarray(mask.sum(1)),
                finished=jnp.ones(N, bool), group_ids=jnp.zeros(N, jnp.int32))
  fields.update(kw)
  return Rollout(**fields)


def test_single_turn_defaults():
  ro = _rollout()
  np.testing.assert_array_equal(ro.loss_mask, ro.response_mask)
  expect = np.where(ro.response_mask, SEGMENT_KINDS["policy"], SEGMENT_KINDS["pad"])
  np.testing.assert_array_equal(ro.segment_ids, expect)
  np.testing.assert_array_equal(ro.turn_ids, 0)
  np.testing.assert_array_equal(ro.num_calls, 1)
  # the defaults are ordinary leaves: they survive tree maps and jit, and are not recomputed from a changed mask
  doubled = jax.jit(lambda r: r.replace(response_mask=jnp.zeros_like(r.response_mask)))(ro)
  np.testing.assert_array_equal(doubled.loss_mask, ro.response_mask)


def test_registries_give_stable_ids_and_refuse_duplicates():
  assert [ROW_SOURCES.name(i) for i in range(4)] == ["policy", "teacher", "peer", "padding"]
  assert ROW_SOURCE["teacher"] == 1 and "peer" in ROW_SOURCES
  assert list(SEGMENT_KINDS)[:6] == ["pad", "prompt", "policy", "tool_call", "observation", "summary"]
  kinds = IdRegistry("kind", ("a",))
  assert kinds.add("b") == 1
  with pytest.raises(ValueError, match="already registered"):
    kinds.add("a")
  with pytest.raises(KeyError, match="Valid kind names: b, a|Valid kind names: a, b"):
    kinds["c"]


def _batch(ro: Rollout, advantages) -> TrainBatch:
  zeros = jnp.zeros(ro.response.shape, jnp.float32)
  logp = jnp.where(ro.loss_mask, -1.5, 0.0)
  return TrainBatch(tokens=ro.tokens, attention_mask=ro.attention_mask, loss_mask=ro.loss_mask, old_logp=logp,
                    rollout_logp=logp, advantages=advantages, token_weights=zeros + 1.0,
                    group_ids=ro.group_ids, row_source=jnp.zeros(N, jnp.int32),
                    segment_ids=ro.segment_ids, turn_ids=ro.turn_ids)


@fast_compile()
def test_observation_tokens_are_attended_but_not_trained():
  """A multi-turn row: columns 2-3 of every row are an observation (attended, not trained). The loss and its
  gradient do not depend on the advantages placed on observation tokens, but do depend on which observation
  tokens the model saw (they are context for the later policy tokens)."""
  obs = np.zeros((N, R), bool)
  obs[:, 2:4] = True
  base = _rollout()
  attended = np.asarray(base.response_mask)
  loss_mask = attended & ~obs
  segments = np.where(obs, SEGMENT_KINDS["observation"], np.asarray(base.segment_ids))
  ro = base.replace(loss_mask=jnp.asarray(loss_mask), segment_ids=jnp.asarray(segments, jnp.int32),
                    turn_ids=jnp.asarray(np.cumsum(np.diff(obs, prepend=0, axis=1) != 0, 1), jnp.int32))
  c = rl_defaults()
  c.max_new_tokens = R
  loss_fn = make_rl_loss(MODEL, c, SamplingConfig(max_new_tokens=R))
  params = init_params(CFG, jax.random.key(0))

  def value_and_grad(batch):
    inputs = dict(default_step_inputs(c), **rl_counts(batch))
    return jax.jit(jax.value_and_grad(lambda p: loss_fn(p, batch, inputs)[0]))(params)

  adv = jnp.asarray(np.random.default_rng(1).normal(size=(N, R)), jnp.float32)
  loss, grads = value_and_grad(_batch(ro, adv))
  loss_obs, grads_obs = value_and_grad(_batch(ro, jnp.where(jnp.asarray(obs), 100.0, adv)))
  assert float(loss) == float(loss_obs)
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(grads_obs)):
    np.testing.assert_array_equal(a, b)
  # other observation tokens: a different context for the policy's later tokens, so a different loss
  other = ro.replace(response=jnp.where(jnp.asarray(obs), (ro.response + 7) % 29 + 3, ro.response))
  loss_other, _ = value_and_grad(_batch(other, adv))
  assert abs(float(loss_other) - float(loss)) > 1e-6
  # and with single-turn defaults the observation columns would be trained: the same advantages move the loss
  single, _ = value_and_grad(_batch(base, jnp.where(jnp.asarray(obs), 100.0, adv)))
  assert abs(float(single) - float(loss)) > 1e-3
