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

The naming both ways (config fields, tensor layout) is `rlkit.models.hf_mapping`; this module reads and writes
the files. Files are written in the per-expert form, which is what `save_pretrained` writes and what every HF reader
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
from typing import Any, Optional, Union

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from safetensors import safe_open
from safetensors.numpy import save_file

from rlkit.models.hf_mapping import (SUPPORTED_MODEL_TYPES, params_from_hf, params_to_hf,  # noqa: F401
                                    config_from_hf, config_to_hf)
from rlkit.models.lora import has_adapters, merge
from rlkit.models.tokenizer import HFTokenizer
from rlkit.models.transformer import Transformer, TransformerConfig, as_dtype

_SINGLE_FILE, _INDEX_FILE = "model.safetensors", "model.safetensors.index.json"
_FILE_DTYPES = {"bfloat16": ml_dtypes.bfloat16, "float16": np.float16, "float32": np.float32}
# What `save(..., tokenizer=folder)` copies: the files transformers' tokenizers read, those present.
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                    "vocab.json", "merges.txt", "tokenizer.model", "chat_template.jinja", "chat_template.json")


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

    params = params_from_hf(cfg, read, lambda name: name in weight_map)
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
             for k, v in params_to_hf(cfg, params).items()}
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
