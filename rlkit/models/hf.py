"""Hugging Face interop: load and save `Transformer` checkpoints in the HF `safetensors` layout.

Supported `model_type`s are the ones whose networks `rlkit.models.transformer` computes exactly:
"qwen3", "qwen3_moe", "qwen2" (no q/k norm, bias on q/k/v) and "llama" (no q/k norm, plain RoPE).

Torch stores a linear layer as `W [out, in]` (y = x W^T); rlkit stores `[in, ...]` with heads split out:

  qkv [D, KV, G+2, hd]   <- q_proj, k_proj, v_proj: KV head j holds HF query heads j*G .. j*G+G-1, then k_j, v_j
  o   [KV, G, hd, D]     <- o_proj [D, H*hd]
  gate_up [D, 2, F]      <- gate_proj, up_proj;  down [F, D] <- down_proj [D, F]
  moe/router [D, E]      <- mlp.gate [E, D]
  moe/gate_up [E, D, 2F] <- per-expert gate_proj/up_proj (as transformers writes files), or the fused
                            in-memory form `mlp.experts.gate_up_proj [E, 2F, D]` (gate first)
  moe/down [E, F, D]     <- per-expert down_proj [D, F], or fused `mlp.experts.down_proj [E, D, F]`

Files are written in the per-expert form, which is what `save_pretrained` writes and what every HF reader
(transformers 4.x/5.x, vLLM) accepts. bf16 and fp16 parameters are written as-is (`safetensors.numpy`
handles `ml_dtypes.bfloat16`), anything else as float32.
"""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
import uuid
from pathlib import Path
from typing import Any, Callable, Optional, Union

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from rlkit.models.lora import has_adapters, merge
from rlkit.models.tokenizer import HFTokenizer
from rlkit.models.transformer import Transformer, TransformerConfig, as_dtype

SUPPORTED_MODEL_TYPES = ("qwen3", "qwen3_moe", "qwen2", "llama")
_ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "qwen3_moe": "Qwen3MoeForCausalLM",
                  "qwen2": "Qwen2ForCausalLM", "llama": "LlamaForCausalLM"}
_SINGLE_FILE, _INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
_FILE_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
_REQUIRED = object()
# What `save(..., tokenizer=folder)` copies: the files transformers' tokenizers read, those present.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")


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

def _params_from_hf(cfg: TransformerConfig, read: Callable[..., np.ndarray], has: Callable[[str], bool]) -> dict:
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


def _params_to_hf(cfg: TransformerConfig, params: dict) -> dict[str, np.ndarray]:
  """HF tensors `{name: [out, in] array}` of our param tree (inverse of `_params_from_hf`)."""
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

def _weight_map(path: Path) -> dict[str, str]:
  """Tensor name -> shard file name, from the index json or the single file."""
  if (path / _INDEX_FILE).exists():
    return json.loads((path / _INDEX_FILE).read_text())["weight_map"]
  if not (path / _SINGLE_FILE).exists():
    raise FileNotFoundError(f"{path} has neither {_SINGLE_FILE} nor {_INDEX_FILE}; rlkit reads safetensors "
                            "checkpoints only (re-save a .bin checkpoint with transformers' save_pretrained).")
  with safe_open(str(path / _SINGLE_FILE), framework="numpy") as f:
    return {name: _SINGLE_FILE for name in f.keys()}


def _ignorable(name: str, cfg: TransformerConfig) -> bool:
  # inv_freq is a recomputed buffer in old checkpoints; tied models may still carry a copy of the embedding.
  return name.endswith("rotary_emb.inv_freq") or (cfg.tie_word_embeddings and name == "lm_head.weight")


def load(path: Union[str, os.PathLike], dtype: Any = None, param_dtype: Any = None, attention: str = "xla"
         ) -> tuple[Transformer, dict]:
  """`(Transformer(cfg), params)` from a HF checkpoint folder (config.json + safetensors, sharded or not).

  `param_dtype` defaults to the checkpoint's `dtype` (`torch_dtype`) when it is float32/bfloat16/float16,
  else float32; `dtype` (compute) defaults to `param_dtype`. `attention`: `TransformerConfig.attention`.
  """
  path = Path(path)
  if not (path / "config.json").exists():
    raise FileNotFoundError(f"{path / 'config.json'} does not exist; pass a Hugging Face model folder.")
  hf = json.loads((path / "config.json").read_text())
  cfg = config_from_hf(hf)
  file_dtype = hf.get("dtype", hf.get("torch_dtype"))
  param_dtype = param_dtype or (file_dtype if file_dtype in _FILE_DTYPES else "float32")
  param_dtype = jnp.dtype(as_dtype(param_dtype)).name
  cfg = cfg.replace(param_dtype=param_dtype, dtype=jnp.dtype(as_dtype(dtype or param_dtype)).name,
                    attention=attention)

  weight_map = _weight_map(path)
  used: set[str] = set()
  with contextlib.ExitStack() as stack:
    handles: dict[str, Any] = {}

    def read(name: str, shape: tuple[int, ...]) -> np.ndarray:
      if name not in weight_map:
        raise KeyError(f"Tensor {name!r} is missing from the checkpoint in {path} (files: "
                       f"{sorted(set(weight_map.values()))}); config.json describes a {hf['model_type']!r} "
                       "model that needs it.")
      file = weight_map[name]
      if file not in handles:
        handles[file] = stack.enter_context(safe_open(str(path / file), framework="numpy"))
      x = handles[file].get_tensor(name)
      if x.shape != shape:
        raise ValueError(f"Tensor {name!r} in {path / file} has shape {x.shape}; config.json implies {shape}.")
      used.add(name)
      return x

    params = _params_from_hf(cfg, read, lambda name: name in weight_map)
  leftover = sorted(n for n in weight_map if n not in used and not _ignorable(n, cfg))
  if leftover:
    raise ValueError(f"Checkpoint {path} has tensors that a {hf['model_type']!r} model with this config.json "
                     f"does not use: {leftover[:10]}{' ...' if len(leftover) > 10 else ''}.")
  params = jax.tree.map(lambda x: jnp.asarray(x, dtype=param_dtype), params)
  return Transformer(cfg), params


# ---------------------------------------------------------------------------------------------- save

def _check_tree(cfg: TransformerConfig, params: dict) -> None:
  """Fail before writing anything if `params` is not a `Transformer(cfg)` tree."""
  expected = jax.eval_shape(lambda: Transformer(cfg).init(jax.random.key(0), jnp.zeros((1, 1), jnp.int32)))
  want = {jax.tree_util.keystr(k): v.shape for k, v in jax.tree_util.tree_leaves_with_path(expected["params"])}
  got = {jax.tree_util.keystr(k): np.shape(v) for k, v in jax.tree_util.tree_leaves_with_path(params)}
  if want != got:
    diff = sorted(f"{k}: got {got.get(k)}, want {want.get(k)}" for k in set(want) | set(got)
                  if want.get(k) != got.get(k))
    raise ValueError(f"params do not match the config's Transformer: {diff[:10]}")


def _file_dtype(params: dict) -> str:
  names = {jnp.dtype(x.dtype).name for x in jax.tree.leaves(params)}
  return names.pop() if len(names) == 1 and next(iter(names)) in ("bfloat16", "float16") else "float32"


def _shards(tensors: dict[str, np.ndarray], max_bytes: Optional[int]) -> list[dict[str, np.ndarray]]:
  """Consecutive groups of at most `max_bytes` (a larger tensor gets a shard of its own)."""
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for name, x in tensors.items():
    if max_bytes is not None and shards[-1] and size + x.nbytes > max_bytes:
      shards.append({})
      size = 0
    shards[-1][name] = x
    size += x.nbytes
  return shards


@contextlib.contextmanager
def _atomic_dir(path: Path, overwrite: bool):
  """Yields a temp folder beside `path` that replaces `path` only once the body has succeeded."""
  if path.exists() and (not path.is_dir() or any(path.iterdir())) and not overwrite:
    raise FileExistsError(f"{path} exists and is not empty; pass overwrite=True or choose another path.")
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
  try:
    yield tmp
    os.chmod(tmp, 0o755)   # mkdtemp makes it private
    old = None
    if path.exists():
      old = path.parent / f".{path.name}.old-{uuid.uuid4().hex}"
      path.rename(old)
    tmp.rename(path)
    if old is not None:
      shutil.rmtree(old) if old.is_dir() else old.unlink()
  except BaseException:
    shutil.rmtree(tmp, ignore_errors=True)
    raise


def _tokenizer_files(tokenizer: Union[HFTokenizer, str, os.PathLike], vocab_size: int
                     ) -> tuple[HFTokenizer, dict[str, Union[str, Path]]]:
  """(the tokenizer, {file name: text to write, or a Path to copy}) of `save`'s `tokenizer` argument."""
  if isinstance(tokenizer, (str, os.PathLike)):
    source = Path(tokenizer)
    tok = HFTokenizer(source)    # checks that it loads, and gives its stop ids
    folder = source if source.is_dir() else source.parent
    files = {name: folder / name for name in _TOKENIZER_FILES if (folder / name).is_file()}
    files["tokenizer.json"] = source if source.is_file() else folder / "tokenizer.json"
  elif isinstance(tokenizer, HFTokenizer):
    tok = tokenizer
    text = lambda i: tok._tok.id_to_token(i)  # noqa: E731  (the `tokenizers.Tokenizer` it wraps)
    special = {"bos_token": tok.bos_id, "eos_token": tok.eos_id, "pad_token": tok.pad_id}
    config = {"tokenizer_class": "PreTrainedTokenizerFast",
              # transformers would otherwise rewrite spaces around punctuation that `tokenizers` decodes as is.
              "clean_up_tokenization_spaces": False,
              **{k: text(i) for k, i in special.items() if i is not None}}
    files = {"tokenizer.json": tok._tok.to_str(), "tokenizer_config.json": json.dumps(config, indent=2) + "\n"}
  else:
    raise TypeError(f"save: tokenizer={tokenizer!r} has no Hugging Face form; pass an HFTokenizer or the "
                    "folder (or tokenizer.json) it was loaded from.")
  if tok.vocab_size > vocab_size:
    raise ValueError(f"save: the tokenizer's {tok.vocab_size} ids do not fit the model's vocab_size={vocab_size}; "
                     "pass the tokenizer the model was trained with.")
  return tok, files


def save(path: Union[str, os.PathLike], module_or_cfg: Union[Transformer, TransformerConfig], params: dict,
         model_type: Optional[str] = None, max_shard_bytes: Optional[int] = None, overwrite: bool = False,
         generation_config: Optional[dict] = None,
         tokenizer: Union[HFTokenizer, str, os.PathLike, None] = None) -> Path:
  """Writes a folder that `transformers.AutoModelForCausalLM.from_pretrained(path)` loads.

  `max_shard_bytes` splits the weights into `model-0000i-of-0000n.safetensors` plus an index json.
  The folder appears only when complete; an existing non-empty `path` needs `overwrite=True`. LoRA adapters
  in `params` are merged into their kernels first (`rlkit.models.lora.merge`).

  `tokenizer` writes the tokenizer beside the weights, so that `HFTokenizer(path)` and
  `transformers.AutoTokenizer.from_pretrained(path)` load it: a folder (or its tokenizer.json) has its
  tokenizer files copied as they are (a chat template included); an `HFTokenizer` is written as its
  tokenizer.json and a tokenizer_config.json naming its BOS, EOS and pad tokens. Either way, stop ids beyond
  EOS go to generation_config.json's `eos_token_id` unless `generation_config` is given, so that
  `HFTokenizer(path).stop_ids` and transformers' `generate` stop where the tokenizer did.
  """
  cfg = module_or_cfg.cfg if isinstance(module_or_cfg, Transformer) else module_or_cfg
  tok_files = {}
  if tokenizer is not None:
    tok, tok_files = _tokenizer_files(tokenizer, cfg.vocab_size)
    if generation_config is None and len(tok.stop_ids) > 1:
      generation_config = {"eos_token_id": list(tok.stop_ids)}
  if has_adapters(params):
    params = merge(params)
  _check_tree(cfg, params)
  file_dtype = _file_dtype(params)
  hf = config_to_hf(cfg.replace(param_dtype=file_dtype), model_type)
  np_dtype = _FILE_DTYPES[file_dtype]
  tensors = {k: np.ascontiguousarray(np.asarray(v).astype(np_dtype))
             for k, v in _params_to_hf(cfg, params).items()}
  shards = _shards(tensors, max_shard_bytes)
  path = Path(path)
  with _atomic_dir(path, overwrite) as tmp:
    (tmp / "config.json").write_text(json.dumps(hf, indent=2) + "\n")
    if generation_config is not None:
      (tmp / "generation_config.json").write_text(json.dumps(generation_config, indent=2) + "\n")
    for name, content in tok_files.items():
      if isinstance(content, Path):
        shutil.copyfile(content, tmp / name)
      else:
        (tmp / name).write_text(content)
    if len(shards) == 1:
      save_file(shards[0], str(tmp / _SINGLE_FILE), metadata={"format": "pt"})
    else:
      weight_map = {}
      for i, shard in enumerate(shards):
        name = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(tmp / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in shard})
      index = {"metadata": {"total_size": sum(x.nbytes for x in tensors.values())}, "weight_map": weight_map}
      (tmp / _INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
  return path
