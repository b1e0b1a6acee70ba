"""Hugging Face <-> rlkit naming: the `config.json` fields of a `TransformerConfig` and the parameter layout of
its tensors, both ways (the layout is in `rlkit.models.hf`'s docstring). Pure functions over dicts of arrays;
`rlkit.models.hf` reads and writes the files with them.
"""
from __future__ import annotations

from typing import Any, Callable, Optional

import numpy as np

from rlkit.models.transformer import TransformerConfig

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_moe", "qwen2", "llama")
_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                  "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
_REQUIRED = object()


# ---------------------------------------------------------------------------------------------- config

def _field(hf: dict, name: str, default: Any = _REQUIRED) -> Any:
  if name in hf and hf[name] is not None:
    return hf[name]
  if default is _REQUIRED:
    raise ValueError(f"config.json has no {name!r}, which a {hf.get('model_type')!r} model needs.")
  return default


def _rope_theta(hf: dict) -> float:
  """transformers >= 5 writes `rope_parameters`, older versions `rope_theta` + `rope_scaling`; only plain
  RoPE is computed by our `rope`, so any scaling (yarn, llama3, linear, dynamic, ...) is refused."""
  params = hf.get("rope_parameters") or {}
  for field, value in (("rope_parameters", params), ("rope_scaling", hf.get("rope_scaling") or {})):
    rope_type = value.get("rope_type", value.get("type", "default"))
    if rope_type != "default":
      raise ValueError(f"config.json {field}.rope_type={rope_type!r} is not supported; rlkit implements "
                       "only plain RoPE (rope_type 'default', no rope scaling).")
    if value.get("partial_rotary_factor", 1.0) != 1.0:
      raise ValueError(f"config.json {field}.partial_rotary_factor={value['partial_rotary_factor']!r} is not "
                       "supported; rlkit rotates the whole head (1.0).")
  return float(params.get("rope_theta", hf.get("rope_theta", 10_000.0)))


def _check_full_attention(hf: dict, model_type: str, num_layers: int) -> None:
  """HF only applies `sliding_window` when `use_sliding_window` is set (per layer via `layer_types`)."""
  if not hf.get("use_sliding_window") or hf.get("sliding_window") is None:
    return
  if model_type == "qwen3_moe":
    sliding = list(range(num_layers))
  else:
    types = hf.get("layer_types") or ["sliding_attention" if i >= hf.get("max_window_layers", 28)
                                      else "full_attention" for i in range(num_layers)]
    sliding = [i for i, t in enumerate(types) if t == "sliding_attention"]
  if sliding:
    raise ValueError(f"config.json use_sliding_window=True with sliding_window={hf['sliding_window']} makes "
                     f"layers {sliding} sliding-window; rlkit supports full attention only "
                     "(use_sliding_window=false).")


def config_from_hf(hf_config: dict) -> TransformerConfig:
  """`TransformerConfig` of a HF `config.json` dict; raises `ValueError` for anything we would compute wrongly."""
  hf = hf_config
  model_type = hf.get("model_type")
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"config.json model_type={model_type!r} is not supported; supported model types: "
                     f"{', '.join(SUPPORTED_MODEL_TYPES)}.")
  if _field(hf, "hidden_act", "silu") != "silu":
    raise ValueError(f"config.json hidden_act={hf['hidden_act']!r} is not supported; only 'silu' (SwiGLU) is.")
  if model_type == "llama" and hf.get("mlp_bias"):
    raise ValueError("config.json mlp_bias=True is not supported; rlkit MLPs have no bias.")
  if model_type != "qwen2" and hf.get("attention_bias"):
    # qwen3 / qwen3_moe / llama put the bias on o_proj as well, which our Attention does not have.
    raise ValueError(f"config.json attention_bias=True is not supported for model_type={model_type!r} (it adds "
                     "a bias to o_proj too); rlkit supports attention biases on q/k/v only, as in 'qwen2'.")
  num_layers = _field(hf, "num_hidden_layers")
  _check_full_attention(hf, model_type, num_layers)
  heads = _field(hf, "num_attention_heads")
  kw = dict(
      vocab_size=_field(hf, "vocab_size"), hidden_size=_field(hf, "hidden_size"),
      intermediate_size=_field(hf, "intermediate_size"), num_layers=num_layers, num_heads=heads,
      num_kv_heads=_field(hf, "num_key_value_heads", heads),
      head_dim=_field(hf, "head_dim", _field(hf, "hidden_size") // heads),
      rms_norm_eps=float(_field(hf, "rms_norm_eps", 1e-6)), rope_theta=_rope_theta(hf),
      tie_word_embeddings=bool(_field(hf, "tie_word_embeddings", False)),
      qk_norm=model_type.startswith("qwen3"), attention_bias=model_type == "qwen2")
  if model_type == "qwen3_moe":
    kw.update(num_experts=_field(hf, "num_experts", _field(hf, "num_local_experts", None)),
              num_experts_per_tok=_field(hf, "num_experts_per_tok"),
              moe_intermediate_size=_field(hf, "moe_intermediate_size"),
              norm_topk_prob=bool(_field(hf, "norm_topk_prob", False)),
              decoder_sparse_step=_field(hf, "decoder_sparse_step", 1),
              mlp_only_layers=tuple(_field(hf, "mlp_only_layers", ())))
    if kw["num_experts"] is None:
      raise ValueError("config.json has neither 'num_experts' nor 'num_local_experts' for a qwen3_moe model.")
  return TransformerConfig(**kw)


def _infer_model_type(cfg: TransformerConfig) -> str:
  if cfg.num_experts:
    return "qwen3_moe"
  return {(True, False): "qwen3", (False, True): "qwen2", (False, False): "llama"}.get(
      (cfg.qk_norm, cfg.attention_bias), "unsupported")


def config_to_hf(cfg: TransformerConfig, model_type: Optional[str] = None) -> dict:
  """HF `config.json` dict for `cfg` (the inverse of `config_from_hf`); `model_type` defaults to the one
  whose architecture `cfg` describes."""
  model_type = model_type or _infer_model_type(cfg)
  if model_type not in SUPPORTED_MODEL_TYPES:
    raise ValueError(f"model_type={model_type!r} is not supported; supported model types: "
                     f"{', '.join(SUPPORTED_MODEL_TYPES)} (qk_norm={cfg.qk_norm}, attention_bias="
                     f"{cfg.attention_bias} matches none of them).")
  expect = _infer_model_type(cfg)
  if expect != model_type:
    raise ValueError(f"model_type={model_type!r} does not describe this config (qk_norm={cfg.qk_norm}, "
                     f"attention_bias={cfg.attention_bias}, num_experts={cfg.num_experts}); it is a "
                     f"{expect!r} model.")
  hf = dict(
      architectures=[_ARCHITECTURES[model_type]], model_type=model_type, vocab_size=cfg.vocab_size,
      hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size, num_hidden_layers=cfg.num_layers,
      num_attention_heads=cfg.num_heads, num_key_value_heads=cfg.num_kv_heads, head_dim=cfg.head_dim,
      hidden_act="silu", rms_norm_eps=cfg.rms_norm_eps, tie_word_embeddings=cfg.tie_word_embeddings,
      # Both spellings, so transformers 4.x (rope_theta) and 5.x (rope_parameters) read the same theta.
      rope_theta=cfg.rope_theta, rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
      use_sliding_window=False, sliding_window=None, dtype=cfg.param_dtype)
  if model_type != "qwen2":
    hf["attention_bias"] = False
  if model_type == "llama":
    hf["mlp_bias"] = False
  if model_type == "qwen3_moe":
    hf.update(num_experts=cfg.num_experts, num_experts_per_tok=cfg.num_experts_per_tok,
              moe_intermediate_size=cfg.moe_intermediate_size, norm_topk_prob=cfg.norm_topk_prob,
              decoder_sparse_step=cfg.decoder_sparse_step, mlp_only_layers=list(cfg.mlp_only_layers))
  return hf


# ------------------------------------------------------------------------------ tensor layout mapping

def params_from_hf(cfg: TransformerConfig, read: Callable[..., np.ndarray], has: Callable[[str], bool]) -> dict:
  """Our param tree from HF tensors; `read(name, shape)` returns a checked numpy array."""
  d, kv, g, hd, h = cfg.hidden_size, cfg.num_kv_heads, cfg.q_per_kv, cfg.head_dim, cfg.num_heads
  t = lambda x: np.swapaxes(x, -1, -2)
  params: dict[str, Any] = {"embedding": read("model.embed_tokens.weight", (cfg.vocab_size, d)),
                            "final_norm": {"scale": read("model.norm.weight", (d,))}}
  if not cfg.tie_word_embeddings:
    params["lm_head"] = t(read("lm_head.weight", (cfg.vocab_size, d)))
  for i in range(cfg.num_layers):
    p = f"model.layers.{i}"
    a = f"{p}.self_attn"
    attn = {"qkv": np.concatenate([t(read(f"{a}.q_proj.weight", (h * hd, d))).reshape(d, kv, g, hd),
                                   t(read(f"{a}.k_proj.weight", (kv * hd, d))).reshape(d, kv, 1, hd),
                                   t(read(f"{a}.v_proj.weight", (kv * hd, d))).reshape(d, kv, 1, hd)], axis=2),
            "o": t(read(f"{a}.o_proj.weight", (d, h * hd))).reshape(kv, g, hd, d)}
    if cfg.attention_bias:
      attn["qkv_bias"] = np.concatenate([read(f"{a}.q_proj.bias", (h * hd,)).reshape(kv, g, hd),
                                         read(f"{a}.k_proj.bias", (kv * hd,)).reshape(kv, 1, hd),
                                         read(f"{a}.v_proj.bias", (kv * hd,)).reshape(kv, 1, hd)], axis=1)
    if cfg.qk_norm:
      attn["q_norm"] = {"scale": read(f"{a}.q_norm.weight", (hd,))}
      attn["k_norm"] = {"scale": read(f"{a}.k_norm.weight", (hd,))}
    layer = {"attn": attn, "attn_norm": {"scale": read(f"{p}.input_layernorm.weight", (d,))},
             "mlp_norm": {"scale": read(f"{p}.post_attention_layernorm.weight", (d,))}}
    m = f"{p}.mlp"
    if cfg.is_moe_layer(i):
      e, f = cfg.num_experts, cfg.moe_intermediate_size
      if has(f"{m}.experts.gate_up_proj"):   # fused, as transformers 5 holds it in memory
        gate_up = t(read(f"{m}.experts.gate_up_proj", (e, 2 * f, d)))
        down = t(read(f"{m}.experts.down_proj", (e, d, f)))
      else:
        gate_up = np.stack([np.concatenate([t(read(f"{m}.experts.{j}.gate_proj.weight", (f, d))),
                                            t(read(f"{m}.experts.{j}.up_proj.weight", (f, d)))], axis=1)
                            for j in range(e)])
        down = np.stack([t(read(f"{m}.experts.{j}.down_proj.weight", (d, f))) for j in range(e)])
      layer["moe"] = {"router": t(read(f"{m}.gate.weight", (e, d))), "gate_up": gate_up, "down": down}
    else:
      f = cfg.intermediate_size
      layer["mlp"] = {"gate_up": np.stack([t(read(f"{m}.gate_proj.weight", (f, d))),
                                           t(read(f"{m}.up_proj.weight", (f, d)))], axis=1),
                      "down": t(read(f"{m}.down_proj.weight", (d, f)))}
    params[f"layers_{i}"] = layer
  return params


def params_to_hf(cfg: TransformerConfig, params: dict) -> dict[str, np.ndarray]:
  """HF tensors `{name: [out, in] array}` of our param tree (inverse of `params_from_hf`)."""
  d, g = cfg.hidden_size, cfg.q_per_kv
  t = lambda x: np.ascontiguousarray(np.swapaxes(np.asarray(x), -1, -2))
  out = {"model.embed_tokens.weight": np.asarray(params["embedding"])}
  for i in range(cfg.num_layers):
    p, layer = f"model.layers.{i}", params[f"layers_{i}"]
    a, attn = f"{p}.self_attn", layer["attn"]
    qkv = np.asarray(attn["qkv"])
    out[f"{a}.q_proj.weight"] = t(qkv[:, :, :g].reshape(d, -1))
    out[f"{a}.k_proj.weight"] = t(qkv[:, :, g].reshape(d, -1))
    out[f"{a}.v_proj.weight"] = t(qkv[:, :, g + 1].reshape(d, -1))
    out[f"{a}.o_proj.weight"] = t(np.asarray(attn["o"]).reshape(-1, d))
    if cfg.attention_bias:
      bias = np.asarray(attn["qkv_bias"])
      out[f"{a}.q_proj.bias"] = bias[:, :g].reshape(-1)
      out[f"{a}.k_proj.bias"] = bias[:, g].reshape(-1)
      out[f"{a}.v_proj.bias"] = bias[:, g + 1].reshape(-1)
    if cfg.qk_norm:
      out[f"{a}.q_norm.weight"] = np.asarray(attn["q_norm"]["scale"])
      out[f"{a}.k_norm.weight"] = np.asarray(attn["k_norm"]["scale"])
    m = f"{p}.mlp"
    if cfg.is_moe_layer(i):
      moe, f = layer["moe"], cfg.moe_intermediate_size
      out[f"{m}.gate.weight"] = t(moe["router"])
      gate_up, down = np.asarray(moe["gate_up"]), np.asarray(moe["down"])
      for j in range(cfg.num_experts):
        out[f"{m}.experts.{j}.gate_proj.weight"] = t(gate_up[j, :, :f])
        out[f"{m}.experts.{j}.up_proj.weight"] = t(gate_up[j, :, f:])
        out[f"{m}.experts.{j}.down_proj.weight"] = t(down[j])
    else:
      gate_up = np.asarray(layer["mlp"]["gate_up"])
      out[f"{m}.gate_proj.weight"] = t(gate_up[:, 0])
      out[f"{m}.up_proj.weight"] = t(gate_up[:, 1])
      out[f"{m}.down_proj.weight"] = t(layer["mlp"]["down"])
    out[f"{p}.input_layernorm.weight"] = np.asarray(layer["attn_norm"]["scale"])
    out[f"{p}.post_attention_layernorm.weight"] = np.asarray(layer["mlp_norm"]["scale"])
  out["model.norm.weight"] = np.asarray(params["final_norm"]["scale"])
  if not cfg.tie_word_embeddings:   # tied checkpoints omit lm_head, as save_pretrained does
    out["lm_head.weight"] = t(params["lm_head"])
  return out


# ---------------------------------------------------------------------------------------------- load
