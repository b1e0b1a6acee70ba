"""rlkit/diffusion/flow_grpo.py: the sampler's per-step log-densities are the adapter's on the recorded chain (so
the ratio is 1 before the first update), each equals its Gaussian step's, and noise level 0 is the Euler
sampler."""
import jax
import jax.numpy as jnp
import numpy as np

from rlkit.diffusion.flow_grpo import SdeConfig, flow_grpo_policy, sde_logp, sde_sample
from rlkit.diffusion.sde import step_moments
from rlkit.models.flow import FlowConfig, FlowExpert, init_flow, sample

FLOW = FlowConfig(action_dim=2, horizon=1, hidden=32, blocks=2, time_dim=16)
# Jitted (the configs are static): eagerly, every op of the chain compiles on its own.
_sample = jax.jit(sde_sample, static_argnums=(1, 2))
_logp = jax.jit(sde_logp, static_argnums=(1, 2))


def test_the_ratio_is_one_before_the_first_update_and_each_step_is_its_gaussian():
  params = init_flow(FLOW, 3, jax.random.key(0))
  params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(1), p.shape), params)  # non-zero gates
  sde = SdeConfig(steps=6, noise_level=0.7)
  cond = jax.nn.one_hot(jnp.arange(8) % 3, 3)
  x, chain, logp = _sample(params, FLOW, sde, cond, jax.random.key(2))
  assert x.shape == (8, 1, 2) and chain.shape == (8, 7, 1, 2) and logp.shape == (8, 6)
  again = _logp(params, FLOW, sde, cond, chain)
  np.testing.assert_allclose(np.asarray(again), np.asarray(logp), atol=1e-5)
  np.testing.assert_allclose(np.exp(np.asarray(again - logp)), 1.0, atol=1e-5)
  adapter = flow_grpo_policy(FLOW, sde)

  class Rows:
    extras = {"cond": cond, "chain": chain}
  np.testing.assert_allclose(np.asarray(jax.jit(lambda p: adapter.forward(p, Rows, None)[0])(params)),
                             np.asarray(logp), atol=1e-5)
  k = 3                                                   # one step by hand
  u = FlowExpert(FLOW).apply({"params": params}, chain[:, k], jnp.full((8,), k / 6), cond)
  mean, std = step_moments(chain[:, k], u, k / 6, 1 / 6, 0.7)
  z = (chain[:, k + 1] - mean) / std
  hand = jnp.sum(-0.5 * z ** 2 - jnp.log(std) - 0.5 * np.log(2 * np.pi), axis=(-2, -1))
  np.testing.assert_allclose(np.asarray(logp[:, k]), np.asarray(hand), rtol=1e-5)


def test_noise_level_zero_is_the_euler_sampler():
  params = init_flow(FLOW, 3, jax.random.key(0))
  params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(1), p.shape), params)
  cond = jax.nn.one_hot(jnp.arange(4), 3)
  key = jax.random.key(5)
  x, chain, _ = _sample(params, FLOW, SdeConfig(steps=5, noise_level=0.0), cond, key)
  euler = jax.jit(lambda p, a: sample(p, FLOW, cond, None, 5, start=a))(params, chain[:, 0])
  np.testing.assert_allclose(np.asarray(x), np.asarray(euler), atol=1e-5)
