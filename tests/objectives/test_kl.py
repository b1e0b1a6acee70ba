"""KL estimators: k3 >= 0 with equality iff equal, exact expectations on a small categorical, clamping, and
the straight-through k1+ / k3+ (value of k1 / k3, gradient of k2, whose expectation is the KL's gradient)."""
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


def test_abs_value_and_gradient():
  logp = jnp.array([[-1.0, -2.0, -0.5]])
  ref = jnp.array([[-1.5, -0.5, -0.5]])
  value, grad = jax.jit(jax.value_and_grad(lambda a: kl_penalty("abs", a, ref).sum()))(logp)
  np.testing.assert_allclose(kl_penalty("abs", logp, ref), [[0.5, 1.5, 0.0]])
  np.testing.assert_allclose(value, 2.0)
  np.testing.assert_allclose(grad[0, :2], [1.0, -1.0])  # sign(logp - ref)


def test_straight_through_value_of_k_gradient_of_k2():
  logp = _randn(6, (8, 5), 2.0)
  ref = logp + _randn(7, (8, 5), 2.0)
  ref[0, :2] = logp[0, :2] + np.array([30.0, -30.0], np.float32)  # beyond k3's clamp
  g_k2 = jax.jit(jax.grad(lambda a: kl_penalty("k2", a, ref).sum()))(logp)
  np.testing.assert_allclose(g_k2, logp - ref, rtol=1e-5, atol=1e-6)
  for plus, base in (("k1+", "k1"), ("k3+", "k3")):
    value, grad = jax.jit(jax.value_and_grad(lambda a: kl_penalty(plus, a, ref).sum()))(logp)
    np.testing.assert_allclose(kl_penalty(plus, logp, ref), kl_penalty(base, logp, ref), rtol=1e-6, atol=1e-6)
    np.testing.assert_allclose(value, kl_penalty(base, logp, ref).sum(), rtol=1e-6)
    np.testing.assert_allclose(grad, g_k2, rtol=1e-6, atol=1e-6)
    g_ref = jax.grad(lambda b: kl_penalty(plus, logp, b).sum())(ref)
    np.testing.assert_array_equal(g_ref, 0.0)
  # k3's own gradient is zeroed beyond the clamp; k3+ keeps k2's there.
  g_k3 = jax.grad(lambda a: kl_penalty("k3", a, ref).sum())(logp)
  np.testing.assert_array_equal(g_k3[0, :2], 0.0)


def test_plus_estimators_give_the_kl_gradient_in_expectation():
  # E_{o ~ pi}[grad_theta k(o)] against grad_theta KL(pi_theta || ref), enumerating a 7-outcome categorical.
  logits = jnp.asarray(_randn(8, (7,)))
  ref = jax.nn.log_softmax(jnp.asarray(_randn(9, (7,))))

  def exact_kl(theta):
    logp = jax.nn.log_softmax(theta)
    return jnp.sum(jnp.exp(logp) * (logp - ref))

  def expected_estimate(theta, name):
    logp = jax.nn.log_softmax(theta)
    return jnp.sum(jax.lax.stop_gradient(jnp.exp(logp)) * kl_penalty(name, logp, ref))

  target = jax.grad(exact_kl)(logits)
  assert np.abs(np.asarray(target)).max() > 0.05
  for name in ("k2", "k1+", "k3+"):
    np.testing.assert_allclose(jax.grad(expected_estimate)(logits, name), target, rtol=1e-4, atol=1e-6)
  for name in ("k1", "k3"):  # unbiased in value, not in gradient
    assert not np.allclose(jax.grad(expected_estimate)(logits, name), target, rtol=1e-2, atol=1e-3)
