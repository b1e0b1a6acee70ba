"""rlkit/diffusion/draft.py: K = 0 gives no gradient (the model is unchanged); K = steps equals full
backpropagation through the sampler; K = 1 reaches only the last step's use of the parameters; a few steps of
DRaFT-K raise a differentiable reward."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlkit.diffusion.draft import draft_loss, draft_sample
from rlkit.models.flow import FlowConfig, init_flow, sample

FLOW = FlowConfig(action_dim=2, horizon=1, hidden=16, blocks=1, time_dim=8)
TARGET = jnp.array([1.0, -0.5])


def reward(x, cond):
  return -jnp.sum((x[:, 0] - TARGET) ** 2, axis=-1)


def _setup():
  params = init_flow(FLOW, 2, jax.random.key(0))
  params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(1), p.shape), params)
  cond = jax.nn.one_hot(jnp.arange(16) % 2, 2)
  eps = jax.random.normal(jax.random.key(2), (16, 1, 2))
  return params, cond, eps


def _jit_grad(loss):
  return jax.jit(jax.grad(loss))      # one compile each: eagerly, every op of the 4-step chain compiles on its own


def test_k_zero_is_no_gradient_and_k_steps_is_full_backpropagation():
  params, cond, eps = _setup()
  np.testing.assert_allclose(np.asarray(jax.jit(lambda p: draft_sample(p, FLOW, cond, eps, 4, 2))(params)),
                             np.asarray(jax.jit(lambda p: sample(p, FLOW, cond, None, 4, start=eps))(params)),
                             atol=1e-6)
  g0 = _jit_grad(lambda p: draft_loss(p, FLOW, cond, eps, 4, 0, reward)[0])(params)
  assert all(float(jnp.abs(x).max()) == 0.0 for x in jax.tree.leaves(g0))
  full = _jit_grad(lambda p: -jnp.mean(reward(sample(p, FLOW, cond, None, 4, start=eps), cond)))(params)
  g4 = _jit_grad(lambda p: draft_loss(p, FLOW, cond, eps, 4, 4, reward)[0])(params)
  for a, b in zip(jax.tree.leaves(g4), jax.tree.leaves(full)):
    np.testing.assert_allclose(np.asarray(a), np.asarray(b), rtol=1e-4, atol=1e-7)
  g1 = _jit_grad(lambda p: draft_loss(p, FLOW, cond, eps, 4, 1, reward)[0])(params)
  assert any(float(jnp.abs(a - b).max()) > 1e-6 for a, b in zip(jax.tree.leaves(g1), jax.tree.leaves(g4)))
  with pytest.raises(ValueError, match="k=5"):
    draft_sample(params, FLOW, cond, eps, 4, 5)


def test_draft_raises_the_reward():
  params, cond, eps = _setup()
  tx = optax.adam(1e-2)
  opt = tx.init(params)
  step = jax.jit(lambda p, o: (lambda g: (optax.apply_updates(p, tx.update(g, o)[0]), tx.update(g, o)[1]))(
      jax.grad(lambda q: draft_loss(q, FLOW, cond, eps, 4, 1, reward)[0])(p)))
  mean_reward = jax.jit(lambda p: draft_loss(p, FLOW, cond, eps, 4, 1, reward)[1]["reward"])
  before = float(mean_reward(params))
  for _ in range(30):
    params, opt = step(params, opt)
  after = float(mean_reward(params))
  assert after > before + 0.5 * abs(before), (before, after)
