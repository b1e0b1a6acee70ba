"""rlkit/quant/trace.py: guided rounding equals RTN under RTN's own hints, recovers the rollout's codes wherever
the two paths land in adjacent codes, never moves farther from them than RTN, and passes gradients straight
through."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.quant import fp4, trace
from tests.fast_compile import fast_compile


def _values(codes):
  return np.asarray(fp4.decode_e2m1(codes))


@pytest.mark.parametrize("fmt", ["nvfp4", "mxfp4"])
def test_hints_equal_to_rtns_decisions_give_rtn(fmt):
  x = jax.random.normal(jax.random.key(0), (6, 64)) * 3
  x = x.at[0, :8].set(jnp.asarray([0.0, 0.5, 1.0, 3.0, -6.0, 2.5, 1.25, 5.0]))    # grid points and ties
  codes, scales = trace.rtn_codes(x, fmt)
  guided = trace.guided_codes(x, trace.hint_of(codes, scales))
  np.testing.assert_array_equal(np.asarray(guided), np.asarray(codes))
  _, rtn_codes, rtn_scales = trace.fake_quant(x, fmt)
  np.testing.assert_array_equal(np.asarray(rtn_scales), np.asarray(scales))
  np.testing.assert_array_equal(np.asarray(rtn_codes), np.asarray(codes))
  assert float(trace.mismatch(guided, trace.hint_of(codes, scales))) == 0.0


def test_guided_rounding_follows_the_rollout_and_never_widens_the_gap():
  """The rollout sees bf16-rounded activations, the trainer the float32 ones: RTN disagrees with the rollout
  on some values; guided rounding (with the rollout's scales and bits) disagrees only where the two codes are
  not adjacent, and is never farther from the rollout's value than RTN's."""
  x = jax.random.normal(jax.random.key(1), (64, 128)) * 2
  roll = x.astype(jnp.bfloat16).astype(jnp.float32) + 0.02 * jax.random.normal(jax.random.key(2), x.shape)
  r_codes, r_scales = trace.rtn_codes(roll, "nvfp4")
  hint = trace.hint_of(r_codes, r_scales)
  rtn = fp4.encode_e2m1(x / jnp.repeat(r_scales, 16, axis=-1))            # the trainer's RTN, rollout scales
  guided = trace.guided_codes(x, hint)
  v_roll, v_rtn, v_guided = _values(r_codes), _values(rtn), _values(guided)
  assert (v_rtn != v_roll).mean() > 0.01                                  # there is a gap to close
  assert np.all(np.abs(v_guided - v_roll) <= np.abs(v_rtn - v_roll))
  assert (v_guided != v_roll).mean() <= 0.05 * (v_rtn != v_roll).mean()  # TRACE's target: <= 5% of RTN's
  assert float(trace.mismatch(guided, hint)) <= float(trace.mismatch(rtn, hint))


def test_straight_through_gradient_and_scales():
  x = jnp.linspace(-5.0, 5.0, 32).reshape(1, 32)
  g = jax.grad(lambda v: jnp.sum(trace.fake_quant(v, "nvfp4")[0] * 3.0))(x)
  np.testing.assert_array_equal(np.asarray(g), 3.0)
  s = trace.block_scales(x, "nvfp4")                 # per token: the largest block scale is 448 * t, t = 5/2688
  np.testing.assert_allclose(float(s.max()), 5.0 / 6, rtol=1e-6)
  with pytest.raises(ValueError, match="not a multiple of 32"):
    trace.block_scales(jnp.ones((2, 48)), "mxfp4")


@fast_compile()
def test_an_fp4_moe_trainer_follows_its_bf16_rollout():
  """A float32 trainer forward of an FP4 MoE against its bf16 sampler on the FP4 export: RTN disagrees with the
  sampler's FP4 codes on some values; with the sampler's hints (and routing) the trainer's codes agree, and its
  logits are closer to the sampler's. With its own codes as hints, the trainer's forward is RTN's exactly."""
  from rlkit.models.transformer import Transformer, TransformerConfig, init_params
  from rlkit.sync import export_params
  cfg = TransformerConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                          num_kv_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=16, expert_quant="nvfp4")
  params = jax.tree.map(lambda x: x * 8.0 if x.ndim >= 2 else x, init_params(cfg, jax.random.key(0)))
  sampler = Transformer(cfg.replace(dtype="bfloat16", param_dtype="bfloat16"))
  tokens = jax.random.randint(jax.random.key(1), (4, 12), 0, cfg.vocab_size)
  fwd = jax.jit(lambda m, p, **kw: m.apply({"params": p}, tokens, method=Transformer.forward, **kw),
                static_argnums=0)
  rollout = fwd(sampler, export_params(params, "bfloat16", "nvfp4_experts"))
  assert set(rollout.trace) == {"trace_x_codes", "trace_x_scales", "trace_h_codes", "trace_h_scales"}
  assert rollout.trace["trace_h_codes"].shape == (4, 12, 2, 2, 16)            # [B, T, L_moe, k, F]
  model, routed = Transformer(cfg), rollout.routed_experts
  rtn = fwd(model, params, routed_experts=routed)
  guided = fwd(model, params, routed_experts=routed, trace_hints=rollout.trace)

  def mismatch(out):
    return np.mean([np.mean(np.asarray(out.trace[n]) != np.asarray(rollout.trace[n]))
                    for n in ("trace_x_codes", "trace_h_codes")])
  assert mismatch(rtn) > 0.005 and mismatch(guided) <= 0.05 * mismatch(rtn)
  gap = lambda out: float(jnp.abs(out.logits - rollout.logits).mean())        # noqa: E731
  assert gap(guided) < gap(rtn)
  again = fwd(model, params, routed_experts=routed, trace_hints=rtn.trace)
  np.testing.assert_array_equal(np.asarray(again.logits), np.asarray(rtn.logits))


def test_the_packed_hint_is_one_bit_per_value():
  """trace_record='bits': each code's LSB, 8 to a byte (value 8i + j in bit j of byte i); its hint is the whole
  codes' hint, at 1/8 of their bytes."""
  codes = jax.random.randint(jax.random.key(3), (3, 5, 32), 0, 16).astype(jnp.uint8)
  scales = jax.random.uniform(jax.random.key(4), (3, 5, 2))
  packed = trace.pack_bits(codes)
  assert packed.shape == (3, 5, 4) and packed.dtype == jnp.uint8 and packed.nbytes * 8 == codes.nbytes
  assert int(trace.pack_bits(jnp.asarray([[1, 0, 0, 3, 0, 0, 0, 15]], jnp.uint8))[0, 0]) == 0b10001001
  np.testing.assert_array_equal(np.asarray(trace.unpack_bits(packed)), np.asarray(codes & 1))
  bits, full = (trace.hint_from(trace.record(codes, scales, kind)) for kind in ("bits", "codes"))
  for a, b in zip(bits, full):
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))


@fast_compile()
def test_fp4_experts_on_a_layer_subset_with_the_one_bit_record():
  """expert_quant_layers=(1,) with trace_record='bits': only layer 1's experts are FP4 (in the sampler's export
  with sync layers (1,), and in the model), the rollout records that layer's packed LSBs and scales; guided by
  them the trainer computes what the whole-code record gives, its LSBs agree with the rollout's, RTN's do not."""
  from rlkit.models.matmul import QuantizedWeight
  from rlkit.models.transformer import Transformer, TransformerConfig, init_params
  from rlkit.sync import export_params
  from rlkit.train.policy import trace_mismatch
  cfg = TransformerConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                          num_kv_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                          moe_intermediate_size=16, expert_quant="nvfp4", expert_quant_layers=(1,),
                          trace_record="bits")
  assert cfg.layer_config(0).expert_quant == "" and cfg.layer_config(1).expert_quant == "nvfp4"
  params = jax.tree.map(lambda x: x * 8.0 if x.ndim >= 2 else x, init_params(cfg, jax.random.key(0)))
  export = export_params(params, "bfloat16", "nvfp4_experts", (1,))
  is_q = lambda x: isinstance(x, QuantizedWeight)                                   # noqa: E731
  assert is_q(export["layers_1"]["moe"]["gate_up"]) and not is_q(export["layers_0"]["moe"]["gate_up"])
  tokens = jax.random.randint(jax.random.key(1), (4, 12), 0, cfg.vocab_size)
  fwd = jax.jit(lambda m, p, **kw: m.apply({"params": p}, tokens, method=Transformer.forward, **kw),
                static_argnums=0)
  bf16 = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
  rollout = fwd(Transformer(bf16), export)
  assert {n: a.shape for n, a in rollout.trace.items()} == {
      "trace_x_bits": (4, 12, 1, 4), "trace_x_scales": (4, 12, 1, 2),          # [B, T, L_fp4, D/8], [.., D/16]
      "trace_h_bits": (4, 12, 1, 2, 2), "trace_h_scales": (4, 12, 1, 2, 1)}    # [B, T, L_fp4, k, F/8]
  codes = fwd(Transformer(bf16.replace(trace_record="codes")), export).trace
  model, routed = Transformer(cfg), rollout.routed_experts
  rtn = fwd(model, params, routed_experts=routed)
  guided = fwd(model, params, routed_experts=routed, trace_hints=rollout.trace)
  by_codes = fwd(Transformer(cfg.replace(trace_record="codes")), params, routed_experts=routed, trace_hints=codes)
  np.testing.assert_array_equal(np.asarray(guided.logits), np.asarray(by_codes.logits))
  mask = jnp.ones((4, 12, 1), bool)
  assert float(trace_mismatch(rtn.trace, rollout.trace, mask, "bits")) > 0.005
  assert float(trace_mismatch(guided.trace, rollout.trace, mask, "bits")) <= 0.001
