"""rlkit/embodied/flow_rl.py: the ReinFlow chain's likelihood is a density (it integrates to 1, and the sampled
final actions follow its marginal, in 1-D), its sampled and recomputed log-probs agree; both adapters train through
the shared update step (FPO's ratio is exactly 1 at theta_old); GAE equals its definition."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlkit.core.types import TrainBatch
from rlkit.embodied.flow_rl import (ChainConfig, fpo_draws, fpo_logp, fpo_policy, gae, init_reinflow,
                                    reinflow_logp, reinflow_policy, reinflow_sample)
from rlkit.models.flow import FlowConfig, init_flow
from rlkit.train.rl_config import rl_defaults
from rlkit.train.steps import default_step_inputs, init_train_state, make_policy_loss, make_policy_step
from tests.fast_compile import fast_compile

FLOW1 = FlowConfig(action_dim=1, horizon=1, hidden=32, blocks=1, time_dim=16)
CHAIN1 = ChainConfig(steps=1, sigma_min=0.2, sigma_max=0.5, hidden=16)


def _params_1d():
  """A 1-D expert with nonzero modulation (so the drift depends on the time) and its noise head."""
  flow = init_flow(FLOW1, 1, jax.random.key(0))
  flow = {**flow, **{m: {"kernel": 0.3 * jax.random.normal(jax.random.key(9), flow[m]["kernel"].shape),
                         "bias": flow[m]["bias"]} for m in flow if m.startswith("modulation")}}
  return init_reinflow(flow, FLOW1, CHAIN1, 1, jax.random.key(1))


@fast_compile()
def test_the_chain_density_integrates_to_one_and_matches_its_samples_in_1d():
  params, obs = _params_1d(), jnp.asarray([[0.4]])
  grid = jnp.arange(-6.0, 6.0, 0.02)
  a0, a1 = (x.reshape(-1, 1, 1) for x in jnp.meshgrid(grid, grid, indexing="ij"))
  links = jnp.stack([a0, a1], axis=1)                                        # [G^2, 2, 1, 1]
  logp_of = jax.jit(lambda o, c: reinflow_logp(params, FLOW1, CHAIN1, o, c))   # eagerly each op compiles alone
  step = logp_of(jnp.broadcast_to(obs, (links.shape[0], 1)), links)[:, 0]
  joint = jnp.exp(step - 0.5 * a0[:, 0, 0] ** 2 - 0.5 * np.log(2 * np.pi)).reshape(grid.size, grid.size)
  assert abs(float(joint.sum()) * 0.02 ** 2 - 1.0) < 1e-3
  marginal = np.asarray(joint.sum(axis=0) * 0.02)                           # p(a1) on the grid
  acts, chain, logp, initial = jax.jit(lambda k: reinflow_sample(params, FLOW1, CHAIN1,
                                                                 jnp.broadcast_to(obs, (200_000, 1)), k))(
      jax.random.key(2))
  hist, edges = np.histogram(np.asarray(acts[:, 0, 0]), bins=40, range=(-3, 3), density=True)
  centres = (edges[:-1] + edges[1:]) / 2
  assert np.abs(hist - np.interp(centres, np.asarray(grid), marginal)).max() < 0.03
  again = logp_of(jnp.broadcast_to(obs, (200_000, 1)), chain)
  np.testing.assert_allclose(np.asarray(again), np.asarray(logp), atol=1e-4)


def _batch(obs, advantages, **extras) -> TrainBatch:
  n = obs.shape[0]
  return TrainBatch(tokens=jnp.zeros((n, 1), jnp.int32), attention_mask=jnp.ones((n, 1), bool),
                    loss_mask=jnp.ones((n, 1), bool), old_logp=jnp.zeros((n, 1)), rollout_logp=jnp.zeros((n, 1)),
                    advantages=jnp.asarray(advantages, jnp.float32)[:, None], token_weights=jnp.ones((n, 1)),
                    group_ids=jnp.zeros(n, jnp.int32), row_source=jnp.zeros(n, jnp.int32),
                    extras={"obs": obs, **extras})


FLOW = FlowConfig(action_dim=2, horizon=2, hidden=32, blocks=1, time_dim=16)


@fast_compile()
def test_fpo_ratio_is_one_at_theta_old_and_an_update_favours_positive_rows():
  cfg = rl_defaults()
  cfg.max_new_tokens = 1
  policy = fpo_policy(FLOW)
  params = init_flow(FLOW, 3, jax.random.key(0))
  obs = jax.random.normal(jax.random.key(1), (8, 3))
  actions = jax.random.normal(jax.random.key(2), (8, 2, 2))
  s, eps = fpo_draws(jax.random.key(3), 8, 4, FLOW)
  adv = jnp.asarray([1.0, -1.0] * 4)
  b = _batch(obs, adv, actions=actions, fpo_s=s, fpo_eps=eps)
  old = policy.forward(params, b, None)[0]
  b = b.replace(old_logp=old, rollout_logp=old)
  inputs = default_step_inputs(cfg) | {"num_tokens": 8.0, "num_seqs": 8.0}
  loss, _ = make_policy_loss(policy, cfg)(params, b, inputs)
  np.testing.assert_allclose(float(loss), -float(adv.mean()), atol=1e-6)     # ratio exactly 1: -mean(A)
  tx = optax.sgd(1e-2)
  state, _ = jax.jit(make_policy_step(policy, tx, cfg))(init_train_state(params, tx), b, inputs)
  gain = np.asarray(fpo_logp(state.params, FLOW, obs, actions, s, eps) - old[:, 0])
  assert gain[0::2].mean() > 0 > gain[1::2].mean()                       # CFM loss down on A > 0, up on A < 0


@fast_compile()
def test_a_reinflow_update_raises_the_chain_likelihood_of_positive_rows():
  cfg = rl_defaults()
  chain_cfg = ChainConfig(steps=3)
  cfg.max_new_tokens = chain_cfg.steps
  params = init_reinflow(init_flow(FLOW, 3, jax.random.key(0)), FLOW, chain_cfg, 3, jax.random.key(1))
  obs = jax.random.normal(jax.random.key(2), (8, 3))
  _, chain, logp, _ = reinflow_sample(params, FLOW, chain_cfg, obs, jax.random.key(3))
  n, k = 8, chain_cfg.steps
  adv = jnp.asarray([1.0, -1.0] * 4)
  b = TrainBatch(tokens=jnp.zeros((n, k), jnp.int32), attention_mask=jnp.ones((n, k), bool),
                 loss_mask=jnp.ones((n, k), bool), old_logp=logp, rollout_logp=logp,
                 advantages=jnp.repeat(adv[:, None], k, 1), token_weights=jnp.ones((n, k)),
                 group_ids=jnp.zeros(n, jnp.int32), row_source=jnp.zeros(n, jnp.int32),
                 extras={"obs": obs, "chain": chain})
  policy = reinflow_policy(FLOW, chain_cfg)
  tx = optax.sgd(1e-3)
  inputs = default_step_inputs(cfg) | {"num_tokens": float(n * k), "num_seqs": float(n)}
  state, metrics = jax.jit(make_policy_step(policy, tx, cfg))(init_train_state(params, tx), b, inputs)
  gain = np.asarray((reinflow_logp(state.params, FLOW, chain_cfg, obs, chain) - logp).sum(axis=1))
  assert gain[0::2].mean() > 0 > gain[1::2].mean()
  assert np.isfinite(float(metrics["loss"].value))


def test_gae_equals_its_definition():
  rng = np.random.default_rng(0)
  t, b, gamma, lam = 7, 3, 0.9, 0.8
  r, v = rng.normal(size=(t, b)), rng.normal(size=(t, b))
  d = rng.random((t, b)) < 0.25
  last = rng.normal(size=b)
  adv, ret = gae(jnp.asarray(r), jnp.asarray(v), jnp.asarray(d), jnp.asarray(last), gamma, lam)
  want = np.zeros((t, b))
  nxt_adv, nxt_v = np.zeros(b), last
  for i in reversed(range(t)):
    keep = 1.0 - d[i]
    delta = r[i] + gamma * nxt_v * keep - v[i]
    nxt_adv = delta + gamma * lam * keep * nxt_adv
    want[i], nxt_v = nxt_adv, v[i]
  np.testing.assert_allclose(np.asarray(adv), want, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(np.asarray(ret), want + v, rtol=1e-5, atol=1e-6)
