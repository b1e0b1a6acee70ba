"""LoGRA (rlkit/optim/logra.py): the dense limit (identity projection = row-wise Adam, by hand and against
numpy), sketched inputs from `sketched_matmul` = dense inputs sketched in the optimizer, the compiled sketch
gradient's memory against the dense one, projections regenerated from the seed, low-rank updates, weight
decay, the optax checklist (jit, bf16, inject_hyperparams, MultiSteps, masked, stable state), and
predicted-KL control (realised / predicted KL -> 1 as the step shrinks; a non-finite prediction skips)."""
import doctest

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from rlkit.optim import logra as logra_module
from rlkit.optim.logra import (
    ScaleByLoGRAState, layer_index, layer_projections, logra, logra_count, predicted_kl_control,
    scale_by_logra, sketched_matmul, softmax_fisher_quadratic)
from tests.fast_compile import fast_compile, optimized


@pytest.fixture(autouse=True)
def _fast_compile(request):
  # Values, not fusion choices, except the memory test, which reads the optimised program's buffers.
  if "memory" in request.node.name:
    yield
  else:
    with fast_compile():
      yield


def _randn(seed, shape, scale=1.0):
  return (scale * np.random.default_rng(seed).standard_normal(shape)).astype(np.float32)


def _params(dtype=jnp.float32):
  return {"w": jnp.asarray(_randn(0, (6, 10)), dtype), "v": jnp.asarray(_randn(1, (5, 10)), dtype),
          "b": jnp.asarray(_randn(2, (10,)), dtype)}


def _grads(seed, dtype=jnp.float32):
  return jax.tree.map(lambda p, i: jnp.asarray(_randn(seed * 10 + i, p.shape), dtype),
                      _params(), {"w": 0, "v": 1, "b": 2})


# ---------------------------------------------------------------------------------------------- dense limit

def test_identity_projection_first_step_by_hand():
  # G = [[3, 4]]: v = (1 - b2) * 12.5, v_hat = 12.5, D = G / sqrt(12.5) (no first moment by default).
  tx = scale_by_logra(2, projection="identity")
  w = {"w": jnp.zeros((1, 2))}
  u, state = jax.jit(tx.update)({"w": jnp.array([[3.0, 4.0]])}, tx.init(w))
  np.testing.assert_allclose(u["w"], [[3 / 12.5 ** 0.5, 4 / 12.5 ** 0.5]], rtol=1e-6)
  np.testing.assert_allclose(state.nu["w"], [0.05 * 12.5], rtol=1e-6)
  assert state.mu is None and int(state.count) == 1


def test_full_rank_identity_is_rowwise_adam():
  b1, b2, eps = 0.9, 0.95, 1e-8
  tx = scale_by_logra(5, b1=b1, b2=b2, eps=eps, projection="identity")
  params = {"w": jnp.zeros((3, 5))}
  state, step = tx.init(params), jax.jit(tx.update)
  m, v = np.zeros((3, 5)), np.zeros((3, 1))
  for t in range(1, 5):
    g = _randn(t, (3, 5)).astype(np.float64)
    m = b1 * m + (1 - b1) * g
    v = b2 * v + (1 - b2) * np.mean(g ** 2, axis=1, keepdims=True)
    expect = (m / (1 - b1 ** t)) / (np.sqrt(v / (1 - b2 ** t)) + eps)
    u, state = step({"w": jnp.asarray(g, jnp.float32)}, state)
    np.testing.assert_allclose(u["w"], expect, rtol=2e-6, atol=1e-7)


# ---------------------------------------------------------------------------------------------- sketches

def test_sketched_inputs_equal_dense_inputs_sketched_in_the_optimizer():
  # A softmax layer logits = x @ w + b. Dense arm: jax.grad w.r.t. w. Sketch arm: the model side adds the
  # zero low-rank path with the projection the optimizer will use (layer_projections at logra_count) and
  # differentiates w.r.t. that path only. Over two steps (two different projections) the updates agree.
  x, labels = jnp.asarray(_randn(3, (16, 6))), jnp.arange(16) % 10
  ce = lambda z: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z), labels[:, None], 1))
  params = {"w": jnp.asarray(_randn(4, (6, 10))), "b": jnp.zeros(10)}
  dense_tx, sketch_tx = logra(0.1, 4, b1=0.9), logra(0.1, 4, b1=0.9, sketch_inputs=True)
  ds, ss = dense_tx.init(params), sketch_tx.init(params)

  @jax.jit
  def both(params, ds, ss):
    g = jax.grad(lambda p: ce(x @ p["w"] + p["b"]))(params)
    proj = layer_projections(params, 4, logra_count(ss))["w"]
    sk = jax.grad(lambda sb, b: ce(sketched_matmul(x, params["w"], sb, proj) + b), argnums=(0, 1))(
        jnp.zeros((6, 4)), params["b"])
    np_sketch = g["w"] @ proj
    ud, ds = dense_tx.update(g, ds, params)
    us, ss = sketch_tx.update({"w": sk[0], "b": sk[1]}, ss, params)
    return ud, us, ds, ss, sk[0], np_sketch, proj

  projs = []
  for _ in range(2):
    ud, us, ds, ss, sketch, expect_sketch, proj = both(params, ds, ss)
    np.testing.assert_allclose(sketch, expect_sketch, rtol=1e-5, atol=1e-7)   # dL/dB = G P
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), ud, us)
    params = optax.apply_updates(params, ud)
    projs.append(proj)
  assert not np.allclose(projs[0], projs[1])       # refresh_every=1: a new projection each step


def test_memory_of_the_sketch_gradient_below_the_dense_gradient():
  # memory_analysis of the compiled gradient: dense dL/dW outputs an [m, n] buffer; the sketch path
  # (projection regenerated inside the program, kernel closed over) needs only [tokens, r]/[m, r]/[n, r]
  # buffers. Listing the kernel among the differentiated arguments brings the [m, n] buffer back (zeros).
  m = n = 1024
  tokens, r = 32, 16
  x, labels = jnp.asarray(_randn(5, (tokens, m))), jnp.arange(tokens) % n
  w = jnp.zeros((m, n))
  ce = lambda z: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(z), labels[:, None], 1))

  def sketch_loss(b, w):
    proj = layer_projections({"w": w}, r, 0)["w"]
    return ce(sketched_matmul(x, w, b, proj))

  def mem(f, *args):
    with optimized():                     # the optimised program's buffers (the run compiles without passes)
      ma = jax.jit(f).lower(*args).compile().memory_analysis()
    return ma.temp_size_in_bytes, ma.output_size_in_bytes

  dense_temp, dense_out = mem(jax.grad(lambda w: ce(x @ w)), w)
  sketch_temp, sketch_out = mem(jax.grad(sketch_loss), jnp.zeros((m, r)), w)
  _, both_out = mem(jax.grad(sketch_loss, argnums=(0, 1)), jnp.zeros((m, r)), w)
  grad_bytes = m * n * 4
  assert dense_out >= grad_bytes
  assert sketch_out == m * r * 4
  assert sketch_temp + sketch_out < grad_bytes / 4, (sketch_temp, sketch_out, dense_temp, dense_out)
  assert both_out >= grad_bytes


def test_projections_regenerated_from_seed_not_stored():
  params = _params()
  tx = scale_by_logra(4, seed=7)
  masked = {"w": True, "v": True, "b": False}
  state = optax.masked(tx, masked).init(params)
  shapes = [x.shape for x in jax.tree.leaves(state)]
  assert (10, 4) not in shapes and (4, 10) not in shapes     # no P in the state
  for step in (0, 3):
    projs = layer_projections(params, 4, step, seed=7, mask=masked)
    assert projs["b"] is None
    for name in ("w", "v"):
      path = (jax.tree_util.DictKey(name),)
      key = jax.random.fold_in(jax.random.fold_in(jax.random.key(7), layer_index(path)), step)
      np.testing.assert_array_equal(projs[name], jax.random.rademacher(key, (10, 4), jnp.float32) / 2.0)
  p0 = layer_projections(params, 4, 0, mask=masked)
  assert not np.array_equal(p0["w"], p0["v"])                     # per layer
  fixed = [layer_projections(params, 4, s, refresh_every=0, mask=masked)["w"] for s in (0, 5)]
  np.testing.assert_array_equal(*fixed)


def test_update_is_the_low_rank_product():
  params = {"w": _params()["w"]}
  tx = scale_by_logra(4, seed=1)
  u, _ = tx.update({"w": _grads(1)["w"]}, tx.init(params))
  proj = np.asarray(layer_projections(params, 4, 0, seed=1)["w"], np.float64)
  uw = np.asarray(u["w"], np.float64)
  assert np.linalg.matrix_rank(uw, tol=1e-4 * np.abs(uw).max()) == 4
  np.testing.assert_allclose(uw @ proj @ np.linalg.solve(proj.T @ proj, proj.T), uw, atol=1e-5)


def test_weight_decay_and_adamw_for_the_rest():
  params = _params()
  zero = jax.tree.map(jnp.zeros_like, params)
  tx = logra(0.1, 4, weight_decay=0.5)
  step = jax.jit(lambda g: tx.update(g, tx.init(params), params)[0])
  u = step(zero)
  np.testing.assert_allclose(u["w"], -0.1 * 0.5 * params["w"], rtol=1e-6)   # zero sketch: only decay
  g = _grads(2)
  u = step(g)
  adamw = optax.adamw(0.1, weight_decay=0.5)
  ub, _ = adamw.update({"b": g["b"]}, adamw.init({"b": params["b"]}), {"b": params["b"]})
  np.testing.assert_allclose(u["b"], ub["b"], rtol=1e-6)                   # the 1-D leaf is AdamW's


# ------------------------------------------------------------------------------------------- optax checklist

def test_jit_state_shapes_and_dtypes_stable():
  params = _params()
  tx = logra(0.1, 4, b1=0.9)
  state = tx.init(params)
  spec0 = jax.tree.map(lambda x: (x.shape, x.dtype), state)
  step = jax.jit(lambda g, s, p: tx.update(g, s, p))
  for t in range(3):
    u, state = step(_grads(t), state, params)
    params = optax.apply_updates(params, u)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == spec0
  assert int(logra_count(state)) == 3
  lg = [s for s in jax.tree.leaves(state, is_leaf=lambda s: isinstance(s, ScaleByLoGRAState))
        if isinstance(s, ScaleByLoGRAState)][0]
  assert sum(x.size for x in jax.tree.leaves(lg)) < params["w"].size + params["v"].size   # Adam: 2x that


def test_bf16_params():
  params = _params(jnp.bfloat16)
  tx = logra(0.1, 4, b1=0.9, weight_decay=0.1)
  state = tx.init(params)
  spec0 = jax.tree.map(lambda x: (x.shape, x.dtype), state)
  step = jax.jit(tx.update)
  for t in range(2):
    u, state = step(_grads(t, jnp.bfloat16), state, params)
    assert all(x.dtype == jnp.bfloat16 for x in jax.tree.leaves(u))
    assert all(np.isfinite(np.asarray(x, np.float32)).all() for x in jax.tree.leaves(u))
    params = optax.apply_updates(params, u)
  assert jax.tree.map(lambda x: (x.shape, x.dtype), state) == spec0
  assert all(p.dtype == jnp.bfloat16 for p in jax.tree.leaves(params))


def test_inject_hyperparams():
  params, g = _params(), _grads(3)
  tx = optax.inject_hyperparams(logra, static_args=("rank",))(learning_rate=0.1, rank=4, b1=0.9)
  state = tx.init(params)
  step = jax.jit(tx.update)
  u1, _ = step(g, state, params)
  state = state._replace(hyperparams={**state.hyperparams, "learning_rate": jnp.float32(0.2)})
  u2, _ = step(g, state, params)
  jax.tree.map(lambda a, b: np.testing.assert_allclose(b, 2 * a, rtol=1e-6), u1, u2)


def test_multisteps_equals_one_step_on_the_mean_gradient():
  params, g1, g2 = _params(), _grads(4), _grads(5)
  tx = logra(0.1, 4, b1=0.9)
  ms = optax.MultiSteps(tx, every_k_schedule=2)
  state = ms.init(params)
  step = jax.jit(ms.update)
  u1, state = step(g1, state, params)
  u2, state = step(g2, state, params)
  ref, _ = jax.jit(tx.update)(jax.tree.map(lambda a, b: (a + b) / 2, g1, g2), tx.init(params), params)
  assert all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(u1))
  jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), u2, ref)
  assert int(logra_count(state)) == 1


def test_masked():
  params, g = _params(), _grads(6)
  tx = optax.masked(scale_by_logra(4), {"w": True, "v": True, "b": False})
  u, state = tx.update(g, tx.init(params), params)
  np.testing.assert_array_equal(u["b"], g["b"])                            # masked out: passed through
  assert np.linalg.matrix_rank(np.asarray(u["w"])) == 4
  inner = state.inner_state
  assert isinstance(inner, ScaleByLoGRAState) and inner.nu["w"].shape == (6,)


def test_argument_errors():
  with pytest.raises(ValueError, match=r"\['b'\].*2-D"):
    scale_by_logra(4).init({"b": jnp.zeros(16)})
  with pytest.raises(ValueError, match="n >= rank"):
    scale_by_logra(8).init({"w": jnp.zeros((4, 5))})
  with pytest.raises(TypeError):
    scale_by_logra(4.0)
  with pytest.raises(ValueError, match="rademacher, identity"):
    scale_by_logra(4, projection="gaussian")
  tx = scale_by_logra(4, sketch_inputs=True)
  with pytest.raises(ValueError, match="pass params"):
    tx.update({"w": jnp.zeros((6, 4))}, tx.init({"w": jnp.zeros((6, 10))}))
  kl = predicted_kl_control(scale_by_logra(4), 1e-3)
  with pytest.raises(TypeError, match="kl_probe"):
    kl.update({"w": jnp.zeros((6, 10))}, kl.init({"w": jnp.zeros((6, 10))}))


# ---------------------------------------------------------------------------------------------- KL control

def _softmax_model():
  x = jnp.asarray(_randn(7, (32, 8)))
  params = {"w": jnp.asarray(_randn(8, (8, 12), 0.5)), "b": jnp.asarray(_randn(9, (12,), 0.5))}
  logits = lambda p: x @ p["w"] + p["b"]
  labels = jnp.arange(32) % 12
  loss = lambda p: -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits(p)), labels[:, None], 1))
  return x, params, logits, loss


def test_realised_over_predicted_kl_tends_to_one():
  x, params, logits, loss = _softmax_model()
  tx = optax.inject_hyperparams(predicted_kl_control)(inner=logra(0.5, 4), kl_target=1e-2, alpha_max=1e6)
  state = tx.init(params)

  @jax.jit
  def step(target):
    s = state._replace(hyperparams={**state.hyperparams, "kl_target": target})
    probe = lambda d: softmax_fisher_quadratic(logits, params, d)
    return tx.update(jax.grad(loss)(params), s, params, kl_probe=probe)

  def log_softmax64(z):
    z = z - z.max(-1, keepdims=True)
    return z - np.log(np.exp(z).sum(-1, keepdims=True))

  x64 = np.asarray(x, np.float64)
  w64, b64 = (np.asarray(params[k], np.float64) for k in ("w", "b"))
  lp0 = log_softmax64(x64 @ w64 + b64)
  errors = []
  for target in (1e-2, 1e-3, 1e-4, 1e-5):
    u, s = step(jnp.float32(target))
    inner = s.inner_state
    predicted = float(inner.scale) ** 2 * float(inner.predicted_kl)
    np.testing.assert_allclose(predicted, target, rtol=1e-5)        # alpha meets the target exactly
    lp1 = log_softmax64(x64 @ (w64 + np.asarray(u["w"], np.float64)) + b64 + np.asarray(u["b"], np.float64))
    realised = float(np.mean(np.sum(np.exp(lp0) * (lp0 - lp1), -1)))
    errors.append(abs(realised / predicted - 1))
  assert all(a > b for a, b in zip(errors, errors[1:])), errors
  assert errors[-1] < 2e-3, errors     # third-order term: error ~ sqrt(target), 8e-4 at 1e-5


def test_non_finite_or_non_positive_prediction_skips_the_step():
  _, params, logits, loss = _softmax_model()
  tx = predicted_kl_control(logra(0.5, 4, b1=0.9), 1e-3)
  g = jax.grad(loss)(params)
  step = jax.jit(lambda s, q: tx.update(g, s, params, kl_probe=lambda d: q))
  state = tx.init(params)
  for i, q in enumerate((jnp.nan, jnp.inf, 0.0)):
    u, new = step(state, jnp.float32(q))
    assert all(np.all(np.asarray(x) == 0) for x in jax.tree.leaves(u))
    jax.tree.map(np.testing.assert_array_equal, new.inner_state, state.inner_state)
    assert int(new.skipped) == i + 1 and float(new.scale) == 0.0
    state = new
  u, state = step(state, jnp.float32(1e-6))           # tiny predicted KL: alpha capped at alpha_max = 1
  assert float(state.scale) == 1.0 and int(state.skipped) == 3 and int(logra_count(state)) == 1
  assert any(np.any(np.asarray(x) != 0) for x in jax.tree.leaves(u))


def test_doctests():
  result = doctest.testmod(logra_module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
  assert result.attempted > 0 and result.failed == 0, result
