"""Models by role: the policy and the others a run declares (reference, teacher, peer, critic, ...), each built
from config fields or loaded from a Hugging Face folder, an rlkit workdir or an rlkit checkpoint.

`load_model(path)` is the one loader; it tells the sources apart by what the folder holds:

  source                      the folder holds               model from                     tokenizer from
  Hugging Face folder         config.json (with model_type)  `rlkit.models.hf.load`         its tokenizer.json,
                              + *.safetensors                                               else None
  rlkit workdir               checkpoints/                   its newest checkpoint, as below
  rlkit checkpoint directory  workdir/checkpoints/<step>     the `model` item's config +    the `model` item's
                              (state/, meta/, model/)        `state["train"].params`        tokenizer spec

An rlkit checkpoint says what its params are in its `model` item (`model_spec`: the `TransformerConfig` and
the tokenizer's `{"kind", "path"}`, written by `Checkpointer(..., model_spec=...)`). Only the policy params
are read, by an Orbax partial restore (`checkpoint.CheckpointReader.restore_params`), so loading needs neither
the optimizer that wrote the checkpoint nor the structure of its state. Params land on the mesh by the same
partition rules as the policy (`rlkit.parallel.rules`); from a checkpoint each array is read straight into
its shards. A run says in one line what it loaded (`loaded_line`: source, checkpoint step, parameters in total
and trainable), and Orbax's warning that the source's checkpoints open read-only (as they should) is dropped.

`build_models(config.models, ...)` gives one `Model(module, params, tokenizer, trainable)` per role. A role
section is `role_model_defaults()`: the policy's `model_defaults()` fields plus `trainable` (frozen models,
the default, never enter an optimizer) and `tokenizer`. With a `path`, only the section's `param_dtype`,
`dtype` and `attention` apply; the architecture comes from the source.

A role's tokenizer is its `tokenizer` section when that names a kind, else its source's (a checkpoint, an HF
folder with tokenizer.json), else the run's. The section exists for a role built from the fields that must
read text through another tokenizer than the policy's: a cross-tokenizer teacher in a run that trains both
from scratch (configs/xtok_opd.py:test), which no source could otherwise give its tokenizer.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import zlib
from typing import Any, Mapping, NamedTuple, Optional

import jax
import ml_collections
import numpy as np
from absl import logging as absl_logging

from rlkit.models.lora import add_adapters, has_adapters, merge, trainable_mask, with_saved_adapters
from rlkit.models.tokenizer import Tokenizer, make_tokenizer
from rlkit.models.transformer import Transformer, TransformerConfig
from rlkit.models.upcycle import upcycle
from rlkit.parallel.rules import param_shardings, shard_params, sharded_init
from rlkit.train import checkpoint as ckpt
from rlkit.train.config import model_defaults

_SOURCES = ("a Hugging Face folder (config.json + *.safetensors), an rlkit workdir (with checkpoints/) or an "
            "rlkit checkpoint directory (workdir/checkpoints/<step>)")


class Model(NamedTuple):
  module: Transformer
  params: Any
  tokenizer: Tokenizer
  trainable: bool            # False: frozen, never given to an optimizer


def role_model_defaults() -> ml_collections.ConfigDict:
  """A `config.models.<role>` section: the policy's model fields (documented in config.py), `trainable` and
  the role's own `tokenizer` (module docstring)."""
  c = model_defaults()
  c.trainable = False           # train it too (a critic, a peer); frozen models never enter an optimizer
  c.tokenizer = ml_collections.ConfigDict()
  c.tokenizer.kind = ""         # "": the source's tokenizer (path), else the run's; char | hf: this one instead
  c.tokenizer.path = ""         # hf: tokenizer.json or its folder
  return c


def role_tokenizer(section, where: str) -> Optional[Tokenizer]:
  """The tokenizer a role section names in `tokenizer`, or None when `tokenizer.kind` is "" (the role reads
  its source's tokenizer, else the run's); `where` names the section in errors."""
  spec = section.tokenizer
  if not spec.kind:
    if spec.path:
      raise ValueError(f"{where}.tokenizer.path={spec.path!r} is set but {where}.tokenizer.kind is ''; set "
                       f"{where}.tokenizer.kind='hf' to read it (or clear the path).")
    return None
  if spec.kind == "hf" and not spec.path:
    raise ValueError(f"{where}.tokenizer.kind='hf' needs {where}.tokenizer.path (a tokenizer.json or its folder).")
  if spec.kind != "hf" and spec.path:
    raise ValueError(f"{where}.tokenizer.path={spec.path!r} is read by kind 'hf' only; {where}.tokenizer.kind="
                     f"{spec.kind!r} takes no path (clear it).")
  return tokenizer_from_spec({"kind": spec.kind, "path": spec.path})


# ------------------------------------------------------------------------------------------ specs

def transformer_config(section, vocab_size: int) -> TransformerConfig:
  """The `TransformerConfig` of a model section's fields; `vocab_size` is the tokenizer's, which a nonzero
  `section.vocab_size` overrides (it may pad the vocabulary, not cut it)."""
  vocab = section.vocab_size or vocab_size
  if vocab < vocab_size:
    raise ValueError(f"model.vocab_size={vocab} is smaller than the tokenizer's {vocab_size}.")
  return TransformerConfig(
      vocab_size=vocab, hidden_size=section.hidden_size, intermediate_size=section.intermediate_size,
      num_layers=section.num_layers, num_heads=section.num_heads, num_kv_heads=section.num_kv_heads,
      head_dim=section.head_dim, rope_theta=section.rope_theta, rms_norm_eps=section.rms_norm_eps,
      tie_word_embeddings=section.tie_word_embeddings, num_experts=section.num_experts,
      num_experts_per_tok=section.num_experts_per_tok, moe_intermediate_size=section.moe_intermediate_size,
      param_dtype=section.param_dtype, dtype=section.dtype, attention=section.attention, **numerics(section))


NUMERICS = {"expert_quant": "", "expert_quant_layers": (), "trace_record": "codes", "kv_cache_dtype": ""}


def numerics(section) -> dict:
  """The low-precision fields of a model section (TransformerConfig's names; a loaded checkpoint takes them
  too): FP4 experts, their layers and TRACE record, the decode cache's dtype."""
  out = {key: section.get(key, default) for key, default in NUMERICS.items()}
  out["expert_quant_layers"] = tuple(out["expert_quant_layers"])
  return out


def model_spec(cfg: TransformerConfig, tokenizer: Mapping[str, str]) -> dict:
  """The JSON a checkpoint carries about its model: `cfg` and the tokenizer `{"kind", "path"}` (e.g. the
  `config.tokenizer` section; a relative path is made absolute, so the checkpoint loads from anywhere)."""
  path = tokenizer.get("path", "") or ""
  return {"transformer": dataclasses.asdict(cfg),
          "tokenizer": {"kind": tokenizer["kind"], "path": os.path.abspath(path) if path else ""}}


def tokenizer_from_spec(spec: Mapping[str, str]) -> Tokenizer:
  """The tokenizer of a `{"kind", "path"}` spec (a `model_spec` entry, or the `config.tokenizer` section)."""
  kw = {"path_or_tokenizer_json": spec["path"]} if spec["kind"] == "hf" else {}
  return make_tokenizer(spec["kind"], **kw)


def tokenizer_spec(config) -> dict[str, str]:
  """The run's tokenizer `{"kind", "path"}`: `config.tokenizer`; an `hf` one without a path takes the
  tokenizer of `model.path` (the Hugging Face folder's, or the one an rlkit checkpoint names)."""
  spec = {"kind": config.tokenizer.kind, "path": config.tokenizer.path}
  if spec["kind"] == "hf" and not spec["path"] and not config.model.path:
    raise ValueError("tokenizer.kind='hf' needs tokenizer.path (a tokenizer.json or its folder), or model.path "
                     "set to a Hugging Face folder that has one.")
  if spec["kind"] == "hf" and not spec["path"]:
    kind, folder, step = resolve_source(config.model.path)
    if kind == "hf":
      spec["path"] = folder
    else:
      reader = _reader(folder)
      try:
        spec = dict(reader.model_spec(reader.latest_step() if step is None else step)["tokenizer"])
      finally:
        reader.close()
  return spec


def run_tokenizer(config) -> Tokenizer:
  return tokenizer_from_spec(tokenizer_spec(config))


def _config_from_spec(spec: dict, where: str) -> TransformerConfig:
  raw = dict(spec.get("transformer") or {})
  fields = {f.name for f in dataclasses.fields(TransformerConfig)}
  unknown = sorted(set(raw) - fields)
  if not raw or unknown:
    raise ValueError(f"Checkpoint {where}: its model spec's 'transformer' entry "
                     f"{'has unknown fields ' + str(unknown) if unknown else 'is missing'}; expected the "
                     f"fields of TransformerConfig ({', '.join(sorted(fields))}).")
  try:   # JSON turns tuples (mlp_only_layers) into lists
    return TransformerConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
  except TypeError as e:
    raise ValueError(f"Checkpoint {where}: its model spec does not make a TransformerConfig: {e}.") from None


# ------------------------------------------------------------------------------------------ loading

def resolve_source(path: str) -> tuple[str, str, Optional[int]]:
  """("hf", folder, None) or ("checkpoint", checkpoints folder, step) for a model path, or a clear error."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"Model path {path} does not exist; expected {_SOURCES}.")
  if not os.path.isdir(path):
    raise NotADirectoryError(f"Model path {path} is a file, not a folder; expected {_SOURCES}.")
  checkpoints = os.path.join(path, "checkpoints")
  if os.path.isdir(checkpoints):
    return "checkpoint", checkpoints, None
  config_file = os.path.join(path, "config.json")
  if os.path.isfile(config_file):
    try:
      config = json.loads(open(config_file).read())
    except ValueError as e:
      raise ValueError(f"Model path {path}: {config_file} is not valid JSON ({e}).") from None
    if isinstance(config, dict) and "model_type" in config:
      return "hf", path, None
    if isinstance(config, dict) and "stages" in config:
      raise FileNotFoundError(f"Model path {path} is an rlkit workdir without checkpoints/ (its run saved "
                              "none); expected a workdir with a finished checkpoint.")
  name = os.path.basename(os.path.normpath(path))
  if name.isdigit() and os.path.isdir(os.path.join(path, ckpt.STATE)):
    return "checkpoint", os.path.dirname(os.path.abspath(path)), int(name)
  raise ValueError(f"Model path {path} is none of the sources a model loads from (it holds "
                   f"{sorted(os.listdir(path))[:10]}); expected {_SOURCES}.")


def _override(cfg: TransformerConfig, dtype, param_dtype, attention) -> TransformerConfig:
  kw = dict(dtype=dtype, param_dtype=param_dtype, attention=attention)
  return cfg.replace(**{k: v for k, v in kw.items() if v is not None})


def _abstract_params(module: Transformer) -> Any:
  return jax.eval_shape(lambda: module.init(jax.random.key(0), np.zeros((1, 1), np.int32))["params"])


class _ReadOnlyWarningFilter(logging.Filter):
  """Drops Orbax's warning "Given directory is read only=..." (absl, at WARNING): a reader opens another run's
  checkpoints read-only on purpose, and the warning made every run that loads model.path look broken."""

  def filter(self, record: logging.LogRecord) -> bool:
    return not str(record.msg).startswith("Given directory is read only")


def _reader(directory: str) -> ckpt.CheckpointReader:
  """A `CheckpointReader` of `directory`, opened without Orbax's read-only warning (`_ReadOnlyWarningFilter`)."""
  quiet = _ReadOnlyWarningFilter()
  absl_logger = absl_logging.get_absl_logger()
  absl_logger.addFilter(quiet)
  try:
    return ckpt.CheckpointReader(directory)
  finally:
    absl_logger.removeFilter(quiet)


def _load_checkpoint(directory: str, step: Optional[int], dtype, param_dtype, attention, mesh):
  reader = _reader(directory)
  source = f"rlkit checkpoint {reader.step_dir(step)} (global step {step})" if step is not None else None
  try:
    if step is None:   # a workdir: its newest checkpoint
      step = reader.latest_step()
      if step is None:
        raise FileNotFoundError(f"rlkit workdir {os.path.dirname(directory)} has no finished checkpoint in "
                                f"{directory}; point the model path at a workdir whose run saved one "
                                "(checkpoint.every), or at another source.")
    where = reader.step_dir(step)
    source = source or f"rlkit workdir {os.path.dirname(directory)} (its newest checkpoint: global step {step})"
    spec = reader.model_spec(step)
    module = Transformer(_override(_config_from_spec(spec, where), dtype, param_dtype, attention))
    shapes = with_saved_adapters(_abstract_params(module), reader.saved_params(step))
    if mesh is None:
      one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
      shardings = jax.tree.map(lambda _: one, shapes)
    else:
      shardings = param_shardings(shapes, mesh)
    target = jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), shapes, shardings)
    params = reader.restore_params(step, target)
    if has_adapters(params):     # a LoRA run's policy loads merged
      params, source = merge(params), source + ", its LoRA adapters merged"
  finally:
    reader.close()
  try:
    tokenizer = tokenizer_from_spec(spec["tokenizer"])
  except (KeyError, TypeError) as e:
    raise ValueError(f"Checkpoint {where}: its model spec has no usable tokenizer entry {{'kind', 'path'}} "
                     f"({e!r}).") from None
  except (FileNotFoundError, ValueError) as e:
    raise type(e)(f"Checkpoint {where} names tokenizer {spec['tokenizer']}, which does not load: {e}") from None
  return module, params, tokenizer, source


def load_model(path: str, *, dtype: Optional[str] = None, param_dtype: Optional[str] = None,
               attention: Optional[str] = None, mesh: Optional[jax.sharding.Mesh] = None
               ) -> tuple[Transformer, Any, Optional[Tokenizer]]:
  """`(module, params, tokenizer)` from a Hugging Face folder, an rlkit workdir or an rlkit checkpoint.

  `dtype`, `param_dtype`, `attention` override the source's (None keeps them). With `mesh` the params are
  placed by the policy's partition rules, else on the first local device. `tokenizer` is None for a
  Hugging Face folder without tokenizer.json.
  """
  return _load(path, dtype, param_dtype, attention, mesh)[:3]


def _load(path, dtype, param_dtype, attention, mesh):
  """`load_model`'s `(module, params, tokenizer)` and what was loaded, in words (for `loaded_line`)."""
  path = os.fspath(path)
  kind, folder, step = resolve_source(path)
  if kind == "checkpoint":
    return _load_checkpoint(folder, step, dtype, param_dtype, attention, mesh)
  from rlkit.models import hf   # local: only HF users pay for safetensors
  module, params = hf.load(folder, dtype=dtype, param_dtype=param_dtype, attention=attention or "xla")
  if mesh is not None:
    params = shard_params(params, mesh)
  has_tokenizer = os.path.isfile(os.path.join(folder, "tokenizer.json"))
  with open(os.path.join(folder, "config.json")) as f:
    model_type = json.load(f)["model_type"]
  return (module, params, tokenizer_from_spec({"kind": "hf", "path": folder}) if has_tokenizer else None,
          f"Hugging Face folder {folder} ({model_type})")


def loaded_line(where: str, source: str, params: Any, trainable: bool = True) -> str:
  """One line on a model loaded from a path: the source (kind, path, checkpoint step) and its parameters, in
  total and trainable (under LoRA only the adapters; a frozen role none), e.g.
  "model: loaded rlkit workdir /tmp/a (its newest checkpoint: global step 8); 61,536 parameters, 8,192
  trainable (LoRA adapters; the base weights frozen)"."""
  sizes = [int(np.prod(x.shape)) for x in jax.tree.leaves(params)]
  total = sum(sizes)
  if not trainable:
    what = "frozen"
  elif has_adapters(params):
    n = sum(size for size, train in zip(sizes, jax.tree.leaves(trainable_mask(params))) if train)
    what = f"{n:,} trainable (LoRA adapters; the base weights frozen)"
  else:
    what = "all trainable"
  return f"{where}: loaded {source}; {total:,} parameters, {what}"


# ----------------------------------------------------------------------------------------- building

def _build(section, tokenizer: Tokenizer, key: jax.Array, mesh, where: str, use_own: bool, say=None,
           trainable: bool = True):
  """(module, params, the source's tokenizer or None) of one model section, with LoRA adapters when
  `section.lora.rank` > 0 (rlkit/models/lora.py); the model is checked against the tokenizer it will be used
  with: the source's when `use_own` and it has one, else `tokenizer`. A loaded model is reported to `say`."""
  module, params, own, source = _build_base(section, tokenizer, key, mesh, where, use_own)
  if section.lora.rank:
    params = add_adapters(params, section.lora, jax.random.fold_in(key, 0x10A))
    params = params if mesh is None else shard_params(params, mesh)
  if source and say is not None:
    say(loaded_line(where, source, params, trainable))
  return module, params, own


def _build_base(section, tokenizer: Tokenizer, key: jax.Array, mesh, where: str, use_own: bool):
  module, params, own, source = _build_source(section, tokenizer, key, mesh, where, use_own)
  if section.get("upcycle_experts", 0):
    cfg, params = upcycle(module.cfg, jax.device_get(params), section.upcycle_experts, section.upcycle_k,
                          jax.random.fold_in(key, 0x0C7C1E), section.upcycle_noise)
    module, params = Transformer(cfg), params if mesh is None else shard_params(params, mesh)
  return module, params, own, source


def _build_source(section, tokenizer: Tokenizer, key: jax.Array, mesh, where: str, use_own: bool):
  if section.path:
    module, params, own, source = _load(section.path, section.dtype, section.param_dtype, section.attention,
                                        mesh)
    if numerics(section) != {key: getattr(module.cfg, key) for key in NUMERICS}:
      module = Transformer(module.cfg.replace(**numerics(section)))
    user = (own if use_own else None) or tokenizer
    if module.cfg.vocab_size < user.vocab_size:
      raise ValueError(f"{where}.path={section.path!r} has vocab_size={module.cfg.vocab_size}, smaller than "
                       f"its tokenizer's {user.vocab_size} ({user!r}); use the tokenizer it was trained with.")
    return module, params, own, source
  module = Transformer(transformer_config(section, tokenizer.vocab_size))
  init = lambda k: module.init(k, np.zeros((1, 1), np.int32))["params"]  # noqa: E731
  return module, sharded_init(init, key, mesh), None, None


def build_model(section, tokenizer: Tokenizer, key: jax.Array, mesh, say=None) -> tuple[Transformer, Any]:
  """(module, params) of a model section: loaded from `section.path` (see `load_model`), else initialised
  from the fields with `key`, directly sharded on `mesh`. The model must cover `tokenizer`'s vocabulary.
  A loaded one is reported to `say` (a print) in one line, `loaded_line`."""
  module, params, _ = _build(section, tokenizer, key, mesh, "model", use_own=False, say=say)
  return module, params


def build_models(models_section, tokenizer: Tokenizer, key: jax.Array, mesh, say=None) -> dict[str, Model]:
  """One `Model` per role of `config.models` (each a `role_model_defaults()` section).

  A role's tokenizer is its `tokenizer` section's when that names a kind, else its source's when it has one
  (a checkpoint, an HF folder with tokenizer.json), else `tokenizer` (the run's); the model is built for, or
  checked against, that tokenizer. A role initialised from fields draws from `fold_in(key, crc32(role))`, so
  adding or renaming another role does not change it. A loaded role is reported to `say`, as in `build_model`.
  """
  out = {}
  for role in models_section.keys():
    section = models_section[role]
    role_key = jax.random.fold_in(key, zlib.crc32(role.encode()) & 0x7FFFFFFF)
    named = role_tokenizer(section, f"models.{role}")
    module, params, own = _build(section, named or tokenizer, role_key, mesh, f"models.{role}",
                                 use_own=named is None, say=say, trainable=bool(section.trainable))
    out[role] = Model(module, params, named or own or tokenizer, bool(section.trainable))
  return out
