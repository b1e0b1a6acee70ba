"""The hand-written backward passes of the model's matmuls and SwiGLU equal JAX's own autodiff."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.models.matmul import weight_matmul
from rlkit.models.transformer import Transformer, TransformerConfig, init_params, swiglu

# Every projection form the model uses; the shapes make x the smaller operand for some forms and dy the
# smaller for others, so both branches of the weight gradient run.
FORMS = {
    "qkv": ("btd,dkgh->btkgh", (2, 5, 8), (8, 2, 4, 3)),
    "o": ("bktgh,kghd->btd", (2, 2, 5, 2, 3), (2, 2, 3, 8)),
    "gate_up": ("btd,dcf->btcf", (2, 5, 4), (4, 2, 12)),
    "down": ("btf,fd->btd", (2, 5, 12), (12, 4)),
    "lm_head": ("btd,dv->btv", (2, 5, 8), (8, 32)),
    "tied_head": ("btd,vd->btv", (2, 5, 8), (32, 8)),
}


def _plain(eq, x, w):
  return jnp.einsum(eq, x, w, preferred_element_type=jnp.float32)


@pytest.mark.parametrize("form", sorted(FORMS))
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["f32", "bf16"])
def test_weight_matmul_value_and_gradients_equal_einsum(form, dtype):
  eq, xs, ws = FORMS[form]
  kx, kw, kc = jax.random.split(jax.random.key(0), 3)
  x = jax.random.normal(kx, xs).astype(dtype)
  w = jax.random.normal(kw, ws).astype(dtype)
  cot = jax.random.normal(kc, _plain(eq, x, w).shape)
  loss = lambda f: lambda x, w: jnp.sum(f(eq, x, w) * cot)  # noqa: E731
  ours, ref = jax.grad(loss(weight_matmul), (0, 1))(x, w), jax.grad(loss(_plain), (0, 1))(x, w)
  np.testing.assert_array_equal(weight_matmul(eq, x, w), _plain(eq, x, w))
  tol = 1e-5 if dtype == jnp.float32 else 2e-2
  for a, b in zip(ours, ref):
    assert a.dtype == b.dtype == dtype
    np.testing.assert_allclose(np.asarray(a, np.float32), np.asarray(b, np.float32), rtol=tol, atol=tol)


def test_weight_matmul_rejects_batch_axes_shared_by_all_terms():
  x, w = jnp.ones((2, 3, 4)), jnp.ones((2, 4, 5))
  with pytest.raises(ValueError, match="every axis in exactly two terms"):
    weight_matmul("btd,bdf->btf", x, w)


def test_swiglu_gradient_equals_autodiff_of_the_formula():
  gu = jax.random.normal(jax.random.key(1), (3, 4, 2, 6)) * 3.0
  cot = jax.random.normal(jax.random.key(2), (3, 4, 6))
  plain = lambda gu: jax.nn.silu(gu[..., 0, :]) * gu[..., 1, :]  # noqa: E731
  np.testing.assert_allclose(swiglu(gu), plain(gu), rtol=1e-6)
  ours = jax.grad(lambda gu: jnp.sum(swiglu(gu) * cot))(gu)
  ref = jax.grad(lambda gu: jnp.sum(plain(gu) * cot))(gu)
  np.testing.assert_allclose(ours, ref, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("tied", [False, True], ids=["untied", "tied"])
def test_model_gradients_equal_plain_einsum_model(tied, monkeypatch):
  """The whole decoder's parameter gradients with the custom backward passes equal plain autodiff's."""
  import rlkit.models.transformer as transformer
  cfg = TransformerConfig(vocab_size=40, hidden_size=16, intermediate_size=24, num_layers=2, num_heads=4,
                          num_kv_heads=2, head_dim=4, tie_word_embeddings=tied)
  params = init_params(cfg, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, cfg.vocab_size)
  def loss(p):
    return jnp.mean(jax.nn.log_softmax(Transformer(cfg).apply({"params": p}, tokens)) ** 2)
  # Jitted (eager autodiff compiles every op on its own); traced afresh after the patch, so `ref` is plain.
  ours = jax.jit(jax.grad(loss))(params)
  monkeypatch.setattr(transformer, "weight_matmul", _plain)
  monkeypatch.setattr(transformer, "swiglu", lambda gu: jax.nn.silu(gu[..., 0, :]) * gu[..., 1, :])
  ref = jax.jit(jax.grad(loss))(params)
  for (path, a), b in zip(jax.tree_util.tree_leaves_with_path(ours), jax.tree.leaves(ref)):
    np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-7, err_msg=jax.tree_util.keystr(path))
