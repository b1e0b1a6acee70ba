"""The decode layout (rlkit/models/decode_layout.py): features-major weight copies give the model's own logits, and the
model reads them wherever the params carry them (the sampler adds them on CPU)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.models.decode_layout import decode_params
from rlkit.models.transformer import Transformer, TransformerConfig, init_params


def _config(**kw):
  base = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
              head_dim=8)
  return TransformerConfig(**{**base, **kw})


@pytest.mark.parametrize("kw", [{}, {"tie_word_embeddings": True}, {"dtype": "bfloat16"},
                                {"num_experts": 4, "num_experts_per_tok": 2, "moe_intermediate_size": 16,
                                 "decoder_sparse_step": 2}])
def test_features_major_copies_give_the_same_logits(kw):
  cfg = _config(**kw)
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(0))
  apply = jax.jit(model.apply)        # eagerly, every op compiles on its own
  tokens = jax.random.randint(jax.random.key(1), (3, 7), 0, cfg.vocab_size)
  plain = apply({"params": params}, tokens)
  fast = decode_params(params, cfg)
  tol = 2e-2 if cfg.dtype == "bfloat16" else 1e-6
  np.testing.assert_allclose(np.asarray(apply({"params": fast}, tokens)), np.asarray(plain), atol=tol)
  dense = [k for k in fast if k.startswith("layers_") and "mlp" in fast[k]]
  assert all(fast[k]["mlp"]["down_nk"].dtype == jnp.dtype(cfg.dtype) for k in dense)
  assert fast["lm_head_nk"].shape == (cfg.vocab_size, cfg.hidden_size)      # tied: the embedding itself


def test_the_model_reads_the_copies():
  cfg = _config()
  model, params = Transformer(cfg), init_params(cfg, jax.random.key(0))
  apply = jax.jit(model.apply)
  tokens = jnp.arange(6)[None] % cfg.vocab_size
  fast = decode_params(params, cfg)
  for layer, part, name in (("layers_1", "mlp", "down_nk"), ("layers_0", "attn", "qkv_nk")):
    zeroed = dict(fast[layer][part], **{name: 0 * fast[layer][part][name]})
    broken = dict(fast, **{layer: dict(fast[layer], **{part: zeroed})})
    assert not np.allclose(apply({"params": broken}, tokens), apply({"params": fast}, tokens))
  broken = dict(fast, lm_head_nk=jnp.zeros_like(fast["lm_head_nk"]))
  assert float(jnp.abs(apply({"params": broken}, tokens)).max()) == 0.0
