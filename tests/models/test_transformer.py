"""Properties of the Qwen3-style decoder: padding invariance, KV-cache equivalence, MoE routing."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.models.transformer import (Transformer, TransformerConfig, init_cache, init_params,
                                      positions_from_mask, route, to_cache)

DENSE = TransformerConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                          num_kv_heads=2, head_dim=8, rope_theta=10_000.0)
MOE = DENSE.replace(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=16)


def _jitted(model):
  """`model.apply` compiled whole, once per method and shapes (eagerly, every op is compiled on its own: these
  tests took 3-5x longer)."""
  return jax.jit(model.apply, static_argnames=("method",))


def _left_pad(tokens, pads):
  b, t = tokens.shape
  width = t + max(pads)
  out = np.zeros((b, width), np.int32)
  mask = np.zeros((b, width), bool)
  for i, n in enumerate(pads):
    out[i, width - t:] = tokens[i]
    mask[i, width - t:] = True
  return jnp.asarray(out), jnp.asarray(mask)


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_left_padding_does_not_change_real_token_logits(cfg):
  params = init_params(cfg, jax.random.key(0))
  model = Transformer(cfg)
  apply = _jitted(model)
  tokens = np.asarray(jax.random.randint(jax.random.key(1), (3, 7), 0, cfg.vocab_size))
  ref = apply({"params": params}, jnp.asarray(tokens))
  padded, mask = _left_pad(tokens, [0, 2, 5])
  out = apply({"params": params}, padded, attention_mask=mask)
  for i in range(3):
    np.testing.assert_allclose(out[i][np.asarray(mask[i])], ref[i], atol=1e-5)


def _decode_and_full(cfg, params):
  """(logits decoded through the cache token by token after a 5-token prefill, the full forward's logits, the
  real-token mask, the final cache) of two left-padded rows."""
  apply = _jitted(Transformer(cfg))
  tokens = np.asarray(jax.random.randint(jax.random.key(2), (2, 9), 0, cfg.vocab_size))
  padded, mask = _left_pad(tokens, [0, 3])
  full = apply({"params": params}, padded, attention_mask=mask)
  positions = positions_from_mask(mask)
  prefill = 5
  cache = init_cache(cfg, 2, padded.shape[1] + 2)   # spare slots must stay invisible
  out = apply({"params": params}, padded[:, :prefill], positions[:, :prefill], mask[:, :prefill], cache,
                    method=Transformer.forward)
  steps = [out.logits]
  cache = out.cache
  for t in range(prefill, padded.shape[1]):
    out = apply({"params": params}, padded[:, t:t + 1], positions[:, t:t + 1], mask[:, t:t + 1], cache,
                      method=Transformer.forward)
    cache = out.cache
    steps.append(out.logits)
  return jnp.concatenate(steps, axis=1), full, np.asarray(mask), cache


@pytest.mark.parametrize("cfg", [DENSE, MOE], ids=["dense", "moe"])
def test_kv_cache_decode_equals_full_forward_at_every_step(cfg):
  decoded, full, mask, cache = _decode_and_full(cfg, init_params(cfg, jax.random.key(0)))
  np.testing.assert_allclose(decoded[mask], full[mask], atol=1e-5)
  assert int(cache.index) == mask.shape[1]


@pytest.mark.parametrize("dtype,bound", [("bfloat16", 0.02), ("float8_e4m3fn", 0.2), ("float8_e5m2", 0.4)])
def test_a_low_precision_kv_cache_stores_less_and_tracks_the_full_forward(dtype, bound):
  """model.kv_cache_dtype: the cache holds keys and values in that dtype (a quarter of float32's bytes for
  float8), decoding reads them back, and the logits stay near the full forward's (relative to their spread),
  yet not equal to them: the cache's rounding is really there."""
  params = jax.tree.map(lambda x: x * 4.0 if x.ndim >= 2 else x, init_params(DENSE, jax.random.key(0)))
  decoded, full, mask, cache = _decode_and_full(DENSE.replace(kv_cache_dtype=dtype), params)
  assert cache.keys[0].dtype == jnp.dtype(dtype) and cache.values[0].dtype == jnp.dtype(dtype)
  assert cache.keys[0].nbytes * 4 == init_cache(DENSE, 2, cache.max_len).keys[0].nbytes * jnp.dtype(dtype).itemsize
  error = float(jnp.abs(decoded[mask] - full[mask]).max()) / float(full[mask].std())
  assert 0 < error < bound, error


def test_a_float8_cache_saturates_instead_of_overflowing():
  x = jnp.asarray([1e5, -1e5, 1.0, 0.1], jnp.float32)
  np.testing.assert_array_equal(np.asarray(to_cache(x, jnp.float8_e4m3fn).astype(jnp.float32)),
                                np.asarray(jnp.asarray([448.0, -448.0, 1.0, 0.1], jnp.float8_e4m3fn), np.float32))


def test_route_matches_definition_and_renormalises():
  logits = jnp.array([[2.0, 1.0, 0.5, -1.0]])
  r = route(logits, 2, norm_topk_prob=False)
  w, idx = r.weights, r.experts
  p = jax.nn.softmax(logits)
  np.testing.assert_allclose(r.probs, p, rtol=1e-6)
  np.testing.assert_array_equal(idx, [[0, 1]])
  np.testing.assert_allclose(w, p[:, :2], rtol=1e-6)
  w_norm = route(logits, 2, norm_topk_prob=True).weights
  np.testing.assert_allclose(w_norm.sum(-1), 1.0, rtol=1e-6)
  # Replay fixes the selection but recomputes the weights from the current router.
  given = route(logits, 2, norm_topk_prob=False, given=jnp.array([[3, 2]]))
  np.testing.assert_array_equal(given.experts, [[3, 2]])
  np.testing.assert_allclose(given.weights, p[:, [3, 2]], rtol=1e-6)
  # Weight replay fixes the combine weights as well.
  fixed = route(logits, 2, norm_topk_prob=False, given=jnp.array([[3, 2]]), given_weights=jnp.array([[0.7, 0.3]]))
  np.testing.assert_array_equal(fixed.weights, np.float32([[0.7, 0.3]]))


def _dense_moe_reference(params, cfg, x):
  """Every expert on every token, combined with the routing weights: the definition of the MoE layer."""
  logits = x @ params["router"]
  r = route(logits, cfg.num_experts_per_tok, cfg.norm_topk_prob)
  w, idx = r.weights, r.experts
  f = cfg.moe_intermediate_size
  out = jnp.zeros_like(x)
  for e in range(cfg.num_experts):
    gu = x @ params["gate_up"][e]
    y = (jax.nn.silu(gu[..., :f]) * gu[..., f:]) @ params["down"][e]
    weight = jnp.sum(jnp.where(idx == e, w, 0.0), axis=-1, keepdims=True)
    out = out + weight * y
  return out


def test_grouped_moe_equals_dense_definition():
  from rlkit.models.transformer import MoE
  x = jax.random.normal(jax.random.key(3), (2, 5, MOE.hidden_size))
  layer = MoE(MOE)
  variables = layer.init(jax.random.key(4), x)
  out, _, _ = jax.jit(layer.apply)(variables, x)
  np.testing.assert_allclose(out, _dense_moe_reference(variables["params"], MOE, x), atol=1e-5)


def test_routing_replay_reproduces_logits_and_routes_gradients_to_router():
  params = init_params(MOE, jax.random.key(0))
  model = Transformer(MOE)
  apply = _jitted(model)
  tokens = jax.random.randint(jax.random.key(5), (2, 6), 0, MOE.vocab_size)
  out = apply({"params": params}, tokens, method=Transformer.forward)
  assert out.routed_experts.shape == (2, 6, len(MOE.moe_layers), MOE.num_experts_per_tok)
  replay = apply({"params": params}, tokens, routed_experts=out.routed_experts, method=Transformer.forward)
  np.testing.assert_array_equal(replay.logits, out.logits)
  # Replaying a different routing changes the output: the given indices are really used.
  other = (out.routed_experts + 1) % MOE.num_experts
  changed = apply({"params": params}, tokens, routed_experts=other, method=Transformer.forward)
  assert not np.allclose(changed.logits, out.logits)
  grads = jax.jit(jax.grad(lambda p: model.apply({"params": p}, tokens, routed_experts=out.routed_experts,
                                                 method=Transformer.forward).logits.sum()))(params)
  assert float(jnp.abs(grads["layers_0"]["moe"]["router"]).sum()) > 0


def test_bf16_compute_tracks_f32():
  cfg = DENSE.replace(dtype="bfloat16")
  params = init_params(DENSE, jax.random.key(0))
  tokens = jax.random.randint(jax.random.key(6), (2, 8), 0, DENSE.vocab_size)
  ref = _jitted(Transformer(DENSE))({"params": params}, tokens)
  out = _jitted(Transformer(cfg))({"params": params}, tokens)
  assert out.dtype == jnp.float32
  np.testing.assert_allclose(out, ref, atol=0.05)
  assert not np.array_equal(out, ref)


def test_tied_embeddings_have_no_lm_head():
  cfg = DENSE.replace(tie_word_embeddings=True)
  params = init_params(cfg, jax.random.key(0))
  assert "lm_head" not in params
  tokens = jnp.array([[1, 2, 3]])
  apply = _jitted(Transformer(cfg))
  h = apply({"params": params}, tokens, method=Transformer.forward).hidden
  np.testing.assert_allclose(apply({"params": params}, tokens), h @ params["embedding"].T, atol=1e-5)


def test_config_errors_name_the_field():
  with pytest.raises(ValueError, match="num_kv_heads"):
    DENSE.replace(num_kv_heads=3)
  with pytest.raises(ValueError, match="num_experts_per_tok"):
    DENSE.replace(num_experts=4, num_experts_per_tok=5)
  with pytest.raises(ValueError, match="dtype"):
    DENSE.replace(dtype="float8")
  with pytest.raises(ValueError, match="kv_cache_dtype='int8'"):
    DENSE.replace(kv_cache_dtype="int8")
  with pytest.raises(ValueError, match=r"expert_quant_layers=\(2,\) names layers \[2\] outside \[0, 2\)"):
    MOE.replace(expert_quant="nvfp4", expert_quant_layers=(2,))
  with pytest.raises(ValueError, match="trace_record='lsb'"):
    MOE.replace(trace_record="lsb")
