"""FP4 sampler copies (rlkit/quant/fp4_weight.py, the mxfp4/nvfp4 quantizers): the matmul hook and the experts'
grouped matmul equal the dequantized einsum and ragged_dot; the export of a MoE model quantizes what each
quantizer names; a sampler on the FP4 copy runs; the copy's parts are laid out on a mesh."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.models.matmul import expert_matmul, weight_matmul
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.parallel.mesh import make_mesh
from rlkit.parallel.rules import path_str, shard_params
from rlkit.quant import fp4
from rlkit.quant.fp4_weight import FP4Weight, quantize_fp4_experts, quantize_fp4_kernel
from rlkit.rollout.sampler import SamplingConfig, generate
from rlkit.sync import export_params
from tests.fast_compile import fast_compile

MOE = TransformerConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, num_experts=4, num_experts_per_tok=2,
                        moe_intermediate_size=16, mlp_only_layers=(0,))
FORMS = {  # eq, x shape, kernel shape, its input axes, the view the model multiplies by (transformer.py)
    "qkv": ("btd,df->btf", (2, 5, 32), (32, 2, 3, 4), 1, lambda w: w.reshape(32, -1)),
    "o": ("btf,fd->btd", (2, 5, 24), (2, 3, 4, 8), 3, lambda w: w.reshape(24, 8)),
    "gate_up": ("btd,dcf->btcf", (2, 5, 32), (32, 2, 12), 1, lambda w: w),
    "lm_head": ("btd,dv->btv", (2, 5, 40), (40, 16), 1, lambda w: w),
}


@pytest.mark.parametrize("form,fmt", [("qkv", "mxfp4"), ("o", "nvfp4"), ("gate_up", "nvfp4"), ("lm_head", "mxfp4")])
def test_the_fp4_matmul_hook_equals_the_dequantized_einsum(form, fmt):
  eq, xs, ws, k, view = FORMS[form]
  q = quantize_fp4_kernel(jax.random.normal(jax.random.key(0), ws), k, "float32", fmt)
  w = view(q)
  assert isinstance(w, FP4Weight)                    # the model's reshapes stay lazy
  x = jax.random.normal(jax.random.key(1), xs)
  np.testing.assert_array_equal(np.asarray(w.dequantize()), view(np.asarray(q.dequantize())))
  dense = jnp.einsum(eq, x, w.dequantize(), preferred_element_type=jnp.float32)
  np.testing.assert_allclose(jax.jit(lambda x, w: weight_matmul(eq, x, w))(x, w), dense, rtol=1e-5, atol=1e-5)
  if form == "o":                                    # the Pallas kernel behind the same hook (merged inputs)
    interpreted = w.replace(impl="pallas_interpret")
    np.testing.assert_allclose(weight_matmul(eq, x, interpreted), dense, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("form,fmt", [("qkv", "nvfp4"), ("o", "mxfp4")])
def test_w4a4_rounds_the_activations_per_token_along_the_contraction(form, fmt):
  """act: x flattened to [tokens, K], each token's K features rounded to FP4 (its own block scales; K = 24 of
  `o` padded with zeros to a 32-block), then the FP4 matmul: equal to the einsum of those rounded activations
  and the dequantized kernel; different from weight-only (the activations moved)."""
  eq, xs, ws, k, view = FORMS[form]
  q = quantize_fp4_kernel(jax.random.normal(jax.random.key(0), ws), k, "float32", fmt, act=True)
  w = view(q)
  assert isinstance(w, FP4Weight) and w.act == fmt
  x = jax.random.normal(jax.random.key(1), xs)
  x_q = _rounded(x, fmt)
  assert np.unique(np.asarray(x_q)).size < np.unique(np.asarray(x)).size      # rounded to a coarse grid
  expected = jnp.einsum(eq, x_q, w.dequantize(), preferred_element_type=jnp.float32)
  got = jax.jit(lambda x, w: weight_matmul(eq, x, w))(x, w)
  np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
  weight_only = weight_matmul(eq, x, w.replace(act=""))
  assert float(jnp.max(jnp.abs(got - weight_only))) > 1e-2
  # A kernel contracted on its trailing axis (the dequantized fallback, no [M, K] fast path): rounded the same.
  other = quantize_fp4_kernel(jax.random.normal(jax.random.key(2), (8, 24)), 1, "float32", fmt, act=True)
  x24 = x[..., :24]
  got = weight_matmul("btf,df->btd", x24, other)
  np.testing.assert_allclose(got, jnp.einsum("btf,df->btd", _rounded(x24, fmt), other.dequantize()),
                             rtol=1e-5, atol=1e-5)
  assert float(jnp.max(jnp.abs(got - weight_matmul("btf,df->btd", x24, other.replace(act=""))))) > 1e-2


def _rounded(x, fmt):
  """x with each token's last-axis features rounded to FP4 `fmt` in blocks (zero-padded to whole blocks)."""
  from rlkit.quant.trace import fake_quant
  pad = -x.shape[-1] % fp4.BLOCK[fmt]
  flat = jnp.pad(x, ((0, 0),) * (x.ndim - 1) + ((0, pad),)).reshape(-1, x.shape[-1] + pad)
  return fake_quant(flat, fmt)[0][:, :x.shape[-1]].reshape(x.shape)


def test_the_experts_hook_and_the_dequantized_layout():
  w = jax.random.normal(jax.random.key(0), (4, 32, 6))
  q = quantize_fp4_experts(w, "float32", "nvfp4")
  assert q.fp4.codes.shape == (16, 4, 6) and q.fp4.scales.shape == (2, 4, 6)      # [D/2, E, N], blocks on D
  deq = np.asarray(q.dequantize())
  assert deq.shape == (4, 32, 6)
  for e in range(4):      # each expert within FP4's error of its own kernel (half a step: 1/6 of a block's amax)
    err = np.abs(deq[e] - np.asarray(w[e])).reshape(2, 16, 6).max(axis=1)
    assert np.all(err <= np.abs(np.asarray(w[e])).reshape(2, 16, 6).max(axis=1) / 6 * 1.07)
  x = jax.random.normal(jax.random.key(1), (7, 32))
  groups = jnp.array([2, 0, 4, 1], jnp.int32)
  np.testing.assert_allclose(expert_matmul(x, q, groups),
                             jax.lax.ragged_dot(x, q.dequantize(), groups, preferred_element_type=jnp.float32),
                             rtol=1e-6, atol=1e-6)


@functools.lru_cache(maxsize=1)
def _params():
  p = init_params(MOE, jax.random.key(0))
  return jax.tree.map(lambda x: x * 8.0 if x.ndim >= 2 else x, p)      # logits spanning a few nats


def _leaves(tree):
  is_q = lambda x: isinstance(x, FP4Weight)          # noqa: E731
  return {path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_q)[0]}


@pytest.mark.parametrize("quantizer,dense_too", [("nvfp4", True), ("mxfp4_experts", False), ("mxfp4_w4a4", True)])
def test_the_export_quantizes_what_the_quantizer_names(quantizer, dense_too):
  out = _leaves(export_params(_params(), "bfloat16", quantizer))
  assert isinstance(out["layers_1/moe/gate_up"], FP4Weight) and isinstance(out["layers_1/moe/down"], FP4Weight)
  assert out["layers_1/moe/router"].dtype == jnp.bfloat16                     # routers stay unquantized
  assert isinstance(out["layers_0/mlp/gate_up"], FP4Weight) == dense_too
  assert isinstance(out["layers_1/attn/qkv"], FP4Weight) == dense_too
  assert out["embedding"].dtype == jnp.bfloat16


def test_the_sampler_runs_on_the_fp4_copy():
  """Teacher-forced log-probs of the FP4 sampler's tokens against float32: finite, within a bounded gap on this
  tiny model (FP4 keeps 1 mantissa bit; the quantizer tests bound int8 and fp8 against bf16)."""
  bf16 = MOE.replace(param_dtype="bfloat16", dtype="bfloat16")
  prompt = jax.random.randint(jax.random.key(1), (4, 5), 0, MOE.vocab_size)
  ro = generate(Transformer(bf16), export_params(_params(), "bfloat16", "nvfp4"), prompt,
                jnp.ones_like(prompt, bool), jax.random.key(7), SamplingConfig(max_new_tokens=6))
  seq = jnp.concatenate([prompt, ro.response], axis=1)
  logp = jax.nn.log_softmax(jax.jit(Transformer(MOE).apply)({"params": _params()}, seq)[:, 4:-1])
  gap = np.abs(np.asarray(jnp.take_along_axis(logp, ro.response[..., None], -1)[..., 0] - ro.logprobs))
  assert np.all(np.isfinite(gap)) and 0 < gap.mean() < 5.0


def test_the_sampler_rounds_the_activations_of_a_w4a4_copy():
  """On CPU the sampler multiplies by features-major copies of the dense weights (rlkit/models/decode_layout.py);
  a W4A4 kernel must keep its own matmul there, or its activations go unrounded: the same draws on the W4A4 copy
  give other log-probs than on the weight-only copy."""
  bf16 = MOE.replace(param_dtype="bfloat16", dtype="bfloat16")
  prompt = jax.random.randint(jax.random.key(1), (4, 5), 0, MOE.vocab_size)
  logprobs = {q: generate(Transformer(bf16), export_params(_params(), "bfloat16", q), prompt,
                          jnp.ones_like(prompt, bool), jax.random.key(7), SamplingConfig(max_new_tokens=6)).logprobs
              for q in ("nvfp4", "nvfp4_w4a4")}
  gap = np.abs(np.asarray(logprobs["nvfp4"]) - np.asarray(logprobs["nvfp4_w4a4"]))
  assert np.all(np.isfinite(gap)) and gap.max() > 1e-3


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices: tests/conftest.py")
def test_the_fp4_copy_is_laid_out_on_a_sampler_mesh():
  """export_shardings of an FP4 copy: codes and scales follow the kernel's split of its stored layout ([K/2, ...]
  dense; [D/2, E, N] experts, the expert axis keeping its split), the tensor scale replicated; the export lands
  on them (the sync backends send these leaves like any other: the int8/fp8 sync tests)."""
  from jax.sharding import NamedSharding, PartitionSpec as P
  from rlkit.quant.quantizers import export_shardings
  mesh = make_mesh({"data": 2, "fsdp": 4})
  params = shard_params(_params(), mesh)
  exported = jax.eval_shape(lambda p: export_params(p, "bfloat16", "nvfp4"), params)
  shardings = export_shardings(jax.tree.map(lambda x: x.sharding, params), exported)
  qkv, experts = _leaves(shardings)["layers_1/attn/qkv"], _leaves(shardings)["layers_1/moe/gate_up"]
  kernel_spec = tuple(params["layers_1"]["attn"]["qkv"].sharding.spec)
  assert tuple(qkv.fp4.codes.spec)[:1] == kernel_spec[:1] and qkv.fp4.tensor_scale.spec == P()
  expert_spec = tuple(params["layers_1"]["moe"]["gate_up"].sharding.spec) + (None,) * 3
  assert tuple(experts.fp4.codes.spec)[1:2] == expert_spec[:1]                       # E: the kernel's own split
  placed = jax.device_put(export_params(params, "bfloat16", "nvfp4"), shardings)
  assert all(isinstance(x.sharding, NamedSharding) for x in jax.tree.leaves(placed))


def test_the_experts_through_the_interpreted_kernel_equal_ragged_dot():
  """Decode-sized expert matmuls through the Pallas kernel (each row times every expert, its own kept) equal the
  dequantized ragged_dot, an expert with no rows included (the MoE's groups always cover every row)."""
  q = quantize_fp4_experts(jax.random.normal(jax.random.key(0), (4, 32, 6)), "float32", "mxfp4")
  x = jax.random.normal(jax.random.key(1), (7, 32))
  groups = jnp.array([2, 0, 4, 1], jnp.int32)
  np.testing.assert_allclose(q.replace(impl="pallas_interpret").ragged_matmul(x, groups),
                             jax.lax.ragged_dot(x, q.dequantize(), groups, preferred_element_type=jnp.float32),
                             rtol=1e-5, atol=1e-5)


@pytest.mark.slow   # the script's CPU check (~18 s); benchmarks/gpu_checks.sh runs it at size 1b on a GPU
@fast_compile()
def test_the_fp4_sampler_benchmark_runs_its_three_sides(capsys):
  """benchmarks/fp4_sampler.py on its tiny MoE (the GPU measurement runs --size 1b): every side samples finite
  log-probs, and the FP4 copy stores the experts in about 0.28 of bf16's bytes (4 bits + an E4M3 scale per 16
  values, against 16 bits)."""
  import json
  from benchmarks import fp4_sampler
  line = fp4_sampler.main(["--batch", "2", "--new", "4", "--reps", "1"])
  assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == line
  assert {"bf16_tokens_s", "fp4_weights_tokens_s", "fp4_trace_tokens_s", "fp4_trace_vs_bf16"} <= set(line)
  assert 0.27 < line["expert_bytes_fp4"] / line["expert_bytes_bf16"] < 0.29
