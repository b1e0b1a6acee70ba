"""The run config: every section's fields with their defaults and one comment each, and how a run reads it.

Experiment configs (`configs/*.py`) start from `base_config()` and the stage defaults here and only change
values, so each field is documented once, in this file. `rlkit.train.config_checks.validate(config)` runs
before any work: unknown keys (a typo in a config file), wrong types and unknown registry names fail with one
`ConfigError` naming the key, what is wrong, and the valid choices.
"""
from __future__ import annotations

import os
from typing import Optional

import ml_collections

from rlkit.models.lora import lora_defaults
from rlkit.optim.optimizers import optimizer_defaults


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
  c.upcycle_experts = 0         # >0: the dense model's MLPs become this many experts (rlkit/models/upcycle.py)
  c.upcycle_k = 2               # top-k of the upcycled MoE
  c.upcycle_noise = 0.0         # experts perturbed by this x N(0, 1) x each kernel's RMS (0: exact copies)
  c.expert_quant = ""           # MoE experts on FP4 values: "" | nvfp4 | mxfp4 (weights and activations fake-
                                # quantized in training, activations in the sampler; rl.moe.trace; a loaded
                                # model takes it and the three fields below too)
  c.expert_quant_layers = ()    # the MoE layers (decoder indices) expert_quant applies to; (): every MoE layer
                                # (rl.sync.quant_layers must name the same for the sampler's FP4 copy)
  c.trace_record = "codes"      # the rollout's FP4 record: codes (whole E2M1 codes, moe/codeword_mismatch) |
                                # bits (TRACE's hint, the codes' LSBs 8 to a byte: 1/8 the payload, moe/hint_mismatch)
  c.kv_cache_dtype = ""         # the sampler's KV cache: "" (= dtype) | float32 | bfloat16 | float8_e4m3fn |
                                # float8_e5m2 (saturating, no scales: half a bf16 cache's memory)
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
  c.pack = False                # concatenate examples into full rows of max_len tokens (pretraining: data/packing.py)
  c.loss_on = "completion"      # targets: completion (+ EOS) | all (every token: pretraining models the prompts too)
  c.turn_pattern = ""           # regex naming the turns of multi-turn text, each encoded apart as the multi-turn
                                # collector does (e.g. "<act>[^<]*</act>(?=<obs>)"; rlkit/data/turns.py); "": whole
  c.eval_every = 0              # evaluate every N steps (0: only at the end of the stage)
  c.stop_at_loss = 0.0          # end the stage early once the moving average of the loss is below this (0: off)
  c.task = ml_collections.ConfigDict()   # this stage's own task (and data), overriding the run's `task`
  c.task.name = ""              # "" keeps the run's task; else a task registry name (jsonl: kwargs.path)
  c.task.kwargs = ml_collections.ConfigDict()   # that task's parameters
  c.max_skipped_updates = 10    # stop after this many update steps in a row with a non-finite loss/grad (0: never)
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
  c.eval.log_samples = 4        # greedy rows (prompt, completion) per eval set to console, samples.jsonl, wandb (0: off)
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
  kwargs = config.task.kwargs
  kwargs = kwargs.to_dict() if hasattr(kwargs, "to_dict") else dict(kwargs)   # nested sections as plain dicts
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
