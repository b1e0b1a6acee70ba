"""Update steps: micro-batching equals the full batch, and every RL loss switch changes the update."""
import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.train.steps import (RLLossConfig, init_train_state, make_rl_step, make_score_fn, make_sft_step,
                               rl_loss)

CFG = TransformerConfig(vocab_size=32, hidden_size=32, intermediate_size=48, num_layers=1, num_heads=2,
                        num_kv_heads=1, head_dim=16, rope_theta=10_000.0)
MODEL = Transformer(CFG)


def _rl_batch(n=8, p=4, r=5, seed=0):
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


def _sgd_delta(step_fn_factory, batch, micro):
  params = init_params(CFG, jax.random.key(0))
  tx = optax.sgd(1.0)
  state = init_train_state(params, tx)
  new, metrics = step_fn_factory(tx, micro)(state, batch)
  return jax.tree.map(lambda a, b: a - b, new.params, init_params(CFG, jax.random.key(0))), metrics


@pytest.mark.parametrize("aggregation", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_rl_micro_batching_matches_full_batch(aggregation):
  cfg = RLLossConfig(aggregation=aggregation, kl_beta=0.1, max_len=5)
  batch = _rl_batch()
  full, m1 = _sgd_delta(lambda tx, mb: make_rl_step(MODEL, tx, cfg, mb), batch, 1)
  split, m8 = _sgd_delta(lambda tx, mb: make_rl_step(MODEL, tx, cfg, mb), batch, 8)
  np.testing.assert_allclose(m1["loss"], m8["loss"], rtol=1e-5, atol=1e-7)
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(split)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_sft_micro_batching_matches_full_batch():
  rng = np.random.default_rng(1)
  tokens = rng.integers(3, CFG.vocab_size, (8, 7)).astype(np.int32)
  attention = np.arange(7)[None, :] < rng.integers(3, 8, 8)[:, None]
  loss_mask = attention & (np.arange(7)[None, :] >= 2)
  batch = {"tokens": jnp.asarray(tokens), "attention_mask": jnp.asarray(attention),
           "loss_mask": jnp.asarray(loss_mask)}
  full, m1 = _sgd_delta(lambda tx, mb: make_sft_step(MODEL, tx, mb), batch, 1)
  split, m4 = _sgd_delta(lambda tx, mb: make_sft_step(MODEL, tx, mb), batch, 4)
  np.testing.assert_allclose(m1["loss"], m4["loss"], rtol=1e-5)
  for a, b in zip(jax.tree.leaves(full), jax.tree.leaves(split)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7)


def test_zero_advantage_gives_zero_policy_gradient():
  batch = dict(_rl_batch(), advantages=jnp.zeros(8))
  params = init_params(CFG, jax.random.key(0))
  norms = {"num_tokens_global": batch["response_mask"].sum(), "num_seqs_global": jnp.asarray(8)}
  grads = jax.grad(lambda p: rl_loss(MODEL, RLLossConfig(), p, batch, norms)[0])(params)
  assert max(float(jnp.abs(g).max()) for g in jax.tree.leaves(grads)) == 0.0


# No dead switches: each RL loss field, flipped from the default, must change the loss or the gradient.
FLIPS = {
    "policy_loss": "gspo", "eps_low": 0.01, "eps_high": 0.01, "dual_clip": 1.5,
    "aggregation": "seq-mean-token-sum-norm", "kl_estimator": "k1", "kl_beta": 0.5, "entropy_coef": 0.1,
    "temperature": 0.5, "max_len": 64,
}


@pytest.mark.parametrize("field", sorted(FLIPS))
def test_every_rl_loss_switch_has_an_effect(field):
  base = RLLossConfig(max_len=5)
  if field == "max_len":
    base = dataclasses.replace(base, aggregation="seq-mean-token-sum-norm")
  if field in ("kl_estimator",):
    base = dataclasses.replace(base, kl_beta=0.5)
  if field == "dual_clip":
    # Dual clip acts on negative advantages with ratios above the constant: make both common.
    b = _rl_batch()
    batch = dict(b, advantages=-jnp.abs(b["advantages"]), old_logp=b["old_logp"] - 2.0)
  else:
    batch = _rl_batch()
  flipped = dataclasses.replace(base, **{field: FLIPS[field]})
  params = init_params(CFG, jax.random.key(0))
  norms = {"num_tokens_global": batch["response_mask"].sum(), "num_seqs_global": jnp.asarray(8)}

  def value_and_grad(cfg):
    loss, grads = jax.value_and_grad(lambda p: rl_loss(MODEL, cfg, p, batch, norms)[0])(params)
    return np.concatenate([[float(loss)], np.concatenate([np.ravel(g) for g in jax.tree.leaves(grads)])])

  assert not np.allclose(value_and_grad(base), value_and_grad(flipped), rtol=1e-6, atol=1e-9), field


def test_rl_step_raises_logp_of_positive_advantage_rows_and_lowers_negative():
  """The sign of the whole pipeline: one SGD step moves log-probs in the direction of the advantages."""
  batch = dict(_rl_batch(), advantages=jnp.array([1.0, -1.0] * 4))
  params = init_params(CFG, jax.random.key(0))
  score = make_score_fn(MODEL, 1.0)
  before = score(params, batch)
  batch["old_logp"] = before
  tx = optax.sgd(0.5)
  state, _ = make_rl_step(MODEL, tx, RLLossConfig())(init_train_state(params, tx), batch)
  change = np.asarray((score(state.params, batch) - before).sum(-1))
  assert (change[0::2] > 0).all() and (change[1::2] < 0).all(), change
