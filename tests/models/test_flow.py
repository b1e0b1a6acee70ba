"""rlkit/models/flow.py: the time convention, adaLN-Zero's identity blocks at init, the timestep-module regex,
and flow matching that learns an observation-dependent action distribution which Euler sampling reproduces."""
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax

from rlkit.models.flow import (TIMESTEP_MODULES, FlowConfig, FlowExpert, cfm_loss, from_t_convention, init_flow,
                               interpolate, sample)
from rlkit.parallel.rules import path_str

CFG = FlowConfig(action_dim=2, horizon=3, hidden=64, blocks=2, time_dim=32)


def test_the_time_convention():
  a, eps = jnp.ones((2, 3, 2)), jnp.zeros((2, 3, 2))
  np.testing.assert_array_equal(interpolate(a, eps, jnp.asarray([0.0, 1.0])), jnp.stack([eps[0], a[1]]))
  s, u = from_t_convention(jnp.asarray(0.25), jnp.asarray(2.0))          # t = 1 - s, v = -u
  assert float(s) == 0.75 and float(u) == -2.0


def test_blocks_start_as_the_identity_and_the_timestep_modules_are_named():
  params = init_flow(CFG, 4, jax.random.key(0))
  paths = [path_str(p) for p, _ in jax.tree_util.tree_flatten_with_path(params)[0]]
  timestep = sorted({p.split("/")[0] for p in paths if re.search(TIMESTEP_MODULES, p)})
  assert timestep == ["modulation_0", "modulation_1", "modulation_out", "time_mlp_in", "time_mlp_out"]
  assert all(float(jnp.abs(params[m]["kernel"]).max()) == 0 for m in timestep if m.startswith("modulation"))
  # Zero gates: the blocks add nothing, so changing a block's MLP changes no output.
  x, s, obs = jnp.ones((2, 3, 2)), jnp.asarray([0.1, 0.9]), jnp.ones((2, 4))
  apply = jax.jit(FlowExpert(CFG).apply)
  moved = jax.tree.map(lambda v: v, params)
  moved["mlp_0_in"] = jax.tree.map(lambda v: v + 1.0, params["mlp_0_in"])
  np.testing.assert_array_equal(apply({"params": params}, x, s, obs), apply({"params": moved}, x, s, obs))


def test_flow_matching_learns_an_observation_dependent_action():
  """Targets a = (obs[0], -obs[1]) per chunk step plus N(0, 0.05^2): after training the CFM loss, 10 Euler steps
  from noise land near each observation's mean."""
  obs_dim = 2
  params = init_flow(CFG, obs_dim, jax.random.key(0))
  opt = optax.adam(3e-3)
  state = opt.init(params)

  def batch(key):
    k1, k2, k3, k4 = jax.random.split(key, 4)
    obs = jax.random.uniform(k1, (128, obs_dim), minval=-1, maxval=1)
    mean = jnp.stack([obs[:, 0], -obs[:, 1]], -1)[:, None, :].repeat(CFG.horizon, 1)
    a = mean + 0.05 * jax.random.normal(k2, mean.shape)
    return obs, a, jax.random.uniform(k3, (128,)), jax.random.normal(k4, a.shape)

  @jax.jit
  def step(params, state, key):
    loss, g = jax.value_and_grad(lambda p: jnp.mean(cfm_loss(p, CFG, *batch(key))))(params)
    updates, state = opt.update(g, state, params)
    return optax.apply_updates(params, updates), state, loss

  losses = []
  for i in range(600):
    params, state, loss = step(params, state, jax.random.key(i))
    losses.append(float(loss))
  assert np.mean(losses[-50:]) < 0.5 * np.mean(losses[:50])
  obs = jnp.asarray([[0.5, 0.5], [-0.8, 0.2], [0.1, -0.6]])
  acts = jax.jit(lambda k: sample(params, CFG, obs, k, 10))(jax.random.key(99))
  want = np.stack([obs[:, 0], -obs[:, 1]], -1)[:, None, :]
  assert np.abs(np.asarray(acts) - want).max() < 0.15, np.asarray(acts)
