"""Policy adapters: a policy that is not a token decoder (a Gaussian action head on a continuous bandit)
trains through the shared RL update step: its gradient is the hand-derived policy gradient at micro-batches
1 and 2, the non-finite guard skips its NaN batches, training moves it to the best action, a stochastic
forward gets per-row keys that do not depend on micro-batching or recompile the step, and the loss terms that
read logits are refused for it by name. The LLM adapter ignores a key."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlkit.core.errors import ConfigError
from rlkit.core.types import TrainBatch
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.optim.optimizers import make_optimizer, optimizer_defaults
from rlkit.rollout.sampler import SamplingConfig
from rlkit.train.policy import POLICIES, PolicyAdapter
from rlkit.train.rl_config import rl_defaults
from rlkit.train.steps import (default_step_inputs, init_train_state, make_policy_loss, make_policy_step,
                               make_rl_step)
from tests.fast_compile import fast_compile

A = 2                                   # action dimensions
BEST = np.array([1.0, -0.5], np.float32)   # the bandit's best action
LOG_2PI = float(np.log(2 * np.pi))


def gaussian_policy(noise: float = 0.0) -> PolicyAdapter:
  """pi(a) = N(a; mu, diag(exp(log_std))^2), one step per row (R = 1). With `noise` > 0 the forward adds
  noise * eps_row to mu, eps_row ~ N(0, I) from the row's key: a stand-in for a stochastic forward (a
  diffusion policy's sampled timestep)."""
  def forward(params, mb, keys):
    mu = params["mu"]
    if noise:
      mu = mu + noise * jax.vmap(lambda k: jax.random.normal(k, (A,)))(keys)[:, None, :]
    z = (mb.extras["actions"] - mu) * jnp.exp(-params["log_std"])
    logp = jnp.sum(-0.5 * z ** 2 - params["log_std"] - 0.5 * LOG_2PI, axis=-1)          # [N, 1]
    entropy = jnp.sum(params["log_std"] + 0.5 * (LOG_2PI + 1.0))
    return logp, {"entropy": jnp.broadcast_to(entropy, logp.shape)}
  return PolicyAdapter("gaussian", forward, needs_key=noise > 0)


def _cfg(**kw):
  c = rl_defaults()                     # ppo_clip, token-mean aggregation
  c.max_new_tokens = 1
  c.update(kw)
  return c


def _params(mu=(0.3, -0.2), log_std=(-0.1, 0.2)):
  return {"mu": jnp.asarray(mu, jnp.float32), "log_std": jnp.asarray(log_std, jnp.float32)}


def _batch(policy, params, actions, advantages) -> TrainBatch:
  """On-policy rows (old_logp = the policy's own log-densities, ratio 1) of `actions` [N, A]."""
  n = actions.shape[0]
  b = TrainBatch(tokens=jnp.zeros((n, 1), jnp.int32), attention_mask=jnp.ones((n, 1), bool),
                 loss_mask=jnp.ones((n, 1), bool), old_logp=jnp.zeros((n, 1)), rollout_logp=jnp.zeros((n, 1)),
                 advantages=jnp.asarray(advantages, jnp.float32)[:, None], token_weights=jnp.ones((n, 1)),
                 group_ids=jnp.zeros(n, jnp.int32), row_source=jnp.zeros(n, jnp.int32),
                 extras={"actions": jnp.asarray(actions, jnp.float32)[:, None, :]})
  old = gaussian_policy().forward(params, b, None)[0]
  return b.replace(old_logp=old, rollout_logp=old)


def _data(n=8, seed=0):
  rng = np.random.default_rng(seed)
  return rng.normal(size=(n, A)).astype(np.float32), rng.normal(size=n).astype(np.float32)


def _hand_gradient(params, actions, adv):
  """d/dtheta of -mean_i A_i * ratio_i at ratio 1 (no clip active): -mean_i A_i * dlogp_i/dtheta, with
  dlogp/dmu = (a - mu) / sigma^2 and dlogp/dlog_std = (a - mu)^2 / sigma^2 - 1 (per dimension)."""
  mu, sigma = np.asarray(params["mu"]), np.exp(np.asarray(params["log_std"]))
  d = actions - mu
  return {"mu": -np.mean(adv[:, None] * d / sigma ** 2, axis=0),
          "log_std": -np.mean(adv[:, None] * (d ** 2 / sigma ** 2 - 1.0), axis=0)}


@pytest.mark.parametrize("micro_batches", [1, 2])
@fast_compile()
def test_gaussian_policy_gradient_through_the_shared_step_is_the_hand_derived_one(micro_batches):
  c, policy, params = _cfg(), gaussian_policy(), _params()
  actions, adv = _data()
  tx = optax.sgd(1.0)                   # new params = params - gradient
  step = make_policy_step(policy, tx, c, micro_batches)
  state, m = step(init_train_state(params, tx), _batch(policy, params, actions, adv), default_step_inputs(c))
  want = _hand_gradient(_params(), actions, adv)
  for name in ("mu", "log_std"):
    np.testing.assert_allclose(np.asarray(_params()[name] - state.params[name]), want[name], rtol=1e-5, atol=1e-6)
  norm = np.sqrt(sum(np.sum(g ** 2) for g in want.values()))
  np.testing.assert_allclose(float(m["grad_norm"].value), norm, rtol=1e-5)
  assert int(m["skipped_updates"].value) == 0 and int(state.step) == 1
  # On policy: ratio 1, nothing clipped; the logged entropy is the policy's own (from aux), not dropped.
  np.testing.assert_allclose(float(m["ratio_mean"].value), 1.0, rtol=1e-6)
  assert float(m["clip_frac"].value) == 0.0
  np.testing.assert_allclose(float(m["entropy"].value), float(np.sum(-0.1 + 0.2 + LOG_2PI + 1.0)), rtol=1e-6)


@fast_compile()
def test_the_non_finite_guard_skips_a_nan_batch_of_a_non_lm_policy():
  c, policy, params = _cfg(), gaussian_policy(), _params()
  actions, adv = _data()
  tx = optax.adam(0.1)
  step = make_policy_step(policy, tx, c, 2)
  good = _batch(policy, params, actions, adv)
  bad = good.replace(extras={"actions": good.extras["actions"].at[3, 0, 1].set(jnp.nan)})
  state, m = step(init_train_state(params, tx), bad, default_step_inputs(c))
  assert not np.isfinite(float(m["loss"].value)) and int(m["skipped_updates"].value) == 1
  assert int(state.step) == 0
  for a, b in zip(jax.tree.leaves(state), jax.tree.leaves(init_train_state(_params(), tx))):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
  state, m = step(state, good, default_step_inputs(c))
  assert int(m["skipped_updates"].value) == 0 and int(state.step) == 1


@fast_compile()
def test_training_moves_the_gaussian_policy_to_the_best_action():
  c, policy = _cfg(), gaussian_policy()
  tx = optax.adam(0.05)
  step = make_policy_step(policy, tx, c, 2)
  state = init_train_state(_params(mu=(0.0, 0.0), log_std=(0.0, 0.0)), tx)
  inputs = default_step_inputs(c)
  start = float(np.linalg.norm(np.asarray(state.params["mu"]) - BEST))
  for i in range(40):
    mu, sigma = state.params["mu"], jnp.exp(state.params["log_std"])
    actions = mu + sigma * jax.random.normal(jax.random.fold_in(jax.random.key(0), i), (64, A))
    reward = -jnp.sum((actions - BEST) ** 2, axis=-1)
    adv = (reward - reward.mean()) / (reward.std() + 1e-6)
    state, m = step(state, _batch(policy, state.params, actions, adv), inputs)
    assert int(m["skipped_updates"].value) == 0
  end = float(np.linalg.norm(np.asarray(state.params["mu"]) - BEST))
  assert end < 0.2 * start, (start, end, state.params)


@fast_compile()
def test_a_stochastic_forward_gets_per_row_keys_independent_of_micro_batching():
  c, policy, params = _cfg(), gaussian_policy(noise=0.3), _params()
  actions, adv = _data()
  b = _batch(gaussian_policy(), params, actions, adv)
  tx = optax.sgd(1.0)
  inputs = lambda seed: dict(default_step_inputs(c), key=jax.random.key(seed))  # noqa: E731
  with pytest.raises(ValueError, match="pass a PRNG key as step_inputs"):
    make_policy_step(policy, tx, c)(init_train_state(params, tx), b, default_step_inputs(c))
  step1, step2 = make_policy_step(policy, tx, c, 1), make_policy_step(policy, tx, c, 2)
  one, _ = step1(init_train_state(_params(), tx), b, inputs(3))
  two, _ = step2(init_train_state(_params(), tx), b, inputs(3))
  again, _ = step2(init_train_state(_params(), tx), b, inputs(3))
  other, _ = step2(init_train_state(_params(), tx), b, inputs(4))
  for x, y, z, w in zip(*(jax.tree.leaves(s.params) for s in (one, two, again, other))):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)   # same noise per row
    np.testing.assert_array_equal(np.asarray(y), np.asarray(z))                      # deterministic
  assert not np.allclose(np.asarray(two.params["mu"]), np.asarray(other.params["mu"]))   # the key matters
  assert step2._cache_size() == 1                                                    # traced, no recompile
  # The step count is folded in: under one key, consecutive updates draw different noise (sgd(0): the
  # parameters, hence everything but the noise, stay put).
  frozen = optax.sgd(0.0)
  step = make_policy_step(policy, frozen, c)
  state = init_train_state(_params(), frozen)
  state, m0 = step(state, b, inputs(3))
  state, m1 = step(state, b, inputs(3))
  assert int(state.step) == 2 and float(m0["loss"].value) != float(m1["loss"].value)


@pytest.mark.parametrize("field,value,term", [("entropy_coef", 0.01, "entropy"),
                                              ("loss_terms", {"forward_kl": 1.0}, "forward_kl")])
@fast_compile()
def test_terms_that_read_logits_are_refused_for_a_policy_without_them(field, value, term):
  c = _cfg(**{field: value})
  with pytest.raises(ConfigError, match=f"loss term '{term}' reads the policy's logits.*policy 'gaussian'"):
    make_policy_loss(gaussian_policy(), c)
  # Terms on log-probs alone (the policy surrogate, the KL penalty to a reference) build and run.
  c = _cfg(kl_beta=0.1)
  actions, adv = _data()
  b = _batch(gaussian_policy(), _params(), actions, adv)
  b = b.replace(ref_logp=b.old_logp - 0.1)
  tx = optax.sgd(0.1)
  _, m = make_policy_step(gaussian_policy(), tx, c)(init_train_state(_params(), tx), b, default_step_inputs(c))
  assert float(m["kl"].value) > 0 and int(m["skipped_updates"].value) == 0


@fast_compile()
def test_kl_control_needs_a_policy_with_logits():
  o = optimizer_defaults()
  o.kl_target = 0.01
  tx = make_optimizer(o, 10)
  actions, adv = _data()
  b = _batch(gaussian_policy(), _params(), actions, adv)
  with pytest.raises(ValueError, match="predicted-KL control.*kl_target=0"):
    make_policy_step(gaussian_policy(), tx, _cfg())(init_train_state(_params(), tx), b, default_step_inputs(_cfg()))


TINY = TransformerConfig(vocab_size=16, hidden_size=16, intermediate_size=24, num_layers=1, num_heads=2,
                         num_kv_heads=1, head_dim=8, rope_theta=10_000.0)


def _decoder_batch(n: int = 4) -> TrainBatch:
  """n rows of 2 prompt + 3 response tokens of TINY's vocabulary, with log-probs and advantages."""
  rng = np.random.default_rng(0)
  logp = jnp.asarray(-rng.uniform(1, 3, (n, 3)), jnp.float32)
  return TrainBatch(tokens=jnp.asarray(rng.integers(1, 16, (n, 5)), jnp.int32),
                    attention_mask=jnp.ones((n, 5), bool), loss_mask=jnp.ones((n, 3), bool), old_logp=logp,
                    rollout_logp=logp, advantages=jnp.asarray(rng.normal(size=(n, 3)), jnp.float32),
                    token_weights=jnp.ones((n, 3)), group_ids=jnp.zeros(n, jnp.int32),
                    row_source=jnp.zeros(n, jnp.int32))


@fast_compile()
def test_the_llm_adapter_ignores_a_key():
  cfg = TINY
  model = Transformer(cfg)
  c = _cfg(max_new_tokens=3, entropy_coef=0.01)
  sampling = SamplingConfig(max_new_tokens=3)
  assert POLICIES.get("llm")(model, c, sampling).has_logits
  b = _decoder_batch()
  tx = optax.sgd(0.1)
  step = make_rl_step(model, tx, c, sampling, 2)
  params = init_params(cfg, jax.random.key(0))
  fresh = lambda: init_train_state(jax.tree.map(jnp.copy, params), tx)  # noqa: E731  (the step donates it)
  plain, m = step(fresh(), b, default_step_inputs(c))
  keyed, mk = step(fresh(), b, dict(default_step_inputs(c), key=jax.random.key(1)))
  assert float(m["loss"].value) == float(mk["loss"].value) and float(m["entropy"].value) > 0
  for x, y in zip(jax.tree.leaves(plain.params), jax.tree.leaves(keyed.params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def _sharpened(model, cfg, sampling, replay_routing=False):
  """The llm adapter at twice the log-probs (a policy the update must differentiate instead of the decoder's)."""
  llm = POLICIES.get("llm")(model, cfg, sampling, replay_routing)

  def forward(params, mb, keys):
    logp, aux = llm.forward(params, mb, keys)
    return 2.0 * logp, aux

  return llm._replace(name="test_sharpened", forward=forward)


POLICIES.add("test_sharpened", _sharpened)


@fast_compile()
def test_rl_policy_selects_the_adapter_the_step_differentiates():
  from configs import grpo_arith
  from rlkit.train.config_checks import validate
  cfg = TINY
  model, sampling = Transformer(cfg), SamplingConfig(max_new_tokens=3)
  b = _decoder_batch()
  params, tx = init_params(cfg, jax.random.key(0)), optax.sgd(0.1)
  losses = {}
  for name in ("llm", "test_sharpened"):
    c = _cfg(max_new_tokens=3, policy=name)
    _, m = make_rl_step(model, tx, c, sampling)(init_train_state(jax.tree.map(jnp.copy, params), tx), b,
                                                default_step_inputs(c))
    losses[name] = float(m["loss"].value)
  assert losses["llm"] != losses["test_sharpened"]
  c = grpo_arith.get_config("test")
  c.rl.policy = "test_sharpend"
  with pytest.raises(ConfigError, match=r"rl.policy='test_sharpend'.*test_sharpened"):
    validate(c)


@fast_compile()
def test_the_moe_aux_loss_enters_the_update():
  """An MoE decoder's llm adapter: `rl.moe.aux_loss_coef` x the load-balancing loss joins the loss, moves the
  router's gradient, and the load statistics are logged. Micro-batches weigh each slice's value by its share;
  the balance loss, a product of two means over tokens, is then close to (not equal to) the whole batch's."""
  cfg = TINY.replace(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)
  model, sampling = Transformer(cfg), SamplingConfig(max_new_tokens=3)
  n, b = 4, _decoder_batch()
  params = init_params(cfg, jax.random.key(0))
  out = {}
  for coef in (0.0, 0.5):
    c = _cfg(max_new_tokens=3)
    c.moe.aux_loss_coef = coef
    loss_fn = make_policy_loss(POLICIES.get("llm")(model, c, sampling), c)
    inputs = dict(default_step_inputs(c), num_tokens=jnp.asarray(n * 3), num_seqs=jnp.asarray(n))
    (loss, metrics), grads = jax.jit(jax.value_and_grad(loss_fn, has_aux=True))(params, b, inputs)
    out[coef] = (float(loss), metrics, grads["layers_0"]["moe"]["router"])
  half = jax.jit(loss_fn)
  halves = [half(params, jax.tree.map(lambda x: x[i:i + 2], b), inputs)[0] for i in (0, 2)]
  np.testing.assert_allclose(float(sum(halves)), out[0.5][0], rtol=0.02)
  lb = float(out[0.0][1]["moe/aux_loss"].value)
  assert lb > 0 and {"moe/load_cv", "moe/peak_load", "moe/cold_fraction"} <= set(out[0.0][1])
  np.testing.assert_allclose(out[0.5][0] - out[0.0][0], 0.5 * lb, rtol=1e-4)
  assert not np.allclose(out[0.5][2], out[0.0][2])
