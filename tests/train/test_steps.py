"""Update steps: v2 equals v1 bit for bit on v1's inputs; token weights, padding rows, traced step inputs,
the non-finite guard, micro-batching, and every RL loss switch."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlkit.core.types import Metric, TrainBatch
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.objectives.loss_terms import LOSS_TERMS
from rlkit.rollout.sampler import SamplingConfig
from rlkit.rollout.scoring import make_scorer
from rlkit.train.rl_config import rl_defaults
from rlkit.train.steps import (default_step_inputs, init_train_state, make_rl_loss, make_rl_step, make_sft_step,
                               rl_counts)
from tests.fast_compile import fast_compile
from tests.train import legacy_steps_v1 as v1
from tests.xla_flags import default_emitters

CFG = TransformerConfig(vocab_size=32, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=16, rope_theta=10_000.0)
MODEL = Transformer(CFG)
R = 5


def _rl_dict(n=8, p=4, r=R, seed=0):
  rng = np.random.default_rng(seed)
  lengths = rng.integers(1, r + 1, n)
  response_mask = np.arange(r)[None, :] < lengths[:, None]
  prompt_mask = np.ones((n, p), bool)
  prompt_mask[::3, 0] = False
  tokens = rng.integers(3, CFG.vocab_size, (n, p + r)).astype(np.int32)
  return {
      "tokens": jnp.asarray(tokens), "attention_mask": jnp.asarray(np.concatenate([prompt_mask, response_mask], 1)),
      "response": jnp.asarray(tokens[:, p:]), "response_mask": jnp.asarray(response_mask),
      "old_logp": jnp.asarray(np.where(response_mask, -rng.uniform(1, 4, (n, r)), 0.0), jnp.float32),
      "ref_logp": jnp.asarray(np.where(response_mask, -rng.uniform(1, 4, (n, r)), 0.0), jnp.float32),
      "advantages": jnp.asarray(rng.normal(size=n), jnp.float32),
  }


def _batch(d) -> TrainBatch:
  n, r = d["response"].shape
  return TrainBatch(tokens=d["tokens"], attention_mask=d["attention_mask"], loss_mask=d["response_mask"],
                    old_logp=d["old_logp"], rollout_logp=d["old_logp"],
                    advantages=jnp.broadcast_to(d["advantages"][:, None], (n, r)),
                    token_weights=jnp.ones((n, r), jnp.float32), group_ids=jnp.arange(n, dtype=jnp.int32) // 4,
                    row_source=jnp.zeros(n, jnp.int32), ref_logp=d["ref_logp"])


def _cfg(**kw):
  c = rl_defaults()
  c.max_new_tokens = R
  c.update(kw)
  return c


def _sampling(c):
  return SamplingConfig(max_new_tokens=R, temperature=c.temperature, top_k=c.top_k, top_p=c.top_p)


def _params():
  return init_params(CFG, jax.random.key(0))


def _v2_value_and_grad(c, batch, params=None):
  loss_fn = make_rl_loss(MODEL, c, _sampling(c))
  inputs = dict(default_step_inputs(c), **rl_counts(batch))
  (loss, _), grads = jax.jit(jax.value_and_grad(lambda p: loss_fn(p, batch, inputs), has_aux=True))(
      params if params is not None else _params())
  return loss, grads


V1_CASES = {
    "grpo": {}, "kl_entropy": dict(kl_beta=0.3, kl_estimator="k3", entropy_coef=0.01),
    "gspo_seq": dict(policy_loss="gspo", eps_low=3e-4, eps_high=4e-4, aggregation="seq-mean-token-mean"),
    "drgrpo": dict(aggregation="seq-mean-token-sum-norm", temperature=0.7, dual_clip=3.0),
}


@pytest.mark.parametrize("case", sorted(V1_CASES))
@fast_compile()
@default_emitters
def test_v2_loss_and_gradients_equal_v1_bit_for_bit(case):
  kw = V1_CASES[case]
  c = _cfg(**kw)
  d = _rl_dict()
  legacy = v1.RLLossConfig(policy_loss=c.policy_loss, eps_low=c.eps_low, eps_high=c.eps_high,
                           dual_clip=c.dual_clip or None, aggregation=c.aggregation, kl_estimator=c.kl_estimator,
                           kl_beta=c.kl_beta, entropy_coef=c.entropy_coef, temperature=c.temperature, max_len=R)
  norms = {"num_tokens_global": d["response_mask"].sum(), "num_seqs_global": d["response_mask"].any(-1).sum()}
  # Both with their metrics as aux outputs, as each step computes them (outputs change XLA's fusions).
  (old_loss, _), old_grads = jax.jit(jax.value_and_grad(lambda p: v1.rl_loss(MODEL, legacy, p, d, norms),
                                                        has_aux=True))(_params())
  loss, grads = _v2_value_and_grad(c, _batch(d))
  assert np.asarray(loss).tobytes() == np.asarray(old_loss).tobytes(), (float(loss), float(old_loss))
  for a, b in zip(jax.tree.leaves(grads), jax.tree.leaves(old_grads)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@fast_compile()
def test_v2_step_equals_v1_step_with_micro_batches():
  c = _cfg(kl_beta=0.1, aggregation="seq-mean-token-mean")
  d = _rl_dict()
  legacy = v1.RLLossConfig(aggregation=c.aggregation, kl_beta=c.kl_beta, max_len=R)
  tx = optax.adam(1e-2)
  old, old_m = v1.make_rl_step(MODEL, tx, legacy, 2)(v1.init_train_state(_params(), tx), d)
  new, new_m = make_rl_step(MODEL, tx, c, _sampling(c), 2)(init_train_state(_params(), tx), _batch(d),
                                                           default_step_inputs(c))
  assert float(new_m["loss"].value) == float(old_m["loss"])
  for a, b in zip(jax.tree.leaves(new.params), jax.tree.leaves(old.params)):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@fast_compile()
def test_zero_weight_token_is_a_masked_token_that_stays_in_attention_and_normaliser():
  c = _cfg()
  b = _batch(_rl_dict())
  row, col = 1, 0                                    # a response token with later tokens attending to it
  assert bool(b.loss_mask[row, col]) and bool(b.loss_mask[row, col + 1])
  weighted = b.replace(token_weights=b.token_weights.at[row, col].set(0.0))
  masked = b.replace(loss_mask=b.loss_mask.at[row, col].set(False))
  n_all, n_masked = float(b.loss_mask.sum()), float(masked.loss_mask.sum())
  lw, gw = _v2_value_and_grad(c, weighted)
  lm, gm = _v2_value_and_grad(c, masked)
  # token-mean: same numerator; the weighted token stays in the denominator.
  np.testing.assert_allclose(float(lw) * n_all, float(lm) * n_masked, rtol=1e-6)
  for a, m in zip(jax.tree.leaves(gw), jax.tree.leaves(gm)):
    np.testing.assert_allclose(np.asarray(a) * n_all, np.asarray(m) * n_masked, rtol=1e-5, atol=1e-7)
  # ... and it stays in the attention: dropping it from the attention mask changes the other tokens' loss.
  dropped = masked.replace(attention_mask=masked.attention_mask.at[row, 4 + col].set(False))
  ld, _ = _v2_value_and_grad(c, dropped)
  assert abs(float(ld) - float(lm)) > 1e-6


def _pad_rows(b: TrainBatch, k: int) -> TrainBatch:
  """k padding rows: arbitrary tokens and log-probs, every mask False (as an augmenter leaves them)."""
  rng = np.random.default_rng(9)
  pad = lambda x, fill: jnp.concatenate([x, jnp.asarray(fill, x.dtype)], 0)  # noqa: E731
  n, r = b.loss_mask.shape
  t = b.tokens.shape[1]
  return TrainBatch(
      tokens=pad(b.tokens, rng.integers(3, 30, (k, t))), attention_mask=pad(b.attention_mask, np.zeros((k, t))),
      loss_mask=pad(b.loss_mask, np.zeros((k, r))), old_logp=pad(b.old_logp, rng.normal(size=(k, r))),
      rollout_logp=pad(b.rollout_logp, np.zeros((k, r))), advantages=pad(b.advantages, rng.normal(size=(k, r))),
      token_weights=pad(b.token_weights, np.ones((k, r))), group_ids=pad(b.group_ids, np.full(k, 99)),
      row_source=pad(b.row_source, np.full(k, 3)), ref_logp=pad(b.ref_logp, rng.normal(size=(k, r))))


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@fast_compile()
def test_padding_rows_change_no_loss_or_gradient(aggregation):
  c = _cfg(aggregation=aggregation, kl_beta=0.2)
  b = _batch(_rl_dict())
  l0, g0 = _v2_value_and_grad(c, b)
  l1, g1 = _v2_value_and_grad(c, _pad_rows(b, 4))
  np.testing.assert_allclose(float(l1), float(l0), rtol=1e-6)
  for a, z in zip(jax.tree.leaves(g1), jax.tree.leaves(g0)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(z), rtol=1e-5, atol=1e-8)


@fast_compile()
def test_step_inputs_change_the_loss_without_recompiling():
  c = _cfg(kl_beta=0.5)
  tx = optax.sgd(0.0)
  step = make_rl_step(MODEL, tx, c, _sampling(c))
  b = _batch(_rl_dict())
  losses = []
  for beta in (0.5, 0.0, 2.0):
    inputs = dict(default_step_inputs(c), **{"weight/kl": jnp.float32(beta)})
    _, m = step(init_train_state(_params(), tx), b, inputs)
    losses.append(float(m["loss"].value))
  assert len(set(losses)) == 3
  assert step._cache_size() == 1


@fast_compile()
def test_non_finite_gradient_is_skipped_and_counted():
  c = _cfg()
  tx = optax.adam(1e-2)
  step = make_rl_step(MODEL, tx, c, _sampling(c))
  b = _batch(_rl_dict())
  bad = b.replace(advantages=b.advantages.at[0, 0].set(jnp.nan))
  state = init_train_state(_params(), tx)
  before = jax.tree.map(np.asarray, state)
  state, m = step(state, bad, default_step_inputs(c))
  assert int(m["skipped_updates"].value) == 1 and int(state.step) == 0
  for a, z in zip(jax.tree.leaves(state), jax.tree.leaves(before)):
    np.testing.assert_array_equal(np.asarray(a), z)
  state, m = step(state, b, default_step_inputs(c))
  assert int(m["skipped_updates"].value) == 0 and int(state.step) == 1


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@fast_compile()
def test_rl_micro_batching_matches_full_batch(aggregation):
  c = _cfg(aggregation=aggregation, kl_beta=0.1)
  b = _batch(_rl_dict())
  tx = optax.sgd(1.0)
  results = [make_rl_step(MODEL, tx, c, _sampling(c), mb)(init_train_state(_params(), tx), b,
                                                          default_step_inputs(c)) for mb in (1, 8)]
  (full, m1), (split, m8) = results
  np.testing.assert_allclose(m1["loss"].value, m8["loss"].value, rtol=1e-5, atol=1e-7)
  for k in ("clip_frac", "ratio_mean", "approx_kl", "entropy", "kl"):
    np.testing.assert_allclose(m1[k].value, m8[k].value, rtol=1e-5, atol=1e-7)
  for a, z in zip(jax.tree.leaves(full.params), jax.tree.leaves(split.params)):
    np.testing.assert_allclose(a, z, rtol=1e-4, atol=1e-7)


@fast_compile()
def test_metric_reductions_max_and_sum_combine_across_micro_batches():
  @LOSS_TERMS.register("test_row_max")
  def _row_max(cfg):
    def term(logp, logits, batch, step_inputs):
      del logits, step_inputs
      return jnp.zeros_like(logp), {"adv_max": Metric(jnp.max(batch.advantages), "max"),
                                    "rows": Metric(jnp.asarray(batch.num_rows, jnp.int32), "sum")}
    return term
  c = _cfg()
  c.loss_terms.test_row_max = 1.0
  b = _batch(_rl_dict())
  tx = optax.sgd(0.0)
  _, m = make_rl_step(MODEL, tx, c, _sampling(c), 4)(init_train_state(_params(), tx), b, default_step_inputs(c))
  assert float(m["adv_max"].value) == float(b.advantages.max())
  assert int(m["rows"].value) == 8


@fast_compile()
@default_emitters
def test_sft_micro_batching_matches_full_batch_and_v1():
  rng = np.random.default_rng(1)
  tokens = rng.integers(3, CFG.vocab_size, (8, 7)).astype(np.int32)
  attention = np.arange(7)[None, :] < rng.integers(3, 8, 8)[:, None]
  loss_mask = attention & (np.arange(7)[None, :] >= 2)
  batch = {"tokens": jnp.asarray(tokens), "attention_mask": jnp.asarray(attention),
           "loss_mask": jnp.asarray(loss_mask)}
  tx = optax.sgd(1.0)
  full, m1 = make_sft_step(MODEL, tx, 1)(init_train_state(_params(), tx), batch, {})
  split, m4 = make_sft_step(MODEL, tx, 4)(init_train_state(_params(), tx), batch, {})
  old, old_m = v1.make_sft_step(MODEL, tx, 1)(v1.init_train_state(_params(), tx), batch)
  assert float(m1["loss"].value) == float(old_m["loss"])
  np.testing.assert_allclose(m1["loss"].value, m4["loss"].value, rtol=1e-5)
  for a, z, o in zip(jax.tree.leaves(full.params), jax.tree.leaves(split.params), jax.tree.leaves(old.params)):
    np.testing.assert_allclose(a, z, rtol=1e-4, atol=1e-7)
    np.testing.assert_array_equal(np.asarray(a), np.asarray(o))


@fast_compile()
def test_zero_advantage_gives_zero_policy_gradient():
  b = _batch(_rl_dict())
  _, grads = _v2_value_and_grad(_cfg(), b.replace(advantages=jnp.zeros_like(b.advantages)))
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) == 0.0


# No dead switches: each RL loss field, flipped from the default, must change the loss or the gradient.
FLIPS = {
    "policy_loss": "gspo", "eps_low": 0.01, "eps_high": 0.01, "dual_clip": 1.5,
    "aggregation": "seq-mean-token-sum-norm", "kl_estimator": "k1", "kl_beta": 0.5, "entropy_coef": 0.1,
    "temperature": 0.5, "max_new_tokens": 64, "top_k": 3, "top_p": 0.5,
}


@functools.lru_cache(maxsize=None)
def _flat_loss_and_grads(overrides: tuple, negative_advantages: bool) -> np.ndarray:
  """Loss and gradient of `_cfg(**overrides)` as one vector (memoised: the FLIPS share three baselines)."""
  d = _rl_dict()
  if negative_advantages:      # dual clip acts on negative advantages with ratios above the constant
    d = dict(d, advantages=-jnp.abs(d["advantages"]), old_logp=d["old_logp"] - 2.0)
  with fast_compile():
    loss, grads = _v2_value_and_grad(_cfg(**dict(overrides)), _batch(d))
  return np.concatenate([[float(loss)], np.concatenate([np.ravel(g) for g in jax.tree.leaves(grads)])])


@pytest.mark.parametrize("field", sorted(FLIPS))
def test_every_rl_loss_switch_has_an_effect(field):
  base = dict(max_new_tokens=R)
  if field == "max_new_tokens":
    base["aggregation"] = "seq-mean-token-sum-norm"
  if field == "kl_estimator":
    base["kl_beta"] = 0.5
  flipped = dict(base, **{field: FLIPS[field]})
  neg = field == "dual_clip"
  assert not np.allclose(_flat_loss_and_grads(tuple(sorted(base.items())), neg),
                         _flat_loss_and_grads(tuple(sorted(flipped.items())), neg), rtol=1e-6, atol=1e-9), field


@fast_compile()
def test_rl_step_raises_logp_of_positive_advantage_rows_and_lowers_negative():
  """The sign of the whole pipeline: one SGD step moves log-probs in the direction of the advantages."""
  c = _cfg()
  b = _batch(_rl_dict())
  b = b.replace(advantages=jnp.broadcast_to(jnp.array([1.0, -1.0] * 4)[:, None], b.advantages.shape))
  score = make_scorer(MODEL, _sampling(c))
  before = score(_params(), b)
  b = b.replace(old_logp=before)
  tx = optax.sgd(0.5)
  state, _ = make_rl_step(MODEL, tx, c, _sampling(c))(init_train_state(_params(), tx), b, default_step_inputs(c))
  change = np.asarray((score(state.params, b) - before).sum(-1))
  assert (change[0::2] > 0).all() and (change[1::2] < 0).all(), change
