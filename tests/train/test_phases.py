"""The RL iteration's phases one at a time (rlkit/train/phases/): advantages with padding rows, the TrainBatch
the phases build, sampler/trainer mismatch under truncated sampling, and MoE routing replay.

Stage-level checks of the same contracts (one whole iteration each) are in tests/train/test_stages.py.
"""
from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.core.types import ROW_SOURCE
from rlkit.data.pipeline import prompt_batch
from rlkit.data.tasks import make_task
from rlkit.models.tokenizer import CharTokenizer
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.objectives.advantages import ADVANTAGES, group_advantages
from rlkit.rollout.sampler import SamplingConfig
from rlkit.rollout.scoring import make_scorer, response_forward
from rlkit.train.rl_config import rl_defaults
from rlkit.train.phases.advantages import token_advantages
from rlkit.train.phases.collect import collect
from rlkit.train.phases.score import score, train_batch
from rlkit.train.steps import default_step_inputs, make_rl_loss, rl_counts
from tests.fast_compile import fast_compile as _fast_compile

TOK = CharTokenizer()
TASK = make_task("arithmetic", ops="+", min_digits=1, max_digits=2)
# Widths no other test module uses (no jitted sampler shared with them).
DENSE = TransformerConfig(vocab_size=TOK.vocab_size, hidden_size=32, intermediate_size=56, num_layers=1,
                          num_heads=2, num_kv_heads=1, head_dim=16, tie_word_embeddings=True, rope_theta=10_000.0)
MOE = DENSE.replace(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)
GROUP, R = 4, 5
ESTIMATORS = ("group", "batch", "none", "rloo")
# The sampling of the dense checks; compiled with XLA's default optimisations (the others use `_fast_compile`).
NUCLEUS = SamplingConfig(max_new_tokens=R, temperature=0.7, top_p=0.5, stop_ids=TOK.stop_ids, pad_id=TOK.pad_id)


def _put(batch):
  return batch


@functools.lru_cache(maxsize=1)
def _prompts(n: int = 6) -> dict:
  rng = np.random.default_rng(3)
  return prompt_batch([TASK.make_example(rng) for _ in range(n)], TOK, max_prompt_len=7)


def _samples(model, params, sampling, key=0):
  return collect(model, params, _prompts(), jax.random.key(key), sampling, GROUP, _put)


def _mismatch(batch) -> np.ndarray:
  """|old_logp - rollout_logp| on the policy rows' trained tokens."""
  policy = (np.asarray(batch.row_source) == ROW_SOURCE["policy"])[:, None] & np.asarray(batch.loss_mask)
  return np.abs(np.asarray(batch.old_logp) - np.asarray(batch.rollout_logp))[policy]


# --------------------------------------------------------------------------------- advantages and padding

def _padded(rewards: np.ndarray, group: int, pad_slots: list[list[int]], pad_value: float = 1e3):
  """Groups of `group` rewards with padding rows inserted at `pad_slots[g]` (positions in the padded group)."""
  capacity = group + len(pad_slots[0])
  out, valid = [], []
  for g, slots in enumerate(pad_slots):
    real = iter(rewards[g * group:(g + 1) * group])
    for i in range(capacity):
      pad = i in slots
      out.append(pad_value if pad else next(real))
      valid.append(not pad)
  return np.asarray(out), np.asarray(valid), capacity


@pytest.mark.parametrize("name", ESTIMATORS)
def test_padding_rows_change_no_advantage(name):
  """Every estimator: a padded group's real rows get the unpadded advantages, padding rows exactly 0; flat
  groups stay 0 whatever the padding claims."""
  rng = np.random.default_rng(0)
  rewards = rng.normal(size=4 * GROUP)
  rewards[2 * GROUP:3 * GROUP] = 0.7                        # a flat group
  rewards[3 * GROUP:] = rng.integers(0, 2, GROUP)           # binary rewards
  slots = [[0, 5], [4, 5], [2, 3], [1, 4]]                  # padding first, last, middle
  padded, valid, capacity = _padded(rewards, GROUP, slots)
  want = np.asarray(group_advantages(name, jnp.asarray(rewards, jnp.float32), GROUP))
  got = np.asarray(group_advantages(name, jnp.asarray(padded, jnp.float32), capacity, valid=jnp.asarray(valid)))
  np.testing.assert_allclose(got[valid], want, rtol=1e-5, atol=1e-6)
  assert np.all(got[~valid] == 0)
  assert np.all(want[2 * GROUP:3 * GROUP] == 0) and np.abs(want).max() > 0.1

  # token_advantages: the same per row, on every response position; all-valid equals no mask.
  tok = np.asarray(token_advantages(name, padded, capacity, R, 1e-6, valid))
  assert tok.shape == (len(padded), R) and np.all(tok == tok[:, :1])
  np.testing.assert_allclose(tok[valid, 0], want, rtol=1e-5, atol=1e-6)
  assert np.all(tok[~valid] == 0)
  np.testing.assert_array_equal(token_advantages(name, rewards, GROUP, R, 1e-6, np.ones(len(rewards), bool)),
                                token_advantages(name, rewards, GROUP, R, 1e-6))
  # The masked formulas with every row valid are the unmasked ones.
  all_valid = group_advantages(name, jnp.asarray(rewards, jnp.float32), GROUP, valid=jnp.ones(len(rewards), bool))
  np.testing.assert_allclose(all_valid, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ESTIMATORS)
def test_a_group_of_one_real_row_gets_zero(name):
  """A group left with one real row (the rest padding) is flat: 0, not the row's raw reward or a NaN."""
  rewards, valid = np.array([5.0, 1.0, 2.0, 3.0, -9.0, 4.0]), np.array([False, True, False, True, True, True])
  adv = np.asarray(group_advantages(name, jnp.asarray(rewards), 3, valid=jnp.asarray(valid)))
  assert np.all(adv[:3] == 0)                               # one real row: no peer to compare with
  assert np.all(adv[3:] != 0)


def test_every_estimator_is_checked_with_padding():
  assert sorted(ESTIMATORS) == sorted(ADVANTAGES.names()), "a new estimator needs the padding checks above"


def test_train_batch_masks_padding_rows_out():
  """train_batch: an invalid row attends to nothing and trains nothing; rollout_logp is 0 off the loss mask."""
  samples = _nucleus_samples()
  samples = dataclasses.replace(samples, valid=np.arange(len(samples)) % 5 != 0)
  n = len(samples)
  batch = train_batch(samples, np.ones((n, R), np.float32), _put)
  valid = samples.valid
  assert not np.asarray(batch.attention_mask)[~valid].any() and not np.asarray(batch.loss_mask)[~valid].any()
  np.testing.assert_array_equal(np.asarray(batch.loss_mask)[valid], np.asarray(samples.rollout.response_mask)[valid])
  assert np.all(np.asarray(batch.rollout_logp)[~np.asarray(batch.loss_mask)] == 0)
  np.testing.assert_array_equal(batch.group_ids, np.repeat(np.arange(n // GROUP), GROUP))


# ------------------------------------------------------------------------------- mismatch, dense model

@functools.lru_cache(maxsize=1)
def _dense_params():
  return init_params(DENSE, jax.random.key(0))


@functools.lru_cache(maxsize=None)
def _scorer(model, sampling, replay=False):
  return make_scorer(model, sampling, replay)


@functools.lru_cache(maxsize=1)
def _nucleus_samples():
  return _samples(Transformer(DENSE), _dense_params(), NUCLEUS)


def _scored(samples, model, params, sampling, replay=False):
  batch = train_batch(samples, np.zeros((len(samples), R), np.float32), _put)
  return score(batch, {"policy": (_scorer(model, sampling, replay), params)})


def test_trainer_logprobs_equal_the_samplers_under_nucleus_sampling():
  """Identical weights, f32, temperature 0.7 and top_p 0.5, XLA's default optimisations: the scorer's old
  log-probs equal the sampler's (the nucleus and its renormalisation are the same on the decode path and the
  full forward). The stage-level runs check top_k / top_p / temperature alone."""
  delta = _mismatch(_scored(_nucleus_samples(), Transformer(DENSE), _dense_params(), NUCLEUS))
  assert delta.size > 50
  assert delta.mean() <= 1e-5 and delta.max() <= 1e-4, (delta.mean(), delta.max())


def test_trainer_logprobs_equal_the_samplers_under_top_k_and_top_p():
  sampling = SamplingConfig(max_new_tokens=R, temperature=0.7, top_k=3, top_p=0.8, stop_ids=TOK.stop_ids,
                            pad_id=TOK.pad_id)
  model, params = Transformer(DENSE), _dense_params()
  with _fast_compile():
    delta = _mismatch(_scored(_samples(model, params, sampling), model, params, sampling))
  assert delta.mean() <= 1e-5 and delta.max() <= 1e-4, (delta.mean(), delta.max())


def test_mismatch_metric_counts_policy_rows_only():
  from rlkit.train.rl_metrics import mismatch
  samples = _nucleus_samples()
  source = samples.row_source.copy()
  source[GROUP - 1::GROUP] = ROW_SOURCE["teacher"]                  # one row per group: a teacher row
  samples = dataclasses.replace(samples, row_source=source)
  batch = train_batch(samples, np.zeros((len(samples), R), np.float32), _put)
  teacher = source == ROW_SOURCE["teacher"]
  rollout_logp = np.array(batch.rollout_logp)
  rollout_logp[teacher] = 0.0                                        # a teacher row has no sampler log-probs
  batch = score(batch.replace(rollout_logp=jnp.asarray(rollout_logp)),
                {"policy": (_scorer(Transformer(DENSE), NUCLEUS), _dense_params())})
  m = mismatch(batch)
  np.testing.assert_allclose(m["mismatch/mean"], _mismatch(batch).mean(), rtol=1e-6)
  assert m["mismatch/mean"] <= 1e-5 and m["mismatch/max"] <= 1e-4
  everything = np.abs(np.asarray(batch.old_logp) - rollout_logp)[np.asarray(batch.loss_mask)]
  assert everything.mean() > 0.1                                     # what counting teacher rows would give


# ------------------------------------------------------------------------------------ MoE routing replay

@pytest.fixture(scope="module")
def moe_batch():
  model, params = Transformer(MOE), init_params(MOE, jax.random.key(2))
  sampling = SamplingConfig(max_new_tokens=R, stop_ids=TOK.stop_ids, pad_id=TOK.pad_id)
  with _fast_compile():
    samples = _samples(model, params, sampling, key=4)
  batch = train_batch(samples, np.asarray(np.random.default_rng(0).normal(size=(len(samples), R)), np.float32),
                      _put)
  return model, params, sampling, batch


def _rotated(batch):
  """The batch with every recorded expert replaced by the next one (mod E): a routing other than the sampler's."""
  routed = batch.extras["routed_experts"]
  return batch.replace(extras=dict(batch.extras, routed_experts=(routed + 1) % MOE.num_experts))


def test_routing_replay_makes_the_trainers_experts_the_samplers(moe_batch):
  model, params, sampling, batch = moe_batch
  routed = np.asarray(batch.extras["routed_experts"])
  assert routed.shape == batch.tokens.shape + (len(MOE.moe_layers), MOE.num_experts_per_tok)
  real = np.asarray(batch.attention_mask)

  @jax.jit
  def experts(params, batch):     # the trainer forward's experts, replaying the sampler's and choosing its own
    return tuple(response_forward(model, params, batch.tokens, batch.attention_mask, R, given)[1].routed_experts
                 for given in (batch.extras["routed_experts"], None))

  with _fast_compile():
    replayed, free = experts(params, batch)
    with_replay = score(batch, {"policy": (_scorer(model, sampling, True), params)})
    without = score(batch, {"policy": (_scorer(model, sampling, False), params)})
  np.testing.assert_array_equal(np.asarray(replayed)[real], routed[real])
  same = (np.sort(np.asarray(free), -1) == np.sort(routed, -1)).all(axis=(-1, -2))[real]
  d_replay, d_free = _mismatch(with_replay), _mismatch(without)
  assert d_replay.mean() <= 1e-5 and d_replay.max() <= 1e-4, (d_replay.mean(), d_replay.max())
  # In f32 the full forward usually picks the sampler's experts anyway; where it does not, only replay agrees.
  if same.all():
    assert d_free.mean() <= 1e-5
  print(f"routing: {same.mean():.4f} of real tokens agree without replay; mismatch mean/max "
        f"{d_replay.mean():.2e}/{d_replay.max():.2e} with replay, {d_free.mean():.2e}/{d_free.max():.2e} without")


def test_routing_replay_is_what_the_scorer_and_the_step_read(moe_batch):
  """The scorer and the update step use `extras["routed_experts"]` exactly when replay is on: a rotated
  routing changes their numbers with replay and nothing without."""
  model, params, sampling, batch = moe_batch
  rotated = _rotated(batch)
  mask = np.asarray(batch.loss_mask)
  for replay in (True, False):
    scorer = _scorer(model, sampling, replay)
    with _fast_compile():
      a, b = np.asarray(scorer(params, batch)), np.asarray(scorer(params, rotated))
    if replay:
      assert np.abs(a - b)[mask].mean() > 1e-3
    else:
      np.testing.assert_array_equal(a, b)

  cfg = rl_defaults()
  cfg.max_new_tokens, cfg.replay_routing = R, True
  scored = score(batch, {"policy": (_scorer(model, sampling, True), params)})
  inputs = dict(default_step_inputs(cfg), **rl_counts(scored))
  for replay in (True, False):
    loss_fn = jax.jit(make_rl_loss(model, cfg, sampling, replay_routing=replay))
    with _fast_compile():
      a = float(loss_fn(params, scored, inputs)[0])
      b = float(loss_fn(params, _rotated(scored), inputs)[0])
    assert (a != b) if replay else (a == b), (replay, a, b)


def _shaper_batch():
  from rlkit.rewards import RewardBatch, RewardOutput
  batch = RewardBatch(prompts=["1+1="] * 2, completions=["2", "3"], completion_tokens=np.zeros((2, 4), np.int32),
                      lengths=np.array([1, 1]), finished=np.array([True, True]), answers=["2"] * 2,
                      fields=[{}] * 2, group_ids=np.zeros(2, np.int32))
  out = RewardOutput(rewards=np.array([1.0, 0.0]), correct=np.array([True, False]), components={}, failures={})
  return batch, out


@pytest.mark.parametrize("shaper, problem", [
    (lambda cfg, b, out: dataclasses.replace(out, rewards=out.rewards * np.nan), "shaper test_nan.*non-finite"),
    (lambda cfg, b, out: dataclasses.replace(out, rewards=out.rewards.astype(np.float32)), "float64 array"),
    (lambda cfg, b, out: dataclasses.replace(out, correct=~out.correct), "changed `correct`")])
def test_a_shapers_output_is_checked(monkeypatch, shaper, problem):
  """A registered reward shaper's output is checked as a reward's is, and may not change `correct`."""
  from rlkit.train.phases.reward import REWARD_SHAPERS, shape_rewards
  batch, out = _shaper_batch()
  monkeypatch.setitem(REWARD_SHAPERS._entries, "test_nan", shaper)    # registered for this test only
  with pytest.raises(ValueError, match=problem):
    shape_rewards(rl_defaults(), batch, out)
  monkeypatch.setitem(REWARD_SHAPERS._entries, "test_nan", lambda cfg, b, o: o)
  assert shape_rewards(rl_defaults(), batch, out).rewards is out.rewards
