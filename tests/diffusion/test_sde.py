"""rlkit/diffusion/sde.py: one step's log-density equals a hand computation; with the exact velocity of a 1-D
Gaussian target the SDE keeps the flow's marginals (its samples end at the target's mean and variance, as the ODE's
do); noise level 0 is the Euler step."""
import jax
import jax.numpy as jnp
import numpy as np

from rlkit.diffusion.sde import sde_step, sigma_at, step_moments

MU, TAU = 1.5, 0.5          # the data distribution N(MU, TAU^2); noise N(0, 1)


def exact_u(x, s):
  """E[a - eps | a_s = x] for a ~ N(MU, TAU^2), eps ~ N(0, 1), a_s = s a + (1 - s) eps."""
  var = s ** 2 * TAU ** 2 + (1 - s) ** 2
  return MU + (s * TAU ** 2 - (1 - s)) / var * (x - s * MU)


def test_one_step_log_density_is_the_hand_computed_gaussian():
  x, u, s, ds, a = 0.3, -0.8, 0.4, 0.1, 0.7
  sig = a * np.sqrt((1 - s) / s)
  mean = x * (1 - sig ** 2 * ds / (2 * (1 - s))) + u * ds * (1 + sig ** 2 * s / (2 * (1 - s)))
  std = sig * np.sqrt(ds)
  eps = 0.37
  nxt, lp = sde_step(jnp.array([x]), jnp.array([u]), s, ds, a, jnp.array([eps]), 1)
  np.testing.assert_allclose(float(nxt[0]), mean + std * eps, rtol=1e-6)
  np.testing.assert_allclose(float(lp), -0.5 * eps ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi), rtol=1e-6)
  np.testing.assert_allclose(float(sigma_at(0.0, 0.1, a)), a * np.sqrt(1 / 0.1), rtol=1e-6)   # the release at s = 0
  m0, _ = step_moments(jnp.array([x]), jnp.array([u]), s, ds, 0.0)
  np.testing.assert_allclose(float(m0[0]), x + ds * u, rtol=1e-6)                # noise level 0: Euler


def test_the_sde_keeps_the_flows_marginals_on_a_gaussian_target():
  steps, n = 200, 40_000
  ds = 1.0 / steps
  x = jax.random.normal(jax.random.key(0), (n, 1))
  keys = jax.random.split(jax.random.key(1), steps)

  def one(x, i):
    s = i * ds
    nxt, _ = sde_step(x, exact_u(x, s), s, ds, 0.7, jax.random.normal(keys[i], x.shape), 1)
    return nxt, None
  # the first steps' sigma is large and the Euler error of order ds there; start at s = ds from its exact marginal
  x = ds * MU + jnp.sqrt(ds ** 2 * TAU ** 2 + (1 - ds) ** 2) * x
  x, _ = jax.lax.scan(one, x, jnp.arange(1, steps))
  assert abs(float(x.mean()) - MU) < 0.03 and abs(float(x.std()) - TAU) < 0.03, (float(x.mean()), float(x.std()))
