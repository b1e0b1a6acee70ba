"""The quantizer seam (rlkit/quant/quantizers.py): the QUANTIZERS registry, `bf16` equal to the bfloat16 export
of before bit for bit, the int8 and fp8 formats' round-trip bounds and layout ops, the sampler computing with
int8 or fp8 weights (through the weight-matmul hook and through the CPU decode layout) close to float32, and the
sampler copy synced with int8 weights (dense and sparse_delta, onto another mesh, bit-exact against a dense
reshard) and with fp8 weights (sparse_delta)."""
import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from rlkit.core.errors import ConfigError
from rlkit.models import lora
from rlkit.models.matmul import QuantizedWeight, weight_matmul
from rlkit.models.transformer import Transformer, TransformerConfig, init_params
from rlkit.parallel.mesh import make_mesh
from rlkit.parallel.rules import shard_params
from rlkit.quant.fp8 import FP8_MAX, quantize_fp8
from rlkit.quant.int8 import ChannelScaledWeight, quantize_int8
from rlkit.quant.quantizers import QUANTIZERS, Quantizer, export_shardings, kernel_inputs
from rlkit.rewards import RewardOutput, register_reward
from rlkit.rollout.sampler import SamplingConfig, generate
from rlkit.sync import SyncConfig, export_params
from rlkit.train import weight_sync
from tests.fast_compile import fast_compile

CFG = TransformerConfig(vocab_size=40, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4,
                        num_kv_heads=2, head_dim=8, tie_word_embeddings=False)
BF16 = CFG.replace(param_dtype="bfloat16", dtype="bfloat16")
KERNELS = ("layers_0/attn/qkv", "layers_0/attn/o", "layers_0/mlp/gate_up", "layers_0/mlp/down",
           "layers_1/attn/qkv", "layers_1/attn/o", "layers_1/mlp/gate_up", "layers_1/mlp/down", "lm_head")


@functools.lru_cache(maxsize=1)
def _params():
  """The tiny model's params, scaled so that its logits span a few nats (at init they are all near 0, and
  any two weight formats would agree)."""
  p = init_params(CFG, jax.random.key(0))
  return jax.tree_util.tree_map_with_path(
      lambda path, x: x * (8.0 if kernel_inputs(path) or "embedding" in str(path) else 1.0), p)


def _bits(x):
  x = np.asarray(x)
  return x.view({1: np.uint8, 2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def _paths(tree, is_leaf=None):
  from rlkit.parallel.rules import path_str
  return {path_str(p): x for p, x in jax.tree_util.tree_flatten_with_path(tree, is_leaf=is_leaf)[0]}


def test_the_registry():
  assert {"none", "bf16", "int8", "fp8"} <= set(QUANTIZERS.names())
  with pytest.raises(ValueError, match=r"sync.quantizer='int4' is not a known quantizer; choose one of: .*int8"):
    SyncConfig(quantizer="int4")
  with pytest.raises(ValueError, match="already registered"):
    QUANTIZERS.add("int8", Quantizer(None))
  from rlkit.train.catalog import STAGES
  from rlkit.train.rl_config import rl_defaults
  cfg = rl_defaults()
  assert cfg.sync.quantizer == "none"
  cfg.sync.kind, cfg.sync.quantizer = "dense", "fp3"
  with pytest.raises(ConfigError, match=r"rl.sync: sync.quantizer='fp3'.*choose one of") as e:
    STAGES.get("rl").validate(cfg, "rl")
  assert all(name in str(e.value) for name in ("bf16", "fp8", "int8", "none"))
  cfg.sync.kind, cfg.sync.quantizer = "", "int8"      # no sampler copy to format: a dead setting, refused
  with pytest.raises(ConfigError, match=r"rl.sync.quantizer='int8' formats the sampler's own copy.*rl.sync.kind"):
    STAGES.get("rl").validate(cfg, "rl")
  # The kernels a quantizer converts: the projections and an untied LM head, nothing else.
  assert sorted(p for p in _paths(_params()) if kernel_inputs(p.split("/"))) == sorted(KERNELS)


def test_bf16_is_the_bfloat16_export_of_before_bit_for_bit():
  """`bf16` (and `none`) with sync.dtype='bfloat16' export what the cast of every floating leaf exported, on a
  tree with unmerged LoRA adapters and an integer leaf; `none` with dtype '' is the master as is; `bf16` with
  dtype 'float32' casts the kernels only."""
  section = lora.lora_defaults()
  section.rank = 2
  params = lora.add_adapters(_params(), section, jax.random.key(3))
  params["step"] = jnp.arange(3, dtype=jnp.int32)
  # The export of before the registry, verbatim (rlkit/sync/backends.py's `_sync_dtype` cast, now removed).
  before = jax.tree.map(lambda x: x.astype(jnp.dtype("bfloat16") if jnp.issubdtype(x.dtype, jnp.floating)
                                           else jnp.dtype(x.dtype)), params)
  for quantizer in ("bf16", "none"):
    out = export_params(params, "bfloat16", quantizer)
    assert jax.tree.structure(out) == jax.tree.structure(before)
    for a, b in zip(jax.tree.leaves(out), jax.tree.leaves(before)):
      assert a.dtype == b.dtype
      np.testing.assert_array_equal(_bits(a), _bits(b))
  for a, b in zip(jax.tree.leaves(export_params(params, "", "none")), jax.tree.leaves(params)):
    np.testing.assert_array_equal(_bits(a), _bits(b))
  mixed = _paths(export_params(params, "float32", "bf16"))
  assert {p for p, x in mixed.items() if x.dtype == jnp.bfloat16} == set(KERNELS)


def test_int8_round_trip_error_is_within_half_a_step():
  """|W - c·s| <= s/2 for every kernel (s: its channel's scale), every channel reaches code ±127, the scale
  broadcasts over the contracted axes only, and an all-zero channel stays exactly zero."""
  params = _params()
  exported = _paths(export_params(params, "bfloat16", "int8"), is_leaf=lambda x: isinstance(x, QuantizedWeight))
  for path, w in _paths(params).items():
    q = exported[path]
    if path not in KERNELS:
      assert not isinstance(q, QuantizedWeight) and q.dtype == jnp.bfloat16
      continue
    k = kernel_inputs(path.split("/"))
    assert q.codes.dtype == jnp.int8 and q.scale.shape == (1,) * k + w.shape[k:] and q.dtype == jnp.bfloat16
    codes, scale = np.asarray(q.codes, np.int32), np.asarray(q.scale)
    assert np.abs(codes).max() <= 127 and np.all(np.abs(codes).max(axis=tuple(range(k))) == 127)
    error = np.abs(np.asarray(w) - codes * scale)
    assert np.all(error <= scale / 2 * (1 + 1e-6)), path
    assert error.max() > 0, path
  z = quantize_int8(jnp.zeros((4, 3)).at[:, 1].set(jnp.arange(4.0)), 1)
  assert np.array_equal(np.asarray(z.scale)[0, [0, 2]], [1.0, 1.0])
  assert not np.asarray(z.dequantize())[:, [0, 2]].any() and np.asarray(z.codes)[3, 1] == 127


def test_fp8_round_trip_error_is_within_half_an_e4m3_step():
  """Codes are float8_e4m3fn with |W - c·s| <= s · 2^-4 |c| (half a step of 3 mantissa bits) where c is a normal
  E4M3 number and <= s · 2^-10 (half the subnormal step) below; every channel reaches code ±448 and the scale
  broadcasts over the contracted axes only; a quotient that would round past 448 stays 448 (not NaN); an
  all-zero channel stays exactly zero."""
  params = _params()
  exported = _paths(export_params(params, "bfloat16", "fp8"), is_leaf=lambda x: isinstance(x, QuantizedWeight))
  for path, w in _paths(params).items():
    q = exported[path]
    if path not in KERNELS:
      assert not isinstance(q, QuantizedWeight) and q.dtype == jnp.bfloat16
      continue
    k = kernel_inputs(path.split("/"))
    assert q.codes.dtype == jnp.float8_e4m3fn and q.scale.shape == (1,) * k + w.shape[k:] and q.dtype == jnp.bfloat16
    codes, scale = np.asarray(q.codes, np.float32), np.asarray(q.scale)
    assert np.all(np.isfinite(codes)) and np.all(np.abs(codes).max(axis=tuple(range(k))) == FP8_MAX)
    bound = np.where(np.abs(codes) >= 2.0 ** -6, 2.0 ** -4 * np.abs(codes), 2.0 ** -10) * scale
    error = np.abs(np.asarray(w) - codes * scale)
    assert np.all(error <= bound * (1 + 1e-6)), path
    assert error.max() > 0, path
    # The dequantized kernel is the per-channel rounding of W, not a cast: the relative error is E4M3's.
    rel = np.linalg.norm(np.asarray(w) - codes * scale) / np.linalg.norm(np.asarray(w))
    assert 1e-3 < rel < 2 ** -4, (path, rel)
  z = quantize_fp8(jnp.zeros((4, 3)).at[:, 1].set(jnp.array([1.0, 2.0, 3.0, 3.1])), 1)
  assert np.array_equal(np.asarray(z.scale)[0, [0, 2]], [1.0, 1.0])
  assert not np.asarray(z.dequantize())[:, [0, 2]].any() and float(z.codes[3, 1]) == FP8_MAX
  edge = quantize_fp8(jnp.array([[1.0], [1.0 - 1e-7]]), 1)     # w / s can round to just above 448
  assert np.all(np.isfinite(np.asarray(edge.codes, np.float32)))


FORMS = {  # eq, x shape, kernel shape, its input axes, the view the model multiplies by (transformer.py)
    "qkv": ("btd,df->btf", (2, 5, 8), (8, 2, 3, 4), 1, lambda w: w.reshape(8, -1)),
    "o": ("btf,fd->btd", (2, 5, 24), (2, 3, 4, 8), 3, lambda w: w.reshape(24, 8)),
    "gate_up": ("btd,dcf->btcf", (2, 5, 8), (8, 2, 12), 1, lambda w: w),
    "down": ("btf,fd->btd", (2, 5, 12), (12, 8), 1, lambda w: w),
    "lm_head": ("btd,dv->btv", (2, 5, 8), (8, 32), 1, lambda w: w),
}


@pytest.mark.parametrize("quantize", [quantize_int8, quantize_fp8], ids=["int8", "fp8"])
@pytest.mark.parametrize("form", sorted(FORMS))
def test_the_channel_scaled_matmul_hook_equals_the_dequantized_einsum(form, quantize):
  """weight_matmul with a ChannelScaledWeight of int8 or fp8 codes (its scale applied after the contraction)
  against the einsum with the dequantized kernel, after the reshape the model applies (lazy: the codes and
  scales reshaped)."""
  eq, xs, ws, k, view = FORMS[form]
  q = quantize(jax.random.normal(jax.random.key(0), ws), k)
  x = jax.random.normal(jax.random.key(1), xs)
  w = view(q).astype(jnp.float32)
  assert isinstance(w, ChannelScaledWeight) and w.scale.shape == (1,) + w.shape[1:]
  np.testing.assert_array_equal(np.asarray(w.dequantize()), view(np.asarray(q.dequantize())))
  ours = jax.jit(lambda x, w: weight_matmul(eq, x, w))(x, w)
  np.testing.assert_allclose(ours, jnp.einsum(eq, x, w.dequantize(), preferred_element_type=jnp.float32),
                             rtol=1e-5, atol=1e-5)


def test_other_consumers_read_the_dequantized_array():
  """The decode layout's features-major copy (a transpose, then `jnp.einsum` weight first) reads the kernel
  through `__jax_array__`; a reshape that merges input with output axes, and a matmul that contracts a
  channel axis (the scale would not factor out), fall back to the dequantized array too."""
  w = jax.random.normal(jax.random.key(0), (8, 2, 12))
  q = quantize_int8(w, 1)
  x = jax.random.normal(jax.random.key(1), (3, 8))
  nk = q.reshape(8, -1).T.astype(jnp.bfloat16)
  assert isinstance(nk, ChannelScaledWeight) and nk.shape == (24, 8) and nk.scale.shape == (24, 1)
  dense = q.dequantize().reshape(8, -1).T.astype(jnp.bfloat16)
  np.testing.assert_array_equal(np.asarray(jnp.einsum("fd,td->ft", nk, x.astype(jnp.bfloat16))),
                                np.asarray(jnp.einsum("fd,td->ft", dense, x.astype(jnp.bfloat16))))
  merged = q.reshape(-1)
  assert not isinstance(merged, QuantizedWeight)
  np.testing.assert_array_equal(np.asarray(merged), np.asarray(q.dequantize()).reshape(-1))
  y = jax.random.normal(jax.random.key(2), (3, 24))
  np.testing.assert_allclose(weight_matmul("tf,df->td", y, q.reshape(8, 24)),
                             jnp.einsum("tf,df->td", y, q.dequantize().reshape(8, 24)), rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------------------------- the sampler

@functools.partial(jax.jit, static_argnums=0)
def _forward(cfg, params, tokens):
  return Transformer(cfg).apply({"params": params}, tokens)


def _teacher_forced_gap(model, params, prompt, cfg):
  """|sampler log-prob - float32 log-prob| of each token `generate` draws with (model, params)."""
  rollout = generate(model, params, prompt, jnp.ones_like(prompt, bool), jax.random.key(7), cfg)
  seq = jnp.concatenate([prompt, rollout.response], axis=1)
  logp = jax.nn.log_softmax(_forward(CFG, _params(), seq)[:, prompt.shape[1] - 1:-1])
  return np.abs(np.asarray(jnp.take_along_axis(logp, rollout.response[..., None], -1)[..., 0] - rollout.logprobs))


def test_the_sampler_with_int8_or_fp8_weights_is_close_to_float32():
  """A bf16 sampler module on the int8 or fp8 export: its logits (through the weight-matmul hook) and the
  log-probs `generate` reports (through the CPU decode layout) stay within a small multiple of the bf16 copy's
  distance from float32 (measured: int8 about 2x, fp8 about 5x: 0.31 on logits within ±3), fp8 the farthest
  (3 mantissa bits against int8's 7)."""
  params = _params()
  tokens = jax.random.randint(jax.random.key(1), (4, 12), 0, CFG.vocab_size)
  f32 = _forward(CFG, params, tokens)
  error = {q: float(jnp.abs(_forward(BF16, export_params(params, "bfloat16", q), tokens) - f32).max())
           for q in ("bf16", "int8", "fp8")}
  assert 0 < error["bf16"] < error["int8"] < 4 * error["bf16"] and error["int8"] < 0.05 * float(jnp.abs(f32).max())
  assert error["int8"] < error["fp8"] < 8 * error["bf16"] and error["fp8"] < 0.15 * float(jnp.abs(f32).max())
  cfg = SamplingConfig(max_new_tokens=6)
  gaps = {q: _teacher_forced_gap(Transformer(BF16), export_params(params, "bfloat16", q), tokens[:, :5], cfg)
          for q in ("bf16", "int8", "fp8")}
  assert _teacher_forced_gap(Transformer(CFG), params, tokens[:, :5], cfg).max() < 1e-5     # the measure itself
  assert 0 < gaps["int8"].mean() < 4 * gaps["bf16"].mean() and gaps["int8"].max() < 0.2
  assert gaps["int8"].mean() < gaps["fp8"].mean() < 8 * gaps["bf16"].mean() and gaps["fp8"].max() < 0.3


# ------------------------------------------------------------------------------------------- the sync path

@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices: tests/conftest.py")
@pytest.mark.parametrize("quantizer, kind", [("int8", "sparse_delta"), ("fp8", "sparse_delta")])
def test_the_sampler_copy_syncs_quantized_weights_onto_its_mesh(quantizer, kind):
  """rl.sync with quantizer int8 or fp8 (sparse_delta; the dense backend sends the same leaves:
  tests/train/test_weight_sync.py): the copy (built by a resync from the master on a data 2 x fsdp 4 mesh,
  laid out on a tensor=2 sampler mesh) after one sync of nudged params holds exactly the quantized export of
  the new master (verify_dense: bit-exact against a dense reshard); each scale takes its kernel's sharding with
  the contracted axes replicated; sparse_delta sends a fraction of the bytes (fp8: the bits of 1-byte float
  codes)."""
  mesh = make_mesh({"data": 2, "fsdp": 4})
  before = shard_params(_params(), mesh)
  pick = lambda x: (jnp.arange(x.size) % 128 == 0).reshape(x.shape)          # noqa: E731
  after = jax.tree.map(lambda x: jnp.where(pick(x), x * 1.01 + 1e-3, x), before)
  section = weight_sync.sampler_sync_defaults()
  section.update(kind=kind, quantizer=quantizer, verify_dense=True, capacity_frac=0.25)
  section.mesh.tensor = 2
  with jax.set_mesh(mesh), fast_compile():      # (shapes of this module only: see tests/fast_compile.py)
    sync = weight_sync.build(section, before, Transformer(CFG), lora.lora_defaults())
    copy = weight_sync.start(sync, before)
    copy, m = weight_sync.update(sync, copy, after)
  assert m["sync/committed"] == 1.0 and m["sync/bit_exact"] == 1.0 and m["sync/resynced"] == 0.0
  if kind == "sparse_delta":
    assert 0 < m["sync/change_rate"] < 0.2 and m["sync/payload_ratio"] < 0.5
  assert sync.model.cfg.param_dtype == "bfloat16" == sync.model.cfg.dtype
  qkv = copy.params["layers_0"]["attn"]["qkv"]
  assert isinstance(qkv, ChannelScaledWeight) and qkv.codes.dtype == {"int8": jnp.int8, "fp8": jnp.float8_e4m3fn}[
      quantizer]
  assert dict(qkv.codes.sharding.mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 2}
  assert tuple(qkv.codes.sharding.spec)[1] == "tensor" == tuple(qkv.scale.sharding.spec)[1]    # heads split
  # On the train mesh (the master's shardings, mesh all 0) a scale's size-1 contracted axis is not split.
  train = export_shardings(jax.tree.map(lambda x: x.sharding, before),
                           jax.eval_shape(lambda p: export_params(p, "bfloat16", quantizer), before))
  qkv = train["layers_0"]["attn"]["qkv"]
  assert tuple(qkv.codes.spec)[0] == "fsdp" and tuple(qkv.scale.spec)[0] is None
  expected = export_params(jax.device_get(after), "bfloat16", quantizer)
  for a, b in zip(jax.tree.leaves(copy.params), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(_bits(jax.device_get(a)), _bits(b))


@register_reward("test_quant_digits")
def _make_digits_reward(task, executor):
  """The number of digits in the completion: reward variance in an untrained policy's groups, so the RL
  steps change the weights and the syncs have something to send."""
  del task, executor

  def reward_fn(batch):
    r = np.array([sum(c.isdigit() for c in text) for text in batch.completions], np.float64)
    return RewardOutput(rewards=r, correct=r > 2, components={}, failures={})
  return reward_fn


@pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices: tests/conftest.py")
def test_an_rl_run_samples_from_the_int8_copy(tmp_path, monkeypatch):
  """The main job's test preset, RL only, with rl.sync sparse_delta + int8 on a tensor=2 sampler mesh: every
  round samples from int8 weights, every sync commits bit-exact, and the trainer sees the sampler's mismatch."""
  from configs.grpo_arith import get_config
  from rlkit.train.config_checks import validate
  from rlkit.train.metrics import read_metrics
  from rlkit.train.run import run
  c = get_config("test")
  c.stages = ("rl",)
  del c["sft"]
  c.data.num_train, c.data.num_test, c.model.num_layers = 64, 0, 1
  c.rl.steps, c.rl.prompts_per_step, c.rl.group_size, c.rl.max_new_tokens = 2, 4, 2, 3
  c.rl.optimizer.lr = 1e-2
  c.rl.reward.name, c.rl.reward.timeout_s = "test_quant_digits", 0.0
  c.rl.sync.update(kind="sparse_delta", quantizer="int8", verify_dense=True, capacity_frac=0.5)
  c.rl.sync.mesh.tensor = 2
  validate(c)
  sampled = []
  source = weight_sync.sampling_source
  quantized = lambda tree: sum(isinstance(x, ChannelScaledWeight) for x in jax.tree.leaves(   # noqa: E731
      tree, is_leaf=lambda x: isinstance(x, QuantizedWeight)))
  monkeypatch.setattr(weight_sync, "sampling_source",
                      lambda copy, params: sampled.append(quantized(source(copy, params))) or source(copy, params))
  with fast_compile():
    run(c, str(tmp_path))
  rows = [r for r in read_metrics(str(tmp_path / "metrics.jsonl")) if "loss" in r]
  assert len(rows) == 2 and sampled == [4, 4]        # qkv, o, gate_up, down (the LM head is the tied embedding)
  for r in rows:
    assert r["sync/committed"] == 1.0 == r["sync/bit_exact"] and r["sync/change_rate"] > 0
    assert 0 < r["mismatch/mean"] < 0.1 and r["grad_norm"] > 0
