"""`attend`: causal blocks give the dense values for real queries, and the written-out backward pass equals
autodiff of the plain masked softmax."""
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.models.attention import attend, causal_blocks, merge_blocks, query_blocks

B, KV, G, T, HD = 2, 2, 3, 16, 8


def _plain(q, k, v, allowed):
  """The textbook composition on q [B, T, KV, G, hd], autodiff'ed by JAX; output [B, T, KV*G*hd]."""
  qh = q.transpose(0, 2, 1, 3, 4).reshape(B, KV, T * G, HD)
  s = jnp.einsum("bkqh,bksh->bkqs", qh, k, preferred_element_type=jnp.float32)
  s = s.reshape(B, KV, T, G, -1) / math.sqrt(HD)
  s = jnp.where(allowed[:, None, :, None, :], s, jnp.finfo(jnp.float32).min)
  p = jax.nn.softmax(s, axis=-1).reshape(B, KV, T * G, -1)
  o = jnp.einsum("bkqs,bksh->bkqh", p.astype(v.dtype), v, preferred_element_type=jnp.float32)
  return o.reshape(B, KV, T, G * HD).transpose(0, 2, 1, 3).reshape(B, T, KV * G * HD)


def _ours(q, k, v, allowed, blocks):
  return merge_blocks(attend(query_blocks(q, blocks), k, v, allowed, G, blocks), G)


def _inputs(dtype):
  kq, kk, kv, kc = jax.random.split(jax.random.key(0), 4)
  q = jax.random.normal(kq, (B, T, KV, G, HD)).astype(dtype)
  k = jax.random.normal(kk, (B, KV, T, HD)).astype(dtype)
  v = jax.random.normal(kv, (B, KV, T, HD)).astype(dtype)
  real = jnp.arange(T)[None, :] >= jnp.array([[0], [5]])               # row 1 left-padded by 5
  allowed = (jnp.arange(T)[None, :] <= jnp.arange(T)[:, None])[None] & real[:, None, :]
  cot = jax.random.normal(kc, (B, T, KV * G * HD))
  return q, k, v, allowed, real, cot


@pytest.mark.parametrize("blocks", [1, 2, 4])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_attend_values_and_gradients_equal_autodiff_of_the_plain_softmax(blocks, dtype):
  q, k, v, allowed, real, cot = _inputs(dtype)
  # Padding queries (no allowed key) carry no cotangent, as in a model whose loss masks them.
  rows = real[:, :, None]
  cot = cot * rows
  ours = _ours(q, k, v, allowed, blocks)
  ref = _plain(q, k, v, allowed)
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  np.testing.assert_allclose(jnp.where(rows, ours, 0), jnp.where(rows, ref, 0), rtol=tol, atol=tol)
  if blocks == 1:
    np.testing.assert_array_equal(ours, ref)                            # padding rows too
  loss = lambda f: lambda q, k, v: jnp.sum(f(q, k, v) * cot)  # noqa: E731
  g_ours = jax.grad(loss(lambda q, k, v: _ours(q, k, v, allowed, blocks)), (0, 1, 2))(q, k, v)
  g_ref = jax.grad(loss(lambda q, k, v: _plain(q, k, v, allowed)), (0, 1, 2))(q, k, v)
  for a, b in zip(g_ours, g_ref):
    assert a.dtype == b.dtype == dtype
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)


def test_fully_masked_rows_pass_no_gradient():
  # Even with a cotangent on a padding query, its uniform softmax row must not reach q, k or v: autodiff's
  # `where` stops it, and so must the written-out backward pass.
  q, k, v, allowed, _, cot = _inputs(jnp.float32)
  g_ours = jax.grad(lambda q, k, v: jnp.sum(_ours(q, k, v, allowed, 1) * cot), (0, 1, 2))(q, k, v)
  g_ref = jax.grad(lambda q, k, v: jnp.sum(_plain(q, k, v, allowed) * cot), (0, 1, 2))(q, k, v)
  for a, b in zip(g_ours, g_ref):
    np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


def test_causal_blocks_and_bad_splits():
  assert [causal_blocks(t) for t in (8, 64, 128, 192, 256, 260, 4096)] == [1, 1, 2, 3, 4, 4, 4]
  q, k, v, allowed, _, _ = _inputs(jnp.float32)
  for bad in (3, 0):
    with pytest.raises(ValueError, match=f"do not split into {bad} causal blocks"):
      query_blocks(q, bad)
  with pytest.raises(ValueError, match=r"not in 2 blocks .* use query_blocks\(q, 2\)"):
    attend(query_blocks(q, 4), k, v, allowed, G, 2)
  with pytest.raises(ValueError, match="S == T"):
    attend(query_blocks(q, 2), jnp.concatenate([k, k], 2), jnp.concatenate([v, v], 2),
           jnp.concatenate([allowed, allowed], 2), G, 2)
