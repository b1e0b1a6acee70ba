"""rlkit/models/moe.py: the load-balancing loss equals Hugging Face's; padding adds nothing and counts nowhere;
replaying experts and combine weights reproduces the sampler's mixture; load statistics and flip rate by hand."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.models.moe import Routing, flip_rate, load_balancing_loss, load_stats, route
from rlkit.models.transformer import Transformer, TransformerConfig, init_params

MOE = TransformerConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_layers=2, num_heads=2,
                        num_kv_heads=1, head_dim=8, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=8)


@jax.jit
def _forward(params, tokens, **kw):
  return Transformer(MOE).apply({"params": params}, tokens, method=Transformer.forward, **kw)


def test_load_balancing_loss_equals_hugging_faces():
  torch = pytest.importorskip("torch")
  from transformers.models.qwen3_moe.modeling_qwen3_moe import load_balancing_loss_func
  logits = np.random.default_rng(0).standard_normal((2, 2, 5, 6)).astype(np.float32)    # [L, B, T, E]
  mask = np.array([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], bool)
  theirs = load_balancing_loss_func(tuple(torch.tensor(layer.reshape(10, 6)) for layer in logits), 6, 2,
                                    torch.tensor(mask))
  routing = route(jnp.asarray(logits.transpose(1, 2, 0, 3)), 2, False)                   # [B, T, L, ...]
  ours = load_balancing_loss(routing, jnp.asarray(mask)[..., None])
  np.testing.assert_allclose(float(ours), float(theirs), rtol=1e-6)
  uniform = Routing(jnp.array([[0, 1], [2, 3]]), jnp.full((2, 2), 0.5), jnp.full((2, 4), 0.25))
  assert float(load_balancing_loss(uniform)) == pytest.approx(2.0)        # k at perfect balance


def test_padding_adds_nothing_and_counts_nowhere():
  params = init_params(MOE, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (1, 6), 0, MOE.vocab_size)
  mask = jnp.array([[False, False, True, True, True, True]])
  padded = _forward(params, tokens, attention_mask=mask)
  alone = _forward(params, tokens[:, 2:])
  np.testing.assert_allclose(padded.logits[:, 2:], alone.logits, atol=1e-5)
  assert padded.routed_weights.shape == (1, 6, 2, 2) and padded.router_probs.shape == (1, 6, 2, 4)
  stats = load_stats(padded.routed_experts, 4, mask[..., None])
  want = load_stats(alone.routed_experts, 4)
  for name in stats:
    np.testing.assert_allclose(float(stats[name]), float(want[name]), rtol=1e-6)
  np.testing.assert_allclose(float(load_balancing_loss(
      Routing(padded.routed_experts, padded.routed_weights, padded.router_probs), mask[..., None])),
      float(load_balancing_loss(Routing(alone.routed_experts, alone.routed_weights, alone.router_probs))),
      rtol=1e-5)


def test_replaying_experts_and_weights_reproduces_the_mixture_under_a_changed_router():
  params = init_params(MOE, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(2), (2, 5), 0, MOE.vocab_size)
  sampled = _forward(params, tokens)
  moved = jax.tree_util.tree_map_with_path(          # a router that weighs the experts differently
      lambda p, x: x + 0.5 * jax.random.normal(jax.random.key(3), x.shape) if "router" in jax.tree_util.keystr(p)
      else x, params)
  experts_only = _forward(moved, tokens, routed_experts=sampled.routed_experts)
  both = _forward(moved, tokens, routed_experts=sampled.routed_experts, routed_weights=sampled.routed_weights)
  np.testing.assert_array_equal(np.asarray(both.logits), np.asarray(sampled.logits))      # the same mixture
  assert not np.allclose(experts_only.logits, sampled.logits)          # the weights came from the new router
  assert float(flip_rate(both.routed_experts, sampled.routed_experts)) == 0.0


def test_load_stats_and_flip_rate_by_hand():
  experts = jnp.array([[[0, 1]], [[0, 2]], [[0, 1]], [[1, 0]]])           # [T=4, L=1, k=2]
  stats = load_stats(experts, 4)                                           # counts 4, 3, 1, 0: mean 2
  np.testing.assert_allclose(float(stats["load_cv"]), np.std([4, 3, 1, 0]) / 2, rtol=1e-6)
  assert float(stats["peak_load"]) == 2.0 and float(stats["cold_fraction"]) == 0.25
  other = jnp.array([[[1, 0]], [[0, 3]], [[0, 1]], [[2, 3]]])              # same sets in rows 0 and 2
  assert float(flip_rate(experts, other)) == 0.5
  assert float(flip_rate(experts, other, jnp.array([[True], [False], [True], [False]]))) == 0.0


def test_upcycling_keeps_the_dense_function_and_noise_breaks_the_symmetry():
  from rlkit.models.upcycle import upcycle
  dense = MOE.replace(num_experts=0, num_experts_per_tok=0, moe_intermediate_size=0)
  params = init_params(dense, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(1), (2, 7), 0, dense.vocab_size)
  cfg, moe = upcycle(dense, params, 4, 2, jax.random.key(2))
  assert cfg.moe_layers == (0, 1) and moe["layers_0"]["moe"]["gate_up"].shape == (4, 16, 64)
  want = jax.jit(Transformer(dense).apply)({"params": params}, tokens)
  upcycled = jax.jit(Transformer(cfg).apply)
  np.testing.assert_allclose(upcycled({"params": moe}, tokens), want, atol=1e-5)
  _, noisy = upcycle(dense, params, 4, 2, jax.random.key(2), noise=0.1)
  assert not np.allclose(upcycled({"params": noisy}, tokens), want, atol=1e-5)
  with pytest.raises(ValueError, match="already has 4 experts"):
    upcycle(cfg, moe, 4, 2, jax.random.key(0))
