"""Validation of the run config (`rlkit.train.config`): `validate(config)` runs before any work.

Unknown keys (a typo in a config file), wrong types, unknown registry names and inconsistent settings fail
with one `ConfigError` naming the key, what is wrong, and the fix or the valid choices; each stage and
registry adds its own checks (`check_config` of a stage, `check` of an optimizer or the LoRA section).
"""
from __future__ import annotations

import os
from typing import Any

import ml_collections

from rlkit.core.errors import ConfigError
from rlkit.core.registry import choice, closest_first
from rlkit.core.sections import section_roles, section_trains
from rlkit.data.tasks import TASKS, make_task
from rlkit.models.lora import check_run as check_lora
from rlkit.models.tokenizer import TOKENIZERS
from rlkit.models.transformer import ATTENTION_IMPLS, EXPERT_QUANTS, KV_CACHE_DTYPES, TRACE_RECORDS
from rlkit.optim.optimizers import check as check_optimizer
from rlkit.rewards import REWARDS
from rlkit.train.catalog import STAGES
from rlkit.train.config import base_config, split_files, stage_config, task_kwargs
from rlkit.train.models import resolve_source, role_model_defaults, role_tokenizer, run_tokenizer


def _check_section(section: Any, defaults: ml_collections.ConfigDict, where: str) -> None:
  if not isinstance(section, (ml_collections.ConfigDict, dict)):
    raise ConfigError(f"{where} must be a section (ConfigDict), got {type(section).__name__}.")
  for key in section.keys():
    if key not in defaults:
      raise ConfigError(f"Unknown config key {where}.{key}. Valid keys of {where}: "
                        f"{', '.join(closest_first(key, defaults.keys()))}.")
  for key, default in defaults.items():
    if key not in section:
      raise ConfigError(f"Missing config key {where}.{key} (default {default!r}); build configs from "
                        "rlkit.train.config defaults.")
    value = section[key]
    if isinstance(default, ml_collections.ConfigDict):
      if key in FREE_FORM:
        if not isinstance(value, (ml_collections.ConfigDict, dict)):
          raise ConfigError(f"{where}.{key} must be a section (ConfigDict), got {type(value).__name__}.")
        continue   # checked by their owner: the task, the reward, the loss-term registry, the model roles
      _check_section(value, default, f"{where}.{key}")
    elif not _same_type(value, default):
      raise ConfigError(f"{where}.{key}={value!r} has type {type(value).__name__}; expected "
                        f"{type(default).__name__} (default {default!r}).")


def _same_type(value: Any, default: Any) -> bool:
  if isinstance(default, bool):
    return isinstance(value, bool)
  if isinstance(default, float):
    return isinstance(value, (int, float)) and not isinstance(value, bool)
  if isinstance(default, int):
    return isinstance(value, int) and not isinstance(value, bool)
  if isinstance(default, (tuple, list)):
    return isinstance(value, (tuple, list))
  return isinstance(value, type(default))


# Sections whose keys are not fixed: task.kwargs / reward.kwargs (the component's own parameters),
# rl.loss_terms (term name -> weight), rl.policy_kwargs (the policy loss's parameters), models (role -> model
# section), eval.extra_sets (set name -> task kwargs), rl.schedules (step input -> schedule).
FREE_FORM = ("kwargs", "env_kwargs", "loss_terms", "models", "policy_kwargs", "extra_sets", "schedules", "env_task")


def _positive(config, keys: tuple[str, ...], minimum: int = 1) -> None:
  for key in keys:
    section, field = key.rsplit(".", 1)
    value = config[section][field]
    if value < minimum:
      raise ConfigError(f"{key}={value} must be >= {minimum}.")


def _check_task(config, where: str = "task") -> None:
  """The task is built from task.name and task.kwargs now, so a bad parameter fails before any work."""
  choice(config.task.name, TASKS, f"{where}.name")
  kwargs = task_kwargs(config)
  if "path" in kwargs and not kwargs["path"]:
    raise ConfigError(f"{where}.name={config.task.name!r} needs a file: data.train_jsonl (and data.test_jsonl "
                      "for evaluation), or for a stage's own task, its task.kwargs.path.")
  try:
    task = make_task(config.task.name, **kwargs)
  except (ValueError, TypeError, FileNotFoundError) as e:
    raise ConfigError(f"{where}.kwargs: {e}") from None
  for set_name, overrides in config.eval.extra_sets.items():
    if where != "task":
      break                          # the sets are the run task's, checked once
    if not set_name.isidentifier() or split_files(config.task.name) is not None:
      raise ConfigError(f"eval.extra_sets.{set_name}: a set needs a plain name (letters, digits, _) and a task "
                        f"that generates its data (task {config.task.name!r} serves files: give its test "
                        "file as data.test_jsonl instead).")
    if not isinstance(overrides, (dict, ml_collections.ConfigDict)):
      raise ConfigError(f"eval.extra_sets.{set_name} must map task kwargs to values, e.g. "
                        f"{{\"min_digits\": 3}}; got {overrides!r}.")
    try:
      make_task(config.task.name, **{**kwargs, **dict(overrides)})
    except (ValueError, TypeError) as e:
      raise ConfigError(f"eval.extra_sets.{set_name}: {e}") from None
  if config.eval.by_category and not callable(getattr(task, "category", None)):
    raise ConfigError(f"eval.by_category=True, but the task {config.task.name!r} has no categories (no "
                      "category(example) method); set eval.by_category=False.")


def _check_path(path: str, key: str) -> None:
  if path and not os.path.exists(path):
    raise ConfigError(f"{key}={path!r} does not exist; give a Hugging Face folder, an rlkit workdir or an "
                      "rlkit checkpoint directory (or leave it empty to build the model from the fields).")
  if path:
    try:
      resolve_source(path)
    except (ValueError, FileNotFoundError) as e:
      raise ConfigError(f"{key}: {e}") from None


def _check_tokenizer(config) -> None:
  """The tokenizer loads, and a Hugging Face model gets its own tokenizer (a char tokenizer would run, with
  ids that mean nothing to it)."""
  _check_path(config.model.path, "model.path")
  hf_model = bool(config.model.path) and resolve_source(config.model.path)[0] == "hf"
  if hf_model and config.tokenizer.kind != "hf":
    raise ConfigError(f"model.path={config.model.path!r} is a Hugging Face folder, but tokenizer.kind="
                      f"{config.tokenizer.kind!r}: the model needs its own tokenizer. Add "
                      "--config.tokenizer.kind=hf (tokenizer.path defaults to the model.path folder).")
  try:
    run_tokenizer(config)
  except (FileNotFoundError, ValueError) as e:
    raise ConfigError(f"tokenizer: {e}") from None


def _check_models(config) -> None:
  _check_path(config.model.path, "model.path")
  for name in config.stages:
    for role in config[name].get("score_roles", ()):
      if role not in config.models:
        raise ConfigError(f"{name}.score_roles names {role!r}, but config.models has no such role (roles: "
                          f"{', '.join(config.models.keys()) or 'none'}).")
    for role, why in section_roles(config[name], name):
      if role not in config.models:
        raise ConfigError(f"{why}, but config.models has no such role (roles: "
                          f"{', '.join(config.models.keys()) or 'none'}); declare config.models.{role} (path: a "
                          "Hugging Face folder or an rlkit workdir).")
  for name in config.stages:
    reward = config[name].get("reward")
    if reward is not None:
      for key in getattr(REWARDS.get(reward.name), "role_kwargs", ()) if reward.name in REWARDS else ():
        role = reward.kwargs.get(key, "")
        if role and role not in config.models:
          raise ConfigError(f"{name}.reward.kwargs.{key}={role!r}: reward {reward.name!r} uses that model, but "
                            f"config.models has no such role (roles: {', '.join(config.models.keys()) or 'none'}); "
                            f"declare it as config.models.{role} (path: a Hugging Face folder or rlkit workdir).")
  trained, optional = set(), {}
  for name in config.stages:
    optional.update({role: f"{name}.{section}" for role, section in section_trains(config[name]).items()})
    kind = config[name].get("kind")
    for role in STAGES.get(kind).roles(config[name]) if kind in STAGES else ():
      trained.add(role)
      if role not in config.models or not config.models[role].trainable:
        raise ConfigError(f"{name}: the {kind} stage trains the model of role {role!r} beside its policy; declare "
                          f"it as config.models.{role} with trainable=True (a checkpoint or an architecture with the "
                          "policy's tokenizer).")
  if not config.models.keys():
    return
  for role in config.models.keys():
    section = config.models[role]
    _check_section(section, role_model_defaults(), f"models.{role}")
    _check_path(section.path, f"models.{role}.path")
    if section.tokenizer.kind:
      choice(section.tokenizer.kind, TOKENIZERS, f"models.{role}.tokenizer.kind")
    try:
      role_tokenizer(section, f"models.{role}")
    except (FileNotFoundError, ValueError) as e:
      raise ConfigError(f"models.{role}.tokenizer: {e}") from None
    if section.trainable and role not in trained and role not in optional:
      raise ConfigError(f"models.{role}.trainable=True: only the roles a stage or a component trains are trained "
                        f"(here: {', '.join(sorted(trained | set(optional))) or 'none'}; e.g. graft's peer, "
                        "rquest's proposer, the critic of rl.advantage='gae'); set it to False.")
    if role in optional and not section.trainable:
      raise ConfigError(f"models.{role} is trained by {optional[role]} (from these weights); set "
                        f"models.{role}.trainable=True.")


def _check_numerics(config) -> None:
  """The model's low-precision fields (TransformerConfig checks them again when it builds), and the stages'
  settings that must agree with them: TRACE needs FP4 experts, and the sampler's FP4 copy must quantize the
  layers the trainer does."""
  model = config.model
  for key, choices in (("expert_quant", EXPERT_QUANTS), ("trace_record", TRACE_RECORDS),
                       ("kv_cache_dtype", KV_CACHE_DTYPES)):
    if model[key] not in choices:
      raise ConfigError(f"model.{key}={model[key]!r}; choose one of {', '.join(map(repr, choices))}.")
  layers = tuple(model.expert_quant_layers)
  if not all(isinstance(i, int) and i >= 0 for i in layers):
    raise ConfigError(f"model.expert_quant_layers={layers} must list decoder layer indices (ints >= 0), or be () "
                      "for every MoE layer.")
  for name in config.stages:
    section = config[name]
    if section.get("moe", {}).get("trace", False) and not model.expert_quant:
      raise ConfigError(f"{name}.moe.trace=True rounds the FP4 experts as the rollout did, but model.expert_quant "
                        f"is ''; set model.expert_quant (nvfp4 or mxfp4), or {name}.moe.trace=False.")
    sync = section.get("sync")
    if (model.expert_quant and sync is not None and sync.get("quantizer", "none") != "none"
        and tuple(sync.get("quant_layers", ())) != layers):
      raise ConfigError(f"{name}.sync.quant_layers={tuple(sync.quant_layers)} differs from model.expert_quant_layers="
                        f"{layers}: the sampler's FP4 copy and the trainer's FP4 experts must cover the same layers; "
                        f"set both to the same indices (() for every layer).")


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError on the first problem; reads a JSONL task's file but writes nothing, starts no device."""

  base = base_config()
  stages = tuple(config.get("stages", ()))
  if not stages:
    raise ConfigError("config.stages is empty; list the stage sections to run, e.g. ('sft', 'rl').")
  for key in config.keys():
    section = config[key]
    is_stage = isinstance(section, ml_collections.ConfigDict) and "kind" in section
    if key not in base and not is_stage:
      raise ConfigError(f"Unknown config key {key}. Valid top-level keys: {', '.join(closest_first(key, base))}, "
                        f"plus stage sections (sections with a `kind`; config.stages runs {', '.join(stages)}).")
  for key in base.keys():
    if key == "stages":
      continue
    if key not in config:
      raise ConfigError(f"Missing config section {key}.")
    if key in FREE_FORM:
      continue
    if isinstance(base[key], ml_collections.ConfigDict):
      _check_section(config[key], base[key], key)
    elif not _same_type(config[key], base[key]):
      raise ConfigError(f"{key}={config[key]!r} has type {type(config[key]).__name__}; expected "
                        f"{type(base[key]).__name__}.")
  for name in stages:
    if name not in config:
      raise ConfigError(f"config.stages names {name!r} but there is no config.{name} section.")
  kinds = {}
  for name in [k for k in config.keys() if k not in base]:
    section = config[name]
    choice(section.get("kind", None), STAGES, f"{name}.kind")
    stage = STAGES.get(section.kind)
    kinds[name] = stage
    _check_section(section, stage.defaults(), name)
    check_optimizer(section.optimizer, f"{name}.optimizer")
    if section.steps < 0:
      raise ConfigError(f"{name}.steps={section.steps} must be >= 0.")
    stage.validate(section, name)
  needs = {need for name in stages for need in kinds[name].needs}
  if "tokenizer" in needs:
    choice(config.tokenizer.kind, TOKENIZERS, "tokenizer.kind")
    _check_tokenizer(config)
  if "task" in needs:
    _check_task(config)
    for name in stages:
      if stage_config(config, name) is not config:
        _check_task(stage_config(config, name), f"{name}.task")
  if "data" in needs:
    _positive(config, ("data.num_train",))
    _positive(config, ("data.num_test", "data.max_prompt_len"), 0)
  if "model" in needs:
    for dt_key in ("param_dtype", "dtype"):
      if config.model[dt_key] not in ("float32", "bfloat16"):
        raise ConfigError(f"model.{dt_key}={config.model[dt_key]!r}; choose float32 or bfloat16.")
    if config.model.attention not in ATTENTION_IMPLS:
      raise ConfigError(f"model.attention={config.model.attention!r}; choose one of "
                        f"{', '.join(ATTENTION_IMPLS)}.")
    if config.model.attention == "cpu_kernel" and not config.model.path and config.model.head_dim % 32:
      raise ConfigError(f"model.attention='cpu_kernel' needs model.head_dim % 32 == 0 (got "
                        f"{config.model.head_dim}); use model.attention='xla'.")
    _check_numerics(config)
  _check_models(config)
  try:
    check_lora(config)
  except ValueError as e:
    raise ConfigError(str(e)) from None
  if config.wandb.mode not in ("disabled", "offline", "online"):
    raise ConfigError(f"wandb.mode={config.wandb.mode!r}; choose one of disabled, offline, online.")
  if config.mesh.cpu_devices < 0:
    raise ConfigError(f"mesh.cpu_devices={config.mesh.cpu_devices} must be >= 0 (0 keeps JAX's default).")
  _positive(config, ("eval.num_examples", "eval.batch_size", "eval.max_new_tokens"))
  _positive(config, ("eval.pass_k", "eval.pass_n", "eval.log_samples", "checkpoint.every"), 0)
  _positive(config, ("checkpoint.max_to_keep",))
  if config.eval.pass_n and config.eval.pass_n < config.eval.pass_k:
    raise ConfigError(f"eval.pass_n={config.eval.pass_n} must be 0 or >= eval.pass_k={config.eval.pass_k}.")


def validate_for_processes(config: ml_collections.ConfigDict, processes: int) -> None:
  """What depends on the number of processes (known once jax.distributed is up): each process takes an
  equal slice of every global batch."""
  if processes == 1:
    return
  sizes = {"eval.batch_size": min(config.eval.batch_size, config.eval.num_examples)}
  for name in config.stages:
    section = config[name]
    for key in ("batch_size", "prompts_per_step"):
      if key in section:
        sizes[f"{name}.{key}"] = section[key]
    if section.get("filter", "none") != "none":
      raise ConfigError(f"{name}.filter={section.filter!r} is not supported with {processes} processes yet (its "
                        "keep-or-resample decision is per host); use filter='none' or one process.")
  for key, value in sizes.items():
    if value % processes:
      raise ConfigError(f"{key}={value} must be a multiple of the {processes} processes (each takes an equal "
                        "slice of every batch).")
