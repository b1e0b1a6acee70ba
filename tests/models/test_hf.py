"""HF interop: tiny random transformers models load with identical logits/routing, and save round-trips."""
import json
import os
import shutil

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest
import torch
import transformers
from safetensors.numpy import load_file, save_file
from safetensors.torch import save_file as torch_save_file

from rlkit.models import hf
from rlkit.models.transformer import Transformer, TransformerConfig, init_params

_BASE = dict(vocab_size=128, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             head_dim=16, intermediate_size=96)
_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32)
_SPECS = {
    "qwen3": (transformers.Qwen3Config, {}),
    "qwen2_tied": (transformers.Qwen2Config, dict(tie_word_embeddings=True)),
    "llama": (transformers.LlamaConfig, dict(rope_theta=5e5)),
    "moe": (transformers.Qwen3MoeConfig, dict(_MOE, norm_topk_prob=False)),
    "moe_norm_sparse": (transformers.Qwen3MoeConfig, dict(_MOE, norm_topk_prob=True, decoder_sparse_step=2)),
    "moe_mlp_only": (transformers.Qwen3MoeConfig, dict(_MOE, norm_topk_prob=True, mlp_only_layers=[0])),
}
_MOE_NAMES = ("moe", "moe_norm_sparse", "moe_mlp_only")

# Row 0 unpadded, row 1 left-padded by 3: covers both cases in one forward.
TOKENS = np.random.RandomState(0).randint(0, 128, (2, 9))
MASK = np.ones((2, 9), bool)
MASK[1, :3] = False


def _randomize(model):
  """Default init leaves norms at 1 and biases at 0, which would hide layout bugs in them."""
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
  """name -> (folder written by transformers' save_pretrained, the torch model)."""
  out = {}
  for i, (name, (cls, kw)) in enumerate(_SPECS.items()):
    torch.manual_seed(i)
    model = transformers.AutoModelForCausalLM.from_config(
        cls(**_BASE, **kw), attn_implementation="eager", dtype=torch.float32).eval()
    _randomize(model)
    path = tmp_path_factory.mktemp(name)
    model.save_pretrained(path)
    out[name] = (path, model)
  return out


def _hf_outputs(model, output_router_logits=False):
  pos = np.maximum(np.cumsum(MASK, -1) - 1, 0)
  with torch.no_grad():
    return model(torch.tensor(TOKENS), attention_mask=torch.tensor(MASK.astype(np.int64)),
                 position_ids=torch.tensor(pos), output_router_logits=output_router_logits)


def _ours(module, params, **kw):
  return module.apply({"params": params}, jnp.asarray(TOKENS), attention_mask=jnp.asarray(MASK),
                      method=Transformer.forward, **kw)


def _assert_parity(module, params, torch_model):
  ours = np.asarray(_ours(module, params).logits)
  np.testing.assert_allclose(ours[MASK], _hf_outputs(torch_model).logits.numpy()[MASK], atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------------ config

@pytest.mark.parametrize("model_type", hf.SUPPORTED_MODEL_TYPES)
def test_config_round_trip(model_type):
  kw = dict(qk_norm=model_type.startswith("qwen3"), attention_bias=model_type == "qwen2")
  if model_type == "qwen3_moe":
    kw.update(num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16, norm_topk_prob=False,
              decoder_sparse_step=2, mlp_only_layers=(1,))
  cfg = TransformerConfig(vocab_size=50, hidden_size=32, intermediate_size=48, num_layers=3, num_heads=4,
                          num_kv_heads=1, head_dim=8, rms_norm_eps=1e-5, rope_theta=123.0,
                          tie_word_embeddings=True, **kw)
  d = hf.config_to_hf(cfg)
  assert d["model_type"] == model_type
  assert hf.config_from_hf(d) == cfg
  # transformers < 5 spelling: top-level rope_theta only, and `num_local_experts` for the MoE.
  legacy = {k: v for k, v in d.items() if k != "rope_parameters"}
  if model_type == "qwen3_moe":
    legacy["num_local_experts"] = legacy.pop("num_experts")
  assert hf.config_from_hf(legacy) == cfg


def test_config_from_transformers_json(ckpts):
  cfg = hf.config_from_hf(json.loads((ckpts["moe_norm_sparse"][0] / "config.json").read_text()))
  assert (cfg.num_experts, cfg.norm_topk_prob, cfg.moe_layers, cfg.rope_theta) == (4, True, (1,), 10000.0)
  assert hf.config_from_hf(json.loads((ckpts["llama"][0] / "config.json").read_text())).rope_theta == 5e5


@pytest.mark.parametrize("change, words", [
    (dict(model_type="mistral"), ["model_type", "'mistral'", "qwen3_moe"]),
    (dict(rope_parameters={"rope_type": "yarn", "factor": 4.0, "rope_theta": 1e6}), ["rope_type", "'yarn'"]),
    (dict(rope_scaling={"type": "linear", "factor": 2.0}), ["rope_scaling", "'linear'", "default"]),
    (dict(use_sliding_window=True, sliding_window=16, max_window_layers=1), ["sliding_window=16", "[1]"]),
    (dict(attention_bias=True), ["attention_bias=True", "o_proj"]),
    (dict(hidden_act="gelu"), ["hidden_act", "'gelu'", "silu"]),
    (dict(num_hidden_layers=None), ["num_hidden_layers"]),
])
def test_config_errors(change, words):
  d = hf.config_to_hf(TransformerConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=2,
                                        num_heads=2, num_kv_heads=1, head_dim=4))
  with pytest.raises(ValueError) as e:
    hf.config_from_hf({**d, **change})
  assert all(w in str(e.value) for w in words), str(e.value)


def test_sliding_window_flag_alone_is_accepted(ckpts, tmp_path):
  """Real Qwen checkpoints carry sliding_window=32768 with use_sliding_window=false, which HF ignores, and so do
  we: the same config, the same logits as HF's. A window of 4, shorter than the 9-token test rows, with every
  layer a window layer (max_window_layers=0), would change the logits if either side applied it."""
  cfg = TransformerConfig(vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=2, num_heads=2,
                          num_kv_heads=1, head_dim=4)
  d = hf.config_to_hf(cfg)
  for window in (32768, 4):
    assert hf.config_from_hf({**d, "sliding_window": window, "use_sliding_window": False}) == cfg
  path, _ = ckpts["qwen3"]
  flagged = tmp_path / "flagged"
  shutil.copytree(path, flagged)
  config = json.loads((flagged / "config.json").read_text())
  config.update(sliding_window=4, use_sliding_window=False, max_window_layers=0)
  (flagged / "config.json").write_text(json.dumps(config))
  module, params = hf.load(str(flagged))
  plain_module, plain_params = hf.load(str(path))
  assert module.cfg == plain_module.cfg
  np.testing.assert_array_equal(np.asarray(_ours(module, params).logits),
                                np.asarray(_ours(plain_module, plain_params).logits))
  theirs = transformers.AutoModelForCausalLM.from_pretrained(flagged, attn_implementation="eager",
                                                             dtype=torch.float32).eval()
  assert theirs.config.sliding_window in (None, 4) and not theirs.config.use_sliding_window
  _assert_parity(module, params, theirs)


# ------------------------------------------------------------------------------------------------ parity

@pytest.mark.parametrize("name", list(_SPECS))
def test_load_matches_transformers_logits(ckpts, name):
  path, model = ckpts[name]
  module, params = hf.load(path)
  like_init = jax.eval_shape(lambda k: init_params(module.cfg, k), jax.random.key(0))
  assert jax.tree.structure(params) == jax.tree.structure(like_init)
  assert jax.tree.map(lambda x: x.shape, params) == jax.tree.map(lambda x: x.shape, like_init)
  _assert_parity(module, params, model)


@pytest.mark.parametrize("name", _MOE_NAMES)
def test_moe_routing_matches_transformers_and_replays(ckpts, name):
  path, model = ckpts[name]
  module, params = hf.load(path)
  out = _ours(module, params)
  routed = np.asarray(out.routed_experts)                             # [B, T, L_moe, k]
  router_logits = _hf_outputs(model, output_router_logits=True).router_logits
  # transformers records router logits for MoE layers only, each [B*T, E].
  assert len(router_logits) == routed.shape[2] == len(module.cfg.moe_layers)
  for l, logits in enumerate(router_logits):
    theirs = torch.topk(logits, module.cfg.num_experts_per_tok, dim=-1).indices.numpy().reshape(2, 9, -1)
    for b, t in zip(*np.nonzero(MASK)):
      assert set(routed[b, t, l]) == set(theirs[b, t]), (l, b, t)
  replay = _ours(module, params, routed_experts=jnp.asarray(routed))
  np.testing.assert_array_equal(np.asarray(replay.logits), np.asarray(out.logits))


def test_fused_expert_tensors_load(ckpts, tmp_path):
  """transformers 5 holds experts fused (`experts.gate_up_proj [E, 2F, D]`); such files load too."""
  path, model = ckpts["moe"]
  state = {k: v.contiguous() for k, v in model.state_dict().items()}
  assert "model.layers.0.mlp.experts.gate_up_proj" in state
  torch_save_file(state, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
  shutil.copy(path / "config.json", tmp_path / "config.json")
  _, fused = hf.load(tmp_path)
  _, per_expert = hf.load(path)
  jax.tree.map(np.testing.assert_array_equal, fused, per_expert)


# -------------------------------------------------------------------------------------------------- save

@pytest.mark.parametrize("name", ["qwen3", "qwen2_tied", "llama", "moe_norm_sparse"])
def test_save_loads_in_transformers_and_round_trips(ckpts, name, tmp_path):
  path, model = ckpts[name]
  module, params = hf.load(path)
  out = hf.save(tmp_path / "saved", module, params)
  assert sorted(os.listdir(tmp_path)) == ["saved"]                   # no temp folders left behind
  ours = load_file(str(out / "model.safetensors"))
  theirs = load_file(str(path / "model.safetensors"))
  assert sorted(ours) == sorted(theirs)
  reloaded = transformers.AutoModelForCausalLM.from_pretrained(out, attn_implementation="eager").eval()
  assert type(reloaded) is type(model)
  np.testing.assert_array_equal(_hf_outputs(reloaded).logits.numpy(), _hf_outputs(model).logits.numpy())
  module2, params2 = hf.load(out)
  assert module2.cfg == module.cfg
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_sharded_checkpoints(ckpts, tmp_path):
  path, model = ckpts["moe"]
  model.save_pretrained(tmp_path / "hf", max_shard_size="200KB")
  assert (tmp_path / "hf" / "model.safetensors.index.json").exists()
  module, params = hf.load(tmp_path / "hf")
  _assert_parity(module, params, model)

  out = hf.save(tmp_path / "ours", module, params, max_shard_bytes=100_000)
  index = json.loads((out / "model.safetensors.index.json").read_text())
  files = sorted(set(index["weight_map"].values()))
  assert len(files) > 2 and not (out / "model.safetensors").exists()
  assert sum(os.path.getsize(out / f) for f in files) > index["metadata"]["total_size"]
  _, params2 = hf.load(out)
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_bfloat16_save_and_load(ckpts, tmp_path):
  module, params = hf.load(ckpts["qwen3"][0], param_dtype="bfloat16")
  assert module.cfg.param_dtype == module.cfg.dtype == "bfloat16"
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}
  out = hf.save(tmp_path / "bf16", module, params)
  assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
  assert {x.dtype for x in load_file(str(out / "model.safetensors")).values()} == {np.dtype(ml_dtypes.bfloat16)}
  module2, params2 = hf.load(out)                                    # dtype read back from config.json
  assert module2.cfg.param_dtype == "bfloat16"
  jax.tree.map(np.testing.assert_array_equal, params2, params)


def test_save_is_atomic(ckpts, tmp_path, monkeypatch):
  module, params = hf.load(ckpts["qwen3"][0])
  existing = hf.save(tmp_path / "m", module, params)
  with pytest.raises(FileExistsError, match="overwrite=True"):
    hf.save(existing, module, params)

  def fail(*args, **kw):
    raise OSError("disk full")
  monkeypatch.setattr(hf, "save_file", fail)
  with pytest.raises(OSError, match="disk full"):
    hf.save(tmp_path / "new", module, params)
  with pytest.raises(OSError, match="disk full"):
    hf.save(existing, module, params, overwrite=True)
  assert sorted(os.listdir(tmp_path)) == ["m"]                       # nothing half-written, old one intact
  monkeypatch.undo()
  jax.tree.map(np.testing.assert_array_equal, hf.load(existing)[1], params)
  bad = dict(params, final_norm={"scale": params["final_norm"]["scale"][:3]})
  with pytest.raises(ValueError, match="final_norm"):
    hf.save(tmp_path / "bad", module, bad)


# ------------------------------------------------------------------------------------------ load errors

def _copy_with(src, dst, edit):
  shutil.copytree(src, dst)
  tensors = load_file(str(dst / "model.safetensors"))
  edit(tensors)
  save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
  return dst


def test_missing_tensor_is_named(ckpts, tmp_path):
  name = "model.layers.1.mlp.experts.3.up_proj.weight"
  path = _copy_with(ckpts["moe"][0], tmp_path / "m", lambda t: t.pop(name))
  with pytest.raises(KeyError, match=name.replace(".", r"\.")) as e:
    hf.load(path)
  assert "model.safetensors" in str(e.value)


def test_unexpected_and_misshaped_tensors_are_named(ckpts, tmp_path):
  extra = "model.layers.0.self_attn.o_proj.bias"
  path = _copy_with(ckpts["qwen3"][0], tmp_path / "extra",
                    lambda t: t.update({extra: np.zeros(64, np.float32),
                                        "model.layers.0.self_attn.rotary_emb.inv_freq": np.zeros(8, np.float32)}))
  with pytest.raises(ValueError, match=extra.replace(".", r"\.")) as e:
    hf.load(path)
  assert "inv_freq" not in str(e.value)

  name = "model.layers.0.self_attn.k_norm.weight"
  path = _copy_with(ckpts["qwen3"][0], tmp_path / "shape", lambda t: t.update({name: np.ones(8, np.float32)}))
  with pytest.raises(ValueError, match=r"k_norm\.weight.*\(8,\).*\(16,\)"):
    hf.load(path)


def test_missing_folder_contents(tmp_path):
  with pytest.raises(FileNotFoundError, match="config.json"):
    hf.load(tmp_path)
  (tmp_path / "config.json").write_text(json.dumps(hf.config_to_hf(TransformerConfig(
      vocab_size=8, hidden_size=8, intermediate_size=8, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=4))))
  with pytest.raises(FileNotFoundError, match="safetensors"):
    hf.load(tmp_path)
