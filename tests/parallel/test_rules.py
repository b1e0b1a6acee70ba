"""Tests for rlkit.parallel.rules: rule matching, fallbacks, and sharded = single-device model outputs.

The model is tiny but every split the default rules ask for divides evenly on 8 devices (vocab 256, D 64,
8 KV heads with G=2, F 128, 4 experts on a tensor axis of 2), so (1, 1, 8) and (1, 8, 1) really shard.
"""
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from rlkit.models.transformer import Transformer, TransformerConfig
from rlkit.parallel import (DEFAULT_RULES, REPLICATE_REST, constrain_batch, data_sharding, make_mesh,
                            mesh_axis_size, partition_specs, shard_batch, shard_params, sharded_init)
from tests.xla_flags import default_emitters

DENSE = TransformerConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=16,
                          num_kv_heads=8, head_dim=8, attention_bias=True)
MOE = DENSE.replace(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, attention_bias=False)

# What the default rules must give (written out, not derived from the rules under test).
EXPECTED = {
    "embedding": P(("tensor", "fsdp"), None),
    "lm_head": P("fsdp", "tensor"),
    "final_norm/scale": P(),
    "layers_0/attn/qkv": P("fsdp", "tensor", None, None),
    "layers_0/attn/qkv_bias": P("tensor", None, None),
    "layers_0/attn/o": P("tensor", None, None, "fsdp"),
    "layers_0/attn/q_norm/scale": P(),
    "layers_1/mlp/gate_up": P("fsdp", None, "tensor"),
    "layers_1/mlp/down": P("tensor", "fsdp"),
    "layers_1/attn_norm/scale": P(),
}
EXPECTED_MOE = {
    "layers_0/moe/router": P(),
    "layers_0/moe/gate_up": P("tensor", "fsdp", None),
    "layers_1/moe/down": P("tensor", None, "fsdp"),
}


def _random_params(cfg, seed):
  """Random parameters without compiling an init (a jitted threefry init takes ~10 s to compile here)."""
  shapes = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
  rng = np.random.default_rng(seed)

  def draw(path, s):
    x = rng.normal(size=s.shape).astype(np.float32)
    # Norm scales near 1 (not exactly 1) so a misplaced scale would change the output.
    return jnp.asarray(1 + 0.1 * x if "scale" in jax.tree_util.keystr(path) else 0.05 * x)

  return jax.tree_util.tree_map_with_path(draw, shapes["params"])


def _get(tree, path):
  for k in path.split("/"):
    tree = tree[k]
  return tree


def _shard_shape(shape, spec, mesh):
  spec = tuple(spec) + (None,) * (len(shape) - len(spec))
  return tuple(d // mesh_axis_size(mesh, a) for d, a in zip(shape, spec))


def _batch(b=8, t=8):
  tokens = jax.random.randint(jax.random.key(1), (b, t), 0, DENSE.vocab_size)
  # Left padding on some rows, as the sampler and trainer see it.
  mask = jnp.arange(t)[None, :] >= (jnp.arange(b) % 3)[:, None]
  return tokens, mask


@pytest.fixture(scope="module")
def dense():
  params = _random_params(DENSE, 0)
  tokens, mask = _batch()
  # Jitted: eagerly every op compiles on its own (it was a third of this file's time).
  ref = jax.jit(lambda p: Transformer(DENSE).apply({"params": p}, tokens, None, mask))(params)
  return params, tokens, mask, ref


def _sharded_logits(cfg, params, tokens, mask, mesh):
  sp = shard_params(params, mesh)
  batch = shard_batch({"tokens": tokens, "mask": mask}, mesh)
  fwd = jax.jit(lambda p, b: Transformer(cfg).apply({"params": p}, b["tokens"], None, b["mask"]))
  with jax.set_mesh(mesh):   # lets the model's activation constraints see the mesh
    return sp, fwd(sp, batch)


@pytest.mark.parametrize("shape", [(8, 1, 1), (1, 8, 1), (2, 2, 2), (1, 1, 8)])
def test_sharded_forward_matches_single_device(dense, shape):
  params, tokens, mask, ref = dense
  mesh = make_mesh(shape)
  sp, logits = _sharded_logits(DENSE, params, tokens, mask, mesh)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(ref), atol=1e-5, rtol=0)
  for path, spec in EXPECTED.items():
    leaf = _get(sp, path)
    assert leaf.sharding.spec == spec, path
    want = _shard_shape(leaf.shape, spec, mesh)
    assert {s.data.shape for s in leaf.addressable_shards} == {want}, path
  # Every leaf is placed exactly as partition_specs says.
  specs = partition_specs(params, DEFAULT_RULES, mesh)
  jax.tree.map(lambda x, s: (x.sharding.spec == s) or pytest.fail(f"{x.sharding.spec} != {s}"), sp, specs)


@pytest.mark.parametrize("shape", [(8, 1, 1), (1, 8, 1), (2, 2, 2)])
def test_sharded_gradients_match_single_device(dense, shape):
  """The train step's gradients, through the hand-written matmul, SwiGLU and log-prob backward passes, are
  the same with params and batch sharded; the gate/up gradient keeps the tensor split of its F axis."""
  from rlkit.objectives import token_logprobs

  params, tokens, mask, _ = dense

  def loss(p, b):
    logits = Transformer(DENSE).apply({"params": p}, b["tokens"], None, b["mask"])
    return -jnp.mean(token_logprobs(logits, jnp.roll(b["tokens"], -1, axis=1), 0.8))

  grad = jax.jit(jax.value_and_grad(loss))
  ref_loss, ref = grad(params, {"tokens": tokens, "mask": mask})
  mesh = make_mesh(shape)
  sp, batch = shard_params(params, mesh), shard_batch({"tokens": tokens, "mask": mask}, mesh)
  with jax.set_mesh(mesh):
    out_loss, out = grad(sp, batch)
  np.testing.assert_allclose(out_loss, ref_loss, rtol=1e-6)
  for (path, g), r in zip(jax.tree_util.tree_leaves_with_path(out), jax.tree.leaves(ref)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(r), atol=1e-6, rtol=1e-4,
                               err_msg=jax.tree_util.keystr(path))
  if mesh_axis_size(mesh, "tensor") > 1:
    spec = tuple(out["layers_0"]["mlp"]["gate_up"].sharding.spec)
    assert (spec + (None,) * 3)[2] == "tensor", spec


def test_fsdp_keeps_rows_split_even_when_weights_are_split_on_d(dense):
  """FSDP = each device runs 1/n of the rows. With the embedding split on D (an older default), GSPMD
  propagated the D split into the residual stream and every device processed every row (logits came out
  replicated); the model's `constrain_batch` under `jax.set_mesh` prevents that."""
  params, tokens, _, _ = dense
  rules = ((r"(^|/)embedding$", P("tensor", "fsdp")),) + tuple(DEFAULT_RULES)
  mesh = make_mesh((1, 8, 1))
  fwd = jax.jit(lambda p, t: Transformer(DENSE).apply({"params": p}, t))
  single = fwd.lower(params, tokens).compile().cost_analysis()["flops"]
  sp, st = shard_params(params, mesh, rules), shard_batch(tokens, mesh)
  with jax.set_mesh(mesh):
    compiled = fwd.lower(sp, st).compile()
    logits = fwd(sp, st)
  assert compiled.cost_analysis()["flops"] < 0.2 * single   # ~1/8 per device, not a replicated batch
  assert logits.sharding.spec[0] in ("fsdp", ("data", "fsdp"), ("fsdp",))


def test_expected_shard_shapes_on_2x2x2(dense):
  sp = shard_params(dense[0], make_mesh((2, 2, 2)))
  assert sp["layers_0"]["attn"]["qkv"].addressable_shards[0].data.shape == (32, 4, 4, 8)
  assert sp["embedding"].addressable_shards[0].data.shape == (64, 64)
  assert sp["layers_0"]["mlp"]["down"].addressable_shards[0].data.shape == (64, 32)


def test_moe_sharded_forward_matches_single_device():
  params = _random_params(MOE, 2)
  tokens, mask = _batch()
  ref_out = jax.jit(lambda p: Transformer(MOE).apply({"params": p}, tokens, None, mask,
                                                     method=Transformer.forward))(params)
  mesh = make_mesh((2, 2, 2))
  sp, logits = _sharded_logits(MOE, params, tokens, mask, mesh)
  np.testing.assert_allclose(np.asarray(logits), np.asarray(ref_out.logits), atol=1e-5, rtol=0)
  for path, spec in EXPECTED_MOE.items():
    leaf = _get(sp, path)
    assert leaf.sharding.spec == spec, path
    assert {s.data.shape for s in leaf.addressable_shards} == {_shard_shape(leaf.shape, spec, mesh)}


@default_emitters
def test_sharded_init_equals_unsharded_init():
  # A transformer-named stand-in for `model.init`: the mechanism is the same, the compile much cheaper.
  # (XLA:CPU takes seconds to compile a rank-4 `normal`; a flat draw reshaped gives the same values.)
  def init_fn(key):
    k1, k2, k3 = jax.random.split(key, 3)
    return {"embedding": jax.random.normal(k1, (256, 64)),
            "layers_0": {"attn": {"qkv": jax.random.normal(k2, (64 * 8 * 4 * 8,)).reshape(64, 8, 4, 8)},
                         "mlp": {"down": jax.random.normal(k3, (128, 64))},
                         "mlp_norm": {"scale": jnp.ones((64,))}}}

  mesh = make_mesh((2, 2, 2))
  sharded = sharded_init(init_fn, jax.random.key(3), mesh)
  plain = jax.jit(init_fn)(jax.random.key(3))
  jax.tree.map(lambda a, b: np.testing.assert_array_equal(np.asarray(a), np.asarray(b)), sharded, plain)
  qkv = sharded["layers_0"]["attn"]["qkv"]
  assert qkv.sharding == NamedSharding(mesh, EXPECTED["layers_0/attn/qkv"])
  assert qkv.addressable_shards[0].data.shape == (32, 4, 4, 8)
  assert sharded["embedding"].addressable_shards[0].data.shape == (64, 64)
  assert sharded["layers_0"]["mlp_norm"]["scale"].sharding.spec == P()


def test_unmatched_param_errors_with_its_path_unless_replicate_rest():
  tree = {"value_head": {"w": jax.ShapeDtypeStruct((64, 1), jnp.float32)}}
  with pytest.raises(ValueError, match="value_head/w"):
    partition_specs(tree, DEFAULT_RULES)
  assert partition_specs(tree, (*DEFAULT_RULES, REPLICATE_REST)) == {"value_head": {"w": P()}}


def test_first_matching_rule_wins_and_rank_is_checked():
  tree = {"a": {"kernel": jax.ShapeDtypeStruct((8, 8), jnp.float32)}}
  rules = ((r"kernel$", P("fsdp")), (r"a/", P("tensor")))
  assert partition_specs(tree, rules) == {"a": {"kernel": P("fsdp")}}
  with pytest.raises(ValueError, match="a/kernel"):
    partition_specs(tree, ((r".*", P("fsdp", None, None)),))


def test_indivisible_dims_and_missing_axes_are_replicated():
  mesh = make_mesh((1, 1, 8))
  tree = {"embedding": jax.ShapeDtypeStruct((250, 64), jnp.float32),     # 250 % 8 != 0
          "lm_head": jax.ShapeDtypeStruct((64, 256), jnp.float32)}
  specs = partition_specs(tree, DEFAULT_RULES, mesh)
  assert specs == {"embedding": P(None, None), "lm_head": P("fsdp", "tensor")}
  data_only = jax.sharding.Mesh(np.array(jax.devices()), ("data",))
  assert partition_specs(tree, DEFAULT_RULES, data_only) == {"embedding": P(None, None),
                                                             "lm_head": P(None, None)}


def test_optimizer_state_follows_the_param_rules():
  shapes = jax.eval_shape(lambda: Transformer(DENSE).init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
  opt_shapes = jax.eval_shape(optax.adamw(1e-3).init, shapes["params"])
  specs = partition_specs(opt_shapes, DEFAULT_RULES, make_mesh((2, 2, 2)))
  adam = specs[0]
  assert adam.count == P()   # 0-d leaves need no rule
  assert adam.mu["layers_0"]["attn"]["qkv"] == EXPECTED["layers_0/attn/qkv"]
  assert adam.nu["embedding"] == EXPECTED["embedding"]


def test_shard_batch_and_data_sharding():
  mesh = make_mesh((2, 2, 2))
  tokens, mask = _batch(8, 4)
  out = shard_batch({"tokens": tokens, "mask": mask, "step": jnp.int32(3)}, mesh)
  assert out["tokens"].sharding == data_sharding(mesh)
  assert out["tokens"].sharding.spec == P(("data", "fsdp"), None)
  assert out["step"].sharding.spec == P()
  assert {s.data.shape for s in out["tokens"].addressable_shards} == {(2, 4)}
  np.testing.assert_array_equal(np.asarray(out["tokens"]), np.asarray(tokens))
  with pytest.raises(ValueError, match="multiple of 4"):
    shard_batch({"tokens": tokens[:6]}, mesh)


@pytest.mark.parametrize("shape,greedy", [((2, 2, 2), True), ((1, 1, 8), False)])
def test_sharded_generation_matches_single_device(dense, shape, greedy):
  """(1, 1, 8) is pure tensor parallelism (every row on every device; what `benchmarks/sampler.py --mesh
  tensor` runs), sampling at temperature 1 from vocabulary-split logits."""
  from rlkit.rollout.sampler import SamplingConfig, generate
  params, tokens, mask, _ = dense
  prompt = jnp.where(mask, tokens, 0)
  cfg = SamplingConfig(max_new_tokens=6, greedy=greedy)
  model = Transformer(DENSE)
  ref = generate(model, params, prompt, mask, jax.random.key(0), cfg)
  mesh = make_mesh(shape)
  batch = shard_batch({"prompt": prompt, "mask": mask}, mesh)
  with jax.set_mesh(mesh):
    out = generate(model, shard_params(params, mesh), batch["prompt"], batch["mask"], jax.random.key(0), cfg)
  np.testing.assert_array_equal(np.asarray(out.response), np.asarray(ref.response))
  np.testing.assert_allclose(np.asarray(out.logprobs), np.asarray(ref.logprobs), atol=1e-5, rtol=0)
  if mesh_axis_size(mesh, ("data", "fsdp")) > 1:   # rows stayed split through the decode loop
    assert out.response.sharding.spec[0] == ("data", "fsdp")


def test_constrain_batch_is_a_noop_without_a_mesh_and_inside_shard_map():
  x = jnp.arange(16.0).reshape(8, 2)
  assert "sharding_constraint" not in jax.jit(constrain_batch).lower(x).as_text()
  mesh = make_mesh((2, 2, 2))
  with jax.set_mesh(mesh):
    assert "sharding_constraint" in jax.jit(constrain_batch).lower(x).as_text()
    # 3 rows cannot split over data*fsdp = 4 devices.
    assert "sharding_constraint" not in jax.jit(constrain_batch).lower(x[:3]).as_text()
    inside = jax.shard_map(lambda y: constrain_batch(y) * 2, mesh=mesh, in_specs=P(("data", "fsdp")),
                           out_specs=P(("data", "fsdp")))
    np.testing.assert_array_equal(np.asarray(jax.jit(inside)(x)), np.asarray(x) * 2)
