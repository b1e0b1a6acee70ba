"""The run config: every section's fields with their defaults and one comment each, and validation.

Experiment configs (`configs/*.py`) start from `base_config()` and the stage defaults here and only change
values, so each field is documented once, in this file. `validate(config)` runs before any work: unknown
keys (a typo in a config file), wrong types and unknown registry names fail with one message naming the key,
what is wrong, and the valid choices.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import ml_collections

from rlkit.core.registry import closest_first
from rlkit.objectives.correction import correction_defaults
from rlkit.models.lora import check_run as check_lora
from rlkit.models.lora import lora_defaults
from rlkit.optim.optimizers import OPTIMIZERS, SCHEDULES, optimizer_defaults
from rlkit.optim.optimizers import check as optimizer_check
from rlkit.rollout.mismatch import mismatch_defaults
from rlkit.train.distill import distill_defaults
from rlkit.train.onepo import onepo_defaults
from rlkit.train.weight_sync import sampler_sync_defaults


def model_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.path = ""                   # load this instead of building from the fields below: a Hugging Face folder,
                                # an rlkit workdir (its newest checkpoint) or an rlkit checkpoint directory
  c.vocab_size = 0              # 0: take the tokenizer's vocabulary size
  c.hidden_size = 128           # model width D
  c.intermediate_size = 384     # SwiGLU width F
  c.num_layers = 2              # decoder layers
  c.num_heads = 4               # query heads
  c.num_kv_heads = 2            # key/value heads (GQA)
  c.head_dim = 32               # per-head width
  c.rope_theta = 10_000.0       # RoPE base
  c.rms_norm_eps = 1e-6         # RMSNorm epsilon
  c.tie_word_embeddings = True  # share the embedding with the LM head
  c.num_experts = 0             # >0: Qwen3-MoE layers with this many experts
  c.num_experts_per_tok = 0     # top-k experts per token (MoE)
  c.moe_intermediate_size = 0   # expert SwiGLU width (MoE)
  c.param_dtype = "float32"     # parameter (master weight) dtype
  c.dtype = "float32"           # compute dtype: float32 | bfloat16
  c.attention = "xla"           # training/scoring attention: xla | cpu_kernel (C++ kernel for XLA:CPU, g++)
  c.lora = lora_defaults()      # LoRA adapters of a trained model (fields: rlkit/models/lora.py)
  return c


def sft_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "sft"                # stage kind (registry STAGES)
  c.steps = 100                 # optimizer steps
  c.batch_size = 32             # sequences per step
  c.micro_batches = 1           # gradient accumulation slices per step
  c.max_len = 32                # tokens per SFT sequence (prompt + completion + EOS), padded (0: the data's longest)
  c.eval_every = 0              # evaluate every N steps (0: only at the end of the stage)
  c.stop_at_loss = 0.0          # end the stage early once the moving average of the loss is below this (0: off)
  c.task = ml_collections.ConfigDict()   # this stage's own task (and data), overriding the run's `task`
  c.task.name = ""              # "" keeps the run's task; else a task registry name (jsonl: kwargs.path)
  c.task.kwargs = ml_collections.ConfigDict()   # that task's parameters
  c.max_skipped_updates = 10    # stop after this many update steps in a row with a non-finite loss/grad (0: never)
  c.optimizer = optimizer_defaults()
  return c


def critic_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.value_clip = 0.5            # clip of the new values around the old ones in the value loss (verl's default)
  c.optimizer = optimizer_defaults()
  return c


def rl_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "rl"                 # stage kind (registry STAGES)
  c.steps = 50                  # RL iterations (sample -> score -> update)
  c.prompts_per_step = 16       # distinct prompts per iteration
  c.group_size = 8              # completions per prompt (G)
  c.max_new_tokens = 8          # response budget; also the Dr. GRPO length constant
  c.task = ml_collections.ConfigDict()   # this stage's own task (and data), overriding the run's `task`
  c.task.name = ""              # "" keeps the run's task; else a task registry name (jsonl: kwargs.path)
  c.task.kwargs = ml_collections.ConfigDict()   # that task's parameters
  c.temperature = 1.0           # sampling temperature (the trainer scores at the same temperature)
  c.top_k = 0                   # sampler top-k (0: off)
  c.top_p = 1.0                 # sampler nucleus mass (1: off)
  c.reward = ml_collections.ConfigDict()   # the reward function and how its host-side code runs
  c.reward.name = "verifier"    # reward function (registry REWARDS): verifier | verifier_format | rubric |
                                # constraints | calif | tips_outcome | step_labels | reward_model
                                # (rlkit/rewards/catalog.py)
  c.reward.kwargs = ml_collections.ConfigDict()   # the reward's own parameters
  c.reward.timeout_s = 30.0     # wall-time limit of the host-side verifier on one row (0: none, runs inline)
  c.reward.call_timeout_s = 0.0  # limit of one whole batched verifier call; rows left then fail (0: none)
  c.advantage = "group"         # group | batch | none (Dr. GRPO) | rloo | reinforce_pp | reinforce_pp_baseline |
                                # gae (PPO with a critic: trains rl.critic beside the policy)
  c.adv_eps = 1e-6              # std epsilon of the group/batch advantage
  c.gamma = 1.0                 # discount of the token rewards (gae, reinforce_pp)
  c.gae_lambda = 1.0            # GAE lambda (gae; 1: Monte-Carlo returns minus values)
  c.whiten_advantages = True    # gae: advantages to mean 0 / std 1 over the batch's loss tokens (verl does)
  c.critic = critic_defaults()  # the value model of advantage=gae
  c.policy_loss = "ppo_clip"    # ppo_clip | gspo | gspo_token | gmpo | cispo | cispo_trl | sapo
  c.policy_kwargs = ml_collections.ConfigDict()   # the policy loss's own parameters (e.g. sapo: tau_pos)
  c.eps_low = 0.2               # lower clip range (ratio >= 1 - eps_low)
  c.eps_high = 0.2              # upper clip range (DAPO clip-higher: eps_high > eps_low)
  c.dual_clip = 0.0             # dual-clip constant for negative advantages (0: off; verl uses 3)
  c.aggregation = "token-mean"  # token-mean | seq-mean-token-mean | seq-mean-token-sum | seq-mean-token-sum-norm
  c.kl_beta = 0.0               # weight of the KL penalty to the stage's initial policy (0: no reference)
  c.kl_estimator = "k3"         # k1 | k2 | k3
  c.entropy_coef = 0.0          # entropy bonus weight
  c.loss_terms = ml_collections.ConfigDict()   # extra loss terms (registry LOSS_TERMS): name -> weight
  c.ppo_epochs = 1              # passes over each iteration's rollouts
  c.minibatches = 1             # optimizer steps per epoch (rollouts split into this many minibatches)
  c.micro_batches = 1           # gradient accumulation slices per minibatch
  c.correction = correction_defaults()   # sampler -> trainer off-policy correction (weights, rejections)
  c.rollout_mismatch = mismatch_defaults()   # a simulated inference engine: the sampler's perturbed copy
  c.filter = "none"             # group filter (registry FILTERS): none | dynamic_sampling (DAPO: drop
                                # zero-variance groups and sample more prompts to refill)
  c.max_sampling_rounds = 4     # cap on extra sampling rounds of a filter that asks for more
  c.augment = "none"            # rows added to each group (registry AUGMENTERS): none | demonstration | onepo
  c.onepo = onepo_defaults()    # OnePO's guidance (augment=onepo, advantage=mixed_group, shaped_offpolicy)
  c.surrogate_rows = ("policy", "teacher", "peer")   # row sources the clipped surrogate trains on
  c.replay_routing = False      # MoE: the trainer reuses the sampler's expert choices (scoring and update)
  c.distill = distill_defaults()   # on-policy distillation from a teacher role (advantage opd, loss terms opd,
                                # reverse_kl, forward_kl, jsd; rlkit/train/distill.py)
  c.score_roles = ()            # models (config.models roles) whose log-probs of the responses the loss terms
                                # read, as TrainBatch.extras["<role>_logp"] (e.g. a teacher for distillation)
  c.overlong_cache = 0          # DAPO soft overlong penalty over the last N tokens of the budget (0: off)
  c.overlong_factor = 1.0       # penalty at the full budget
  c.eval_every = 0              # evaluate every N iterations (0: only at the end of the stage)
  c.max_skipped_updates = 10    # stop after this many update steps in a row with a non-finite loss/grad (0: never)
  c.sync = sampler_sync_defaults()   # the sampler's own weight copy and its sync (rlkit/train/weight_sync.py)
  c.optimizer = optimizer_defaults()
  return c


def base_config() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.seed = 0                    # every random draw derives from this
  c.stages = ("sft", "rl")      # stage section names, run in order; each section's `kind` says what it is
  c.tokenizer = ml_collections.ConfigDict()
  c.tokenizer.kind = "char"     # char | hf
  c.tokenizer.path = ""         # tokenizer.json or its folder (hf; "" = the model.path folder's)
  c.task = ml_collections.ConfigDict()
  c.task.name = "arithmetic"    # task registry name: arithmetic | countdown | jsonl
  c.task.kwargs = ml_collections.ConfigDict()   # the task's own parameters (e.g. ops, max_digits)
  c.data = ml_collections.ConfigDict()
  c.data.num_train = 20_000     # generated training examples (synthetic tasks)
  c.data.num_test = 500         # generated held-out examples
  c.data.train_jsonl = ""       # user data: a JSONL file of {"prompt", "answer"} rows (task.name = jsonl)
  c.data.test_jsonl = ""        # held-out JSONL file (task.name = jsonl)
  c.data.dir = ""               # where the array_record files go ("" = WORKDIR/data)
  c.data.max_prompt_len = 16    # prompt tokens, left-padded (0: the data's longest prompt)
  c.model = model_defaults()
  c.models = ml_collections.ConfigDict()   # more models by role (reference, teacher, ...): role -> model section
  c.mesh = ml_collections.ConfigDict()
  c.mesh.data = -1              # data-parallel axis (-1: all remaining devices)
  c.mesh.fsdp = 1               # parameter-sharding axis
  c.mesh.tensor = 1             # tensor-parallel axis
  c.mesh.cpu_devices = 0        # CPU only: split the host into N XLA devices, e.g. one per core (0: JAX default)
  c.eval = ml_collections.ConfigDict()
  c.eval.num_examples = 256     # held-out prompts per evaluation
  c.eval.batch_size = 256       # prompts per sampler call
  c.eval.pass_k = 4             # k of pass@k (0: skip)
  c.eval.pass_n = 0             # samples per prompt for the unbiased pass@k estimator, n >= k (0: n = k)
  c.eval.max_new_tokens = 8     # response budget at evaluation
  c.eval.by_category = False    # also eval/accuracy/<category> per the task's category(example) (arithmetic: operators)
  c.eval.extra_sets = ml_collections.ConfigDict()   # more held-out sets: name -> task.kwargs overrides
  # (e.g. {"long": {"min_digits": 4, "max_digits": 4}}), each the test split of the run's task with those
  # kwargs, evaluated beside the main one as eval/<name>/...; not checked against the training data (overrides
  # that overlap the training distribution may share its prompts)
  c.checkpoint = ml_collections.ConfigDict()
  c.checkpoint.every = 50       # save every N global steps (and at the end of every stage)
  c.checkpoint.max_to_keep = 2  # newest checkpoints kept (the last one of every stage is kept besides)
  c.wandb = ml_collections.ConfigDict()
  c.wandb.mode = "offline"      # disabled | offline | online
  c.wandb.project = "rlkit"     # wandb project name
  c.progress = True             # tqdm progress bar
  return c


# --------------------------------------------------------------------------------------------- validation

class ConfigError(ValueError):
  """A user mistake in the config; the message names the key and the fix."""


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
# section), eval.extra_sets (set name -> task kwargs).
FREE_FORM = ("kwargs", "loss_terms", "models", "policy_kwargs", "extra_sets")


def set_dotted(section, key: str, value) -> None:
  """`section` with `key` set, a dotted path through nested sections ("critic.optimizer.lr")."""
  *path, last = key.split(".")
  for part in path:
    section = section[part]
  section[last] = value


def sibling_config(file: str, name: str):
  """The config module `name`.py beside config file `file`, loaded by path: launch.py loads config files by
  path, not as a package, so a config that builds on another (configs/baselines.py on grpo_arith.py) loads
  it this way and works wherever the folder is."""
  import importlib.util
  spec = importlib.util.spec_from_file_location(f"rlkit_config_{name}", os.path.join(os.path.dirname(file),
                                                                                      f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def choice(value: str, registry, key: str) -> None:
  """ConfigError naming `key` and the valid names unless `value` is registered."""
  try:
    registry.check(value, key)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def check_optimizer(section, where: str) -> None:
  choice(section.name, OPTIMIZERS, f"{where}.name")
  choice(section.schedule, SCHEDULES, f"{where}.schedule")
  if section.lr <= 0:
    raise ConfigError(f"{where}.lr={section.lr} must be > 0.")
  try:
    optimizer_check(section, where)
  except ValueError as e:
    raise ConfigError(str(e)) from None


def _positive(config, keys: tuple[str, ...], minimum: int = 1) -> None:
  for key in keys:
    section, field = key.rsplit(".", 1)
    value = config[section][field]
    if value < minimum:
      raise ConfigError(f"{key}={value} must be >= {minimum}.")


def split_files(task_name: str) -> Optional[dict[str, str]]:
  """{split: `data` key of its file} for a task that serves files (its class's `SPLIT_FILES`, e.g. jsonl's
  train_jsonl / test_jsonl), else None: the task generates its splits."""
  from rlkit.data import TASKS
  return getattr(TASKS.get(task_name), "SPLIT_FILES", None) if task_name in TASKS else None


def stage_config(config: ml_collections.ConfigDict, name: str) -> ml_collections.ConfigDict:
  """The run config as stage `name` sees it: with the stage's own `task` (and, for a task that serves files,
  its `kwargs.path` as the training file, no test file) when `<name>.task.name` is set; else `config`."""
  own = config[name].get("task")
  if own is None or not own.name:
    return config
  c = ml_collections.ConfigDict(config.to_dict())
  kwargs = dict(own.kwargs)
  keys = split_files(own.name)
  if keys:
    for split, key in keys.items():
      c.data[key] = kwargs.pop("path", "") if split == "train" else ""
  c.task = ml_collections.ConfigDict({"name": own.name, "kwargs": kwargs})
  return c


def extra_set_config(config, name: str) -> ml_collections.ConfigDict:
  """The run config whose task (and test split) is eval.extra_sets[name]: task.kwargs with the set's overrides.
  Its train split is one example (only its test split is read; the test split does not depend on it)."""
  c = ml_collections.ConfigDict(config.to_dict())
  c.task.kwargs.update(dict(config.eval.extra_sets[name]))
  c.data.num_train = 1
  return c


def task_kwargs(config) -> dict:
  """The task's constructor arguments: `task.kwargs`, plus the training file as `path` for a task that serves
  files (see `split_files`)."""
  kwargs = dict(config.task.kwargs)
  keys = split_files(config.task.name)
  if keys:
    kwargs["path"] = config.data[keys["train"]]
  return kwargs


def data_files(config) -> Optional[dict[str, str]]:
  """{split: path} when the task serves files (the train file always, the others when set), else None."""
  keys = split_files(config.task.name)
  if keys is None:
    return None
  return {split: config.data[key] for split, key in keys.items() if split == "train" or config.data[key]}


def _check_task(config, where: str = "task") -> None:
  """The task is built from task.name and task.kwargs now, so a bad parameter fails before any work."""
  from rlkit.data.tasks import TASKS, make_task
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
    from rlkit.train.models import resolve_source
    try:
      resolve_source(path)
    except (ValueError, FileNotFoundError) as e:
      raise ConfigError(f"{key}: {e}") from None


def _check_tokenizer(config) -> None:
  """The tokenizer loads, and a Hugging Face model gets its own tokenizer (a char tokenizer would run, with
  ids that mean nothing to it)."""
  from rlkit.train.models import resolve_source, run_tokenizer
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
    if "distill" in config[name]:
      from rlkit.train.distill import distill_roles
      for role in distill_roles(config[name]):
        if role not in config.models:
          raise ConfigError(f"{name}.distill.teacher={role!r}: the stage distils from that model ({name}.advantage="
                            f"{config[name].advantage!r}, loss terms {list(config[name].loss_terms.keys())}), but "
                            f"config.models has no such role; declare config.models.{role} (path: a Hugging Face "
                            "folder or an rlkit workdir).")
  for name in config.stages:
    reward = config[name].get("reward")
    if reward is not None:
      from rlkit.rewards import REWARDS
      for key in getattr(REWARDS.get(reward.name), "role_kwargs", ()) if reward.name in REWARDS else ():
        role = reward.kwargs.get(key, "")
        if role and role not in config.models:
          raise ConfigError(f"{name}.reward.kwargs.{key}={role!r}: reward {reward.name!r} uses that model, but "
                            f"config.models has no such role (roles: {', '.join(config.models.keys()) or 'none'}); "
                            f"declare it as config.models.{role} (path: a Hugging Face folder or rlkit workdir).")
  from rlkit.train.stages import STAGES
  trained = set()
  for name in config.stages:
    kind = config[name].get("kind")
    for role in STAGES.get(kind).roles(config[name]) if kind in STAGES else ():
      trained.add(role)
      if role not in config.models or not config.models[role].trainable:
        raise ConfigError(f"{name}: the {kind} stage trains the model of role {role!r} beside its policy; declare "
                          f"it as config.models.{role} with trainable=True (a checkpoint or an architecture with the "
                          "policy's tokenizer).")
  for name in config.stages:
    teacher = config[name].get("onepo", {}).get("teacher", "demonstration")
    if config[name].get("augment") == "onepo" and teacher != "demonstration" and teacher not in config.models:
      raise ConfigError(f"{name}.onepo.teacher={teacher!r} is neither 'demonstration' nor a role of config.models "
                        f"(roles: {', '.join(config.models.keys()) or 'none'}).")
  if not config.models.keys():
    return
  from rlkit.models.tokenizer import TOKENIZERS
  from rlkit.train.models import role_model_defaults, role_tokenizer
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
    if section.trainable and role != "critic" and role not in trained:
      raise ConfigError(f"models.{role}.trainable=True: of the roles only `critic` (the value model of "
                        "rl.advantage='gae') and those a stage trains (graft.peer, rquest.proposer) are trained; set "
                        "it to False.")
    if role == "critic" and not section.trainable:
      raise ConfigError("models.critic is the value model that rl.advantage='gae' trains (from these weights); "
                        "set models.critic.trainable=True.")


def validate(config: ml_collections.ConfigDict) -> None:
  """Raises ConfigError on the first problem; reads a JSONL task's file but writes nothing, starts no device."""
  from rlkit.models.tokenizer import TOKENIZERS
  from rlkit.models.transformer import ATTENTION_IMPLS
  from rlkit.train.stages import STAGES

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
  _positive(config, ("eval.pass_k", "eval.pass_n", "checkpoint.every"), 0)
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
