"""The run driver: config -> tokenizer, task, data, model, mesh -> stages in order, with resume.

`run(config, workdir)` is what `launch.py` calls after validation. If `workdir` holds a checkpoint, the run
resumes from it: finished stages are skipped, the interrupted stage continues from its saved step with its
saved optimizer state, data-iterator state and PRNG stream, and metrics.jsonl is cut back to that step, so the
resumed run produces exactly the rows an uninterrupted one would. At the end the curves are plotted to
`workdir/metrics.png`.
"""
from __future__ import annotations

import json
import os
from typing import Any

import jax
import ml_collections
import numpy as np

from rlkit.data.tasks import make_task
from rlkit.data.tfds_builders import prepare, prepare_jsonl
from rlkit.models.tokenizer import make_tokenizer
from rlkit.models.transformer import Transformer, TransformerConfig
from rlkit.parallel.mesh import mesh_from_config
from rlkit.parallel.rules import shard_batch, shard_params, sharded_init
from rlkit.train.checkpoint import Checkpointer
from rlkit.train.metrics import MetricsLogger, plot_metrics
from rlkit.train.stages import STAGES, Context


def build_tokenizer(config):
  kw = {"path": config.tokenizer.path} if config.tokenizer.kind == "hf" else {}
  return make_tokenizer(config.tokenizer.kind, **kw)


def build_task(config):
  kwargs = dict(config.task.kwargs)
  if config.task.name == "jsonl":
    kwargs["path"] = config.data.train_jsonl
  return make_task(config.task.name, **kwargs)


def build_data(config, workdir: str) -> dict:
  data_dir = config.data.dir or os.path.join(workdir, "data")
  if config.task.name == "jsonl":
    splits = {"train": config.data.train_jsonl}
    if config.data.test_jsonl:
      splits["test"] = config.data.test_jsonl
    return prepare_jsonl(splits, data_dir)
  return prepare(config.task.name, dict(config.task.kwargs), config.data.num_train, config.data.num_test,
                 config.seed, data_dir)


def build_model(config, tokenizer, key, mesh):
  """(module, params): from a Hugging Face folder, or initialised from the config fields (sharded)."""
  m = config.model
  if m.hf_path:
    from rlkit.models import hf
    module, params = hf.load(m.hf_path, dtype=m.dtype, param_dtype=m.param_dtype, attention=m.attention)
    return module, shard_params(params, mesh)
  vocab = m.vocab_size or tokenizer.vocab_size
  if vocab < tokenizer.vocab_size:
    raise ValueError(f"model.vocab_size={vocab} is smaller than the tokenizer's {tokenizer.vocab_size}.")
  cfg = TransformerConfig(
      vocab_size=vocab, hidden_size=m.hidden_size, intermediate_size=m.intermediate_size,
      num_layers=m.num_layers, num_heads=m.num_heads, num_kv_heads=m.num_kv_heads, head_dim=m.head_dim,
      rope_theta=m.rope_theta, rms_norm_eps=m.rms_norm_eps, tie_word_embeddings=m.tie_word_embeddings,
      num_experts=m.num_experts, num_experts_per_tok=m.num_experts_per_tok,
      moe_intermediate_size=m.moe_intermediate_size, param_dtype=m.param_dtype, dtype=m.dtype,
      attention=m.attention)
  module = Transformer(cfg)
  init = lambda k: module.init(k, np.zeros((1, 1), np.int32))["params"]  # noqa: E731
  return module, sharded_init(init, key, mesh)


def _stage_offsets(config) -> list[int]:
  offsets, total = [], 0
  for name in config.stages:
    offsets.append(total)
    total += config[name].steps
  return offsets


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs every stage of `config` in `workdir` (resuming if a checkpoint is there). Returns final eval."""
  os.makedirs(workdir, exist_ok=True)
  key = jax.random.key(config.seed)
  mesh = mesh_from_config(config.mesh)
  if jax.process_index() == 0:
    print(f"mesh {dict(mesh.shape)} over {mesh.size} {mesh.devices.flat[0].platform} device(s)", flush=True)
  tokenizer = build_tokenizer(config)
  task = build_task(config)
  sources = build_data(config, workdir)
  eval_records = []
  if "test" in sources:
    test = sources["test"]
    eval_records = [test[i] for i in range(min(config.eval.num_examples, len(test)))]
  with jax.set_mesh(mesh):
    model, params = build_model(config, tokenizer, jax.random.fold_in(key, 1), mesh)
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), config.checkpoint.every,
                                config.checkpoint.max_to_keep)
    resume_step = checkpointer.latest_step()
    logger = MetricsLogger(workdir, config.wandb.mode, config.wandb.project, config.to_dict(), resume_step,
                           progress=config.progress)
    ctx = Context(config=config, model=model, tokenizer=tokenizer, task=task, train_source=sources["train"],
                  eval_records=eval_records, logger=logger, checkpointer=checkpointer,
                  key=jax.random.fold_in(key, 2), put_batch=lambda b: shard_batch(b, mesh))
    resume_meta = None
    if resume_step is not None:
      resume_meta = json.loads(json.dumps(checkpointer.restore_meta(resume_step)))
    try:
      params = _run_stages(ctx, config, params, resume_step, resume_meta)
    finally:
      logger.close()
      checkpointer.close()
  plot_metrics(logger.path, os.path.join(workdir, "metrics.png"))
  rows = [json.loads(line) for line in open(logger.path)]
  evals = [r for r in rows if "eval/accuracy" in r]
  return evals[-1] if evals else {}


def _run_stages(ctx: Context, config, params, resume_step, resume_meta) -> Any:
  offsets = _stage_offsets(config)
  for index, name in enumerate(config.stages):
    cfg = config[name]
    stage = STAGES.get(cfg.kind)
    meta = {"stage": name, "stage_index": index, "offset": offsets[index], "seed": config.seed}
    start, done = 0, False
    if resume_meta is not None and resume_meta["stage_index"] > index:
      continue                                   # finished before the interruption
    state = stage.init(ctx, cfg, params)
    if resume_meta is not None and resume_meta["stage_index"] == index:
      state, saved = ctx.checkpointer.restore(resume_step, state)
      start, done = saved["stage_step"], saved.get("done", False)
      meta.update(iterator=saved.get("iterator"), loss_ema=saved.get("loss_ema"))
      resume_meta = None
    if start < cfg.steps and not done:
      state = stage.run(ctx, cfg, state, start, meta)
    params = state["train"].params
  return params
