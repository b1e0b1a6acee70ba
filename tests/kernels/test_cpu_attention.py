"""`kernels.cpu_attention`: the C++ XLA:CPU kernel against its jnp reference (values and gradients), inside the
model against the XLA path, under a sharded mesh, and its errors."""
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from kernels import cpu_attention as ca
from rlkit.models.transformer import Transformer, TransformerConfig
from rlkit.parallel.mesh import make_mesh

B, T, KV, G, HD = 3, 40, 2, 3, 32       # T: not a multiple of 16 (the kernel pads its scratch to 48)


def _inputs(dtype, s=T):
  kq, kk, kv, kc = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(kq, (B, T, KV, G, HD)).astype(dtype)
  k = jax.random.normal(kk, (B, s, KV, HD)).astype(dtype)
  v = jax.random.normal(kv, (B, s, KV, HD)).astype(dtype)
  real = jnp.arange(s)[None, :] >= jnp.array([[0], [7], [0]])           # row 1 left-padded by 7
  allowed = jnp.broadcast_to(real[:, None, :], (B, T, s))
  if s == T:
    allowed = allowed & (jnp.arange(T)[None, :] <= jnp.arange(T)[:, None])[None]
  allowed = allowed.at[2, 5].set(False)                                 # one query with no allowed key
  cot = jax.random.normal(kc, (B, T, KV, G, HD))
  return q, k, v, allowed, cot


@pytest.mark.parametrize("causal,dtype", [(True, jnp.float32), (False, jnp.float32), (True, jnp.bfloat16)])
def test_values_and_gradients_equal_the_reference(causal, dtype):
  q, k, v, allowed, cot = _inputs(dtype)
  live = jnp.any(allowed, -1)[:, :, None, None, None]                   # queries with an allowed key
  out, vjp = jax.vjp(lambda *a: ca.cpu_attention(*a, allowed, causal), q, k, v)
  ref, ref_vjp = jax.vjp(lambda *a: ca.cpu_attention_reference(*a, allowed), q, k, v)
  assert out.dtype == jnp.float32 and out.shape == q.shape
  np.testing.assert_allclose(np.where(live, out, 0), np.where(live, ref, 0), atol=2e-6)
  grads, ref_grads = vjp(cot * live), ref_vjp(cot * live)
  tol = 2e-5 if dtype == jnp.float32 else 2e-2        # bf16: the gradients are rounded to the inputs' dtype
  for name, g, r in zip("qkv", grads, ref_grads):
    assert g.dtype == dtype, name
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), atol=tol, err_msg=name)


def test_cross_attention_shapes():
  q, k, v, allowed, cot = _inputs(jnp.float32, s=24)                    # S != T, not causal
  live = jnp.any(allowed, -1)[:, :, None, None, None]
  out = ca.cpu_attention(q, k, v, allowed, False)
  ref = ca.cpu_attention_reference(q, k, v, allowed)
  np.testing.assert_allclose(np.where(live, out, 0), np.where(live, ref, 0), atol=2e-6)
  with pytest.raises(ValueError, match="S == T"):
    ca.cpu_attention(q, k, v, allowed, True)


def test_a_query_with_no_allowed_key_is_uniform_and_passes_no_gradient():
  q, k, v, allowed, cot = _inputs(jnp.float32)
  out, vjp = jax.vjp(lambda q, k: ca.cpu_attention(q, k, v, allowed, True), q, k)
  # Causal: uniform over the keys it considers, slots 0..5 of batch row 2.
  np.testing.assert_allclose(out[2, 5], jnp.broadcast_to(v[2, :6].mean(0)[:, None], (KV, G, HD)), atol=1e-6)
  only_that_row = jnp.zeros_like(cot).at[2, 5].set(cot[2, 5])
  dq, dk = vjp(only_that_row)
  assert not np.any(np.asarray(dq)) and not np.any(np.asarray(dk))


def _model_cfg(attention):
  return TransformerConfig(vocab_size=64, hidden_size=64, intermediate_size=96, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=16, attention=attention)


def test_model_with_the_kernel_equals_the_xla_attention():
  tokens = jax.random.randint(jax.random.key(1), (2, 24), 0, 64)
  mask = jnp.arange(24)[None, :] >= jnp.array([[0], [5]])               # left padding
  xla, kernel = Transformer(_model_cfg("xla")), Transformer(_model_cfg("cpu_kernel"))
  params = xla.init(jax.random.key(0), tokens)["params"]

  def loss(model, p):
    logits = model.apply({"params": p}, tokens, attention_mask=mask)
    return jnp.sum(jnp.where(mask[..., None], jax.nn.log_softmax(logits), 0.0) ** 2) / 1e4

  (l_x, g_x), (l_k, g_k) = (jax.value_and_grad(loss, argnums=1)(m, params) for m in (xla, kernel))
  np.testing.assert_allclose(l_k, l_x, rtol=1e-5)
  for a, b in zip(jax.tree.leaves(g_k), jax.tree.leaves(g_x)):
    np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)


def test_sharded_call_equals_one_device():
  q, k, v, allowed, cot = _inputs(jnp.float32)
  q, k, v, cot = (jnp.concatenate([x, x[:1]]) for x in (q, k, v, cot))   # batch 4: splits over data=2
  allowed = jnp.concatenate([allowed, allowed[:1]])
  f = lambda *a: jax.vjp(lambda *x: ca.cpu_attention(*x, allowed, True), *a)[1](cot)  # noqa: E731
  want = jax.jit(f)(q, k, v)
  mesh = make_mesh({"data": 2, "tensor": 2}, jax.devices()[:4])
  with jax.set_mesh(mesh):
    split = NamedSharding(mesh, P("data", None, "tensor"))
    got = jax.jit(f)(*(jax.device_put(x, split) for x in (q, k, v)))
    hlo = jax.jit(f).lower(*(jax.device_put(x, split) for x in (q, k, v))).compile().as_text()
  for a, b in zip(got, want):
    np.testing.assert_allclose(a, b, atol=1e-6)
  assert "all-gather" not in hlo          # each device runs its own shard: no operand is gathered


def test_bad_inputs_name_the_fix():
  q, k, v, allowed, _ = _inputs(jnp.float32)
  with pytest.raises(ValueError, match="multiple of 16"):
    ca.cpu_attention(q[..., :24], k[..., :24], v[..., :24], allowed, True)
  with pytest.raises(ValueError, match="do not fit"):
    ca.cpu_attention(q, k[:, :, :1], v, allowed, True)
  with pytest.raises(ValueError, match="head_dim % 16"):
    _model_cfg("cpu_kernel").replace(head_dim=24)
  with pytest.raises(ValueError, match="xla"):
    _model_cfg("flash")


def test_build_is_cached_and_a_missing_compiler_is_an_error(tmp_path, monkeypatch):
  monkeypatch.setenv("RLKIT_KERNEL_CACHE", str(tmp_path / "cache"))
  monkeypatch.setenv("CXX", "no-such-compiler-rlkit")
  with pytest.raises(RuntimeError, match="model.attention='xla'"):
    ca.library_path()
  assert not (tmp_path / "cache").exists() or not list((tmp_path / "cache").iterdir())   # nothing half-built
  monkeypatch.delenv("CXX")
  lib = ca.library_path()
  assert lib.parent == tmp_path / "cache" and lib.exists()
  stamp = os.stat(lib).st_mtime_ns
  assert ca.library_path() == lib and os.stat(lib).st_mtime_ns == stamp          # reused, not rebuilt
  assert [p.name for p in lib.parent.iterdir()] == [lib.name]                     # no temporary left behind
