"""KL estimators: k3 >= 0 with equality iff equal, exact expectations on a small categorical, clamping."""
import jax
import jax.numpy as jnp
import numpy as np

from rlkit.objectives import kl_penalty


def _randn(seed, shape, scale=1.0):
  return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def test_k3_nonnegative_and_zero_iff_equal():
  logp = _randn(0, (64, 16), 3.0)
  ref = logp + _randn(1, (64, 16), 3.0)
  ref = np.where(np.random.default_rng(2).random(ref.shape) < 0.3, logp, ref)
  k3 = np.asarray(kl_penalty("k3", logp, ref))
  equal = logp == ref
  assert equal.any() and (~equal).any()
  assert np.all(k3 >= 0.0)
  assert np.all(k3[equal] == 0.0)
  assert np.all(k3[~equal & (np.abs(logp - ref) > 1e-3)] > 0.0)


def test_estimators_against_exact_kl_on_a_categorical():
  # Expectations over o ~ pi by enumerating the 7 outcomes, against KL(pi || ref) = sum pi log(pi / ref).
  logits = _randn(3, (7,))
  logp = jax.nn.log_softmax(logits)
  ref_near = jax.nn.log_softmax(logits + _randn(4, (7,), 0.05))
  ref_far = jax.nn.log_softmax(_randn(5, (7,)))
  pi = np.exp(np.asarray(logp, np.float64))
  for ref in (ref_near, ref_far):
    exact = float(np.sum(pi * (np.asarray(logp, np.float64) - np.asarray(ref, np.float64))))
    expect = {k: float(np.sum(pi * np.asarray(kl_penalty(k, logp, ref), np.float64)))
              for k in ("k1", "k2", "k3")}
    np.testing.assert_allclose(expect["k1"], exact, rtol=1e-5, atol=1e-7)  # unbiased
    np.testing.assert_allclose(expect["k3"], exact, rtol=1e-5, atol=1e-7)  # unbiased
  # k2 is biased but second-order accurate: close for nearby distributions, not for distant ones.
  exact_near = float(np.sum(pi * (np.asarray(logp, np.float64) - np.asarray(ref_near, np.float64))))
  k2_near = float(np.sum(pi * np.asarray(kl_penalty("k2", logp, ref_near), np.float64)))
  np.testing.assert_allclose(k2_near, exact_near, rtol=0.05)
  assert abs(expect["k2"] - exact) > 0.05 * exact


def test_gradients_flow_through_logp_only_and_clamp_keeps_k3_finite():
  logp = jnp.array([[-1.0, -120.0, -0.5]])
  ref = jnp.array([[-1.5, -0.1, -90.0]])  # log-ratios 0.5, far above and far below +-20
  for name in ("k1", "k2", "k3"):
    g_logp, g_ref = jax.jit(jax.grad(lambda a, b: kl_penalty(name, a, b).sum(), argnums=(0, 1)))(logp, ref)
    assert np.all(np.isfinite(g_logp))
    np.testing.assert_array_equal(g_ref, 0.0)
  k3 = np.asarray(kl_penalty("k3", logp, ref))
  assert np.all(np.isfinite(k3))
  np.testing.assert_allclose(k3[0, 1:], [np.expm1(20.0) - 20.0, np.expm1(-20.0) + 20.0], rtol=1e-6)
  # d k3 / d logp = 1 - exp(ref - logp) inside the clamp.
  g = jax.grad(lambda a: kl_penalty("k3", a, ref).sum())(logp)
  np.testing.assert_allclose(g[0, 0], 1.0 - np.exp(-0.5), rtol=1e-6)
