"""rlkit/diffusion/art.py: group advantages (zero groups counted); per-prompt directions are the negated gradients
of each prompt's advantage-weighted loss; the aggregate caps each prompt at kappa and PCGrad removes conflicts;
drift is 0 at the reference; restoration with alpha = 1 is the identity, otherwise it interpolates and rescales
Adam's moments; the alpha rule."""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlkit.diffusion import art
from rlkit.models.flow import FlowConfig, cfm_loss, init_flow

FLOW = FlowConfig(action_dim=2, horizon=1, hidden=16, blocks=1, time_dim=8)


def test_group_advantages_and_zero_groups():
  adv, zero = art.group_advantage(jnp.array([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0]]))
  np.testing.assert_allclose(np.asarray(adv[0]), [-1.2247449, 0.0, 1.2247449], rtol=1e-5)
  assert float(jnp.abs(adv[1]).max()) == 0.0 and int(zero) == 1


def test_prompt_directions_aggregate_and_pcgrad():
  params = init_flow(FLOW, 3, jax.random.key(0))
  k = jax.random.split(jax.random.key(1), 4)
  cond = jax.nn.one_hot(jnp.arange(3), 3)
  x0, s, eps = jax.random.normal(k[0], (3, 4, 1, 2)), jax.random.uniform(k[1], (3, 4)), \
      jax.random.normal(k[2], (3, 4, 1, 2))
  adv = jax.random.normal(k[3], (3, 4))
  # Jitted: eagerly, every op of the per-prompt gradients compiles on its own.
  dirs = jax.jit(art.prompt_directions, static_argnums=1)(params, FLOW, cond, x0, adv, s, eps)
  one = jax.jit(jax.grad(lambda p: jnp.sum(adv[1] * cfm_loss(p, FLOW, jnp.repeat(cond[1:2], 4, 0), x0[1], s[1],
                                                             eps[1]))))(params)
  for a, b in zip(jax.tree.leaves(dirs), jax.tree.leaves(one)):
    np.testing.assert_allclose(np.asarray(a[1]), -np.asarray(b), rtol=1e-4, atol=1e-6)
  flat = art._flat(dirs)
  kappa = float(jnp.linalg.norm(flat, axis=1).min()) / 2              # every prompt is capped
  mean, stats = art.aggregate(dirs, kappa)
  capped = flat / (jnp.linalg.norm(flat, axis=1, keepdims=True) / kappa)
  np.testing.assert_allclose(np.asarray(art._flat(jax.tree.map(lambda x: x[None], mean))[0]),
                             np.asarray(capped.mean(0)), rtol=1e-5, atol=1e-8)
  assert float(stats["clipped"]) == 1.0
  two = {"w": jnp.array([[1.0, 0.0], [-1.0, 1.0]])}                   # a conflicting pair
  plain, s_plain = art.aggregate(two, 10.0)
  proj, _ = art.aggregate(two, 10.0, pcgrad=True)
  assert float(s_plain["conflicts"]) == 1.0
  # d1 - (<d1,d2>/|d2|^2) d2 = [0.5, 0.5]; d2 - (<d2,d1>/|d1|^2) d1 = [0, 1]; mean [0.25, 0.75]
  np.testing.assert_allclose(np.asarray(proj["w"]), [0.25, 0.75], rtol=1e-6)
  np.testing.assert_allclose(np.asarray(plain["w"]), [0.0, 0.5], rtol=1e-6)


def test_drift_and_restoration():
  ref = init_flow(FLOW, 3, jax.random.key(0))
  params = jax.tree.map(lambda p: p + 0.1, ref)
  probe = {"a_s": jax.random.normal(jax.random.key(2), (16, 1, 2)), "s": jnp.linspace(0, 0.9, 16),
           "cond": jax.nn.one_hot(jnp.arange(16) % 3, 3)}
  drift = jax.jit(art.drift, static_argnums=2)
  assert float(drift(ref, ref, FLOW, probe)) == 0.0 and float(drift(params, ref, FLOW, probe)) > 0
  tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-3))
  state = tx.init(params)
  _, state = tx.update(jax.tree.map(jnp.ones_like, params), state, params)
  same, same_state = art.restore(params, ref, state, 1.0)
  assert same is params and same_state is state
  half, half_state = art.restore(params, ref, state, 0.5)
  for h, r in zip(jax.tree.leaves(half), jax.tree.leaves(ref)):
    np.testing.assert_allclose(np.asarray(h), np.asarray(r) + 0.05, rtol=1e-5, atol=1e-6)
  adam, adam_half = state[1][0], half_state[1][0]
  for m, mh in zip(jax.tree.leaves(adam.mu), jax.tree.leaves(adam_half.mu)):
    np.testing.assert_allclose(np.asarray(mh), 0.5 * np.asarray(m), rtol=1e-6)
  for v, vh in zip(jax.tree.leaves(adam.nu), jax.tree.leaves(adam_half.nu)):
    np.testing.assert_allclose(np.asarray(vh), 0.25 * np.asarray(v), rtol=1e-6)
  assert art.restoration_alpha(0.01, 1.0, tau_hi=0.05, tau_target=0.02, h_min=0.1, alpha_min=0.2) == 1.0
  assert art.restoration_alpha(0.08, 1.0, tau_hi=0.05, tau_target=0.02, h_min=0.1, alpha_min=0.2) == \
      pytest.approx(0.5)
  assert art.restoration_alpha(2.0, 1.0, tau_hi=0.05, tau_target=0.02, h_min=0.1, alpha_min=0.2) == 0.2
  assert art.restoration_alpha(0.01, 0.0, tau_hi=0.05, tau_target=0.02, h_min=0.1, alpha_min=0.2) == 1.0
