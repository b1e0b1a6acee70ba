"""rlkit/diffusion/nft.py: at theta = theta_old a zero-advantage sample (r = 1/2) gives no gradient; r = 1 pulls the
data prediction toward the sample and r = 0 pushes it away; the optimality map is its definition."""
import jax
import jax.numpy as jnp
import numpy as np

from rlkit.diffusion.nft import nft_loss, optimality
from rlkit.models.flow import FlowConfig, FlowExpert, init_flow, interpolate

FLOW = FlowConfig(action_dim=2, horizon=1, hidden=16, blocks=1, time_dim=8)


def _setup():
  params = init_flow(FLOW, 2, jax.random.key(0))
  params = jax.tree.map(lambda p: p + 0.05 * jax.random.normal(jax.random.key(1), p.shape), params)
  k = jax.random.split(jax.random.key(2), 3)
  cond = jax.nn.one_hot(jnp.arange(8) % 2, 2)
  return params, cond, jax.random.normal(k[0], (8, 1, 2)), jax.random.uniform(k[1], (8,)), \
      jax.random.normal(k[2], (8, 1, 2))


def test_the_optimality_map():
  np.testing.assert_allclose(np.asarray(optimality(jnp.array([-9.0, -5.0, 0.0, 2.5, 5.0]), 5.0)),
                             [0.0, 0.0, 0.5, 0.75, 1.0])


def test_zero_advantage_gives_no_gradient_and_the_sign_of_r_sets_the_direction():
  params, cond, x0, s, eps = _setup()
  # Jitted: eagerly, every op of the loss and its gradient compiles on its own.
  grad_at = jax.jit(jax.grad(lambda p, r: nft_loss(p, params, FLOW, cond, x0, r, s, eps, 1.0)[0]))
  grad = lambda r: grad_at(params, r)   # noqa: E731
  for g in jax.tree.leaves(grad(jnp.full((8,), 0.5))):
    assert float(jnp.abs(g).max()) < 1e-6

  @jax.jit
  def x0_error_of(p):
    a_s = interpolate(x0, eps, s)
    u = FlowExpert(FLOW).apply({"params": p}, a_s, s, cond)
    return jnp.mean((a_s + (1 - s)[:, None, None] * u - x0) ** 2)
  x0_error = lambda p: float(x0_error_of(p))   # noqa: E731
  before = x0_error(params)
  for r, closer in ((1.0, True), (0.0, False)):
    g = grad(jnp.full((8,), r))
    stepped = jax.tree.map(lambda p, d: p - 1e-2 * d, params, g)
    assert (x0_error(stepped) < before) == closer, (r, before, x0_error(stepped))
