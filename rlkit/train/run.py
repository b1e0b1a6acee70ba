"""The run driver: config -> tokenizer, task, data, models, mesh -> stages in order, with resume.

`run(config, workdir)` is what `launch.py` calls after validation. If `workdir` holds a checkpoint, the run
resumes from it: finished stages are skipped, the interrupted stage continues from its saved step with its
saved optimizer state, data-iterator state and PRNG stream, and metrics.jsonl is cut back to that step, so the
resumed run produces exactly the rows an uninterrupted one would. At the end the curves are plotted to
`workdir/metrics.png`. Only what the configured stages need (`Stage.needs`) is built. A run from `model.path`
says what it loaded (models.py, `loaded_line`) and evaluates that model once before its first stage's first
update (`eval_at_start`; a later stage starts where the previous one's final evaluation left it), so the
closing summary shows the stage's gain over the loaded model.

Multi-host: every process runs this with the same config; each reads its own slice of every batch, only
process 0 writes metrics, wandb and the plot, and all processes save and restore checkpoints together (as
Orbax expects).
"""
from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import ml_collections

from rlkit.data.tasks import make_task
from rlkit.data.tfds_builders import prepare, prepare_jsonl
from rlkit.parallel.mesh import mesh_from_config
from rlkit.parallel.rules import shard_batch
from rlkit.train.checkpoint import Checkpointer
from rlkit.train.config import data_files, extra_set_config, stage_config, task_kwargs
from rlkit.train.evaluate import evaluated_records
from rlkit.train.lengths import resolve_lengths
from rlkit.train.metrics import MetricsLogger
from rlkit.train.plot import plot_metrics
from rlkit.train.models import build_model, build_models, model_spec, run_tokenizer, tokenizer_spec
from rlkit.train.catalog import STAGES, stage_needs
from rlkit.train.stages import AT_STAGE_START, Context, is_headline


def build_task(config):
  return make_task(config.task.name, **task_kwargs(config))


def build_data(config, workdir: str) -> dict:
  data_dir = config.data.dir or os.path.join(workdir, "data")
  files = data_files(config)
  if files is not None:
    return prepare_jsonl(files, data_dir, required_fields=tuple(config.task.kwargs.get("required_fields", ())))
  return prepare(config.task.name, task_kwargs(config), config.data.num_train, config.data.num_test,
                 config.seed, data_dir)


def _stage_offsets(config) -> list[int]:
  offsets, total = [], 0
  for name in config.stages:
    offsets.append(total)
    total += config[name].steps
  return offsets


def _on_lead_first(build):
  """Runs `build` on process 0, then on the others (which then find its files written: no racing writers)."""
  if jax.process_count() == 1:
    return build()
  from jax.experimental import multihost_utils
  out = build() if jax.process_index() == 0 else None
  multihost_utils.sync_global_devices("rlkit: data prepared")
  return out if out is not None else build()


def extra_evals(config, workdir: str) -> dict:
  """eval.extra_sets: name -> (its task, the records of its test split it evaluates: `evaluated_records`)."""
  out = {}
  for name in config.eval.extra_sets.keys():
    own = extra_set_config(config, name)
    task = build_task(own)
    out[name] = (task, evaluated_records(task, _on_lead_first(lambda: build_data(own, workdir))["test"],
                                         config.eval.num_examples))
  return out


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
  """Runs every stage of `config` in `workdir` (resuming if a checkpoint is there). Returns final eval."""
  os.makedirs(workdir, exist_ok=True)
  key = jax.random.key(config.seed)
  mesh = mesh_from_config(config.mesh)
  lead = jax.process_index() == 0
  say = (lambda text: print(text, flush=True)) if lead else (lambda text: None)
  say(f"mesh {dict(mesh.shape)} over {mesh.size} {mesh.devices.flat[0].platform} device(s)"
      + (f" in {jax.process_count()} processes" if jax.process_count() > 1 else ""))
  needs = stage_needs(config)
  tokenizer = run_tokenizer(config) if "tokenizer" in needs else None
  if "data" in needs:
    config, notes = resolve_lengths(config, tokenizer)   # a no-op for a config launch.py resolved
    for note in notes:
      say(f"note: {note}")
  task = build_task(config) if "task" in needs else None
  sources = _on_lead_first(lambda: build_data(config, workdir)) if "data" in needs else {}
  test = sources.get("test", [])
  if "data" in needs and not len(test):
    say("warning: no held-out split (data.test_jsonl is empty): evaluation is off for this run.")
  eval_records = evaluated_records(task, test, config.eval.num_examples)
  extra = extra_evals(config, workdir) if "data" in needs else {}
  with jax.set_mesh(mesh):
    model, params = (build_model(config.model, tokenizer, jax.random.fold_in(key, 1), mesh, say=say)
                     if "model" in needs else (None, None))     # stages of their own policies (rlkit/embodied)
    models = build_models(config.models, tokenizer, jax.random.fold_in(key, 3), mesh, say=say)
    spec = model_spec(model.cfg, tokenizer_spec(config)) if model is not None else None
    checkpointer = Checkpointer(os.path.join(workdir, "checkpoints"), config.checkpoint.every,
                                config.checkpoint.max_to_keep, model_spec=spec)
    resume_step = checkpointer.latest_step()
    resume_meta = None
    if resume_step is not None:
      resume_meta = json.loads(json.dumps(checkpointer.restore_meta(resume_step)))
      say(_resume_line(config, workdir, resume_step, resume_meta))
    complete = _is_complete(config, resume_meta)
    logger = MetricsLogger(workdir, "disabled" if complete else config.wandb.mode, config.wandb.project,
                           config.to_dict(), resume_step, progress=config.progress and lead, enabled=lead)
    ctx = Context(config=config, model=model, tokenizer=tokenizer, task=task, train_source=sources.get("train"),
                  eval_records=eval_records, logger=logger, checkpointer=checkpointer,
                  key=jax.random.fold_in(key, 2), put_batch=lambda b: shard_batch(b, mesh), models=models,
                  workdir=workdir, extra_evals=extra)
    try:
      if not complete:
        params = _run_stages(ctx, config, params, resume_step, resume_meta)
    finally:
      logger.close()
      checkpointer.close()
  if not lead:
    return {}
  plot_metrics(logger.path, os.path.join(workdir, "metrics.png"))
  rows = [json.loads(line) for line in open(logger.path)]
  evals = [r for r in rows if "eval/accuracy" in r]
  for line in summary_lines(evals):
    say(line)
  return evals[-1] if evals else {}


def _is_complete(config, meta) -> bool:
  return meta is not None and meta["stage_index"] == len(config.stages) - 1 and bool(meta.get("done"))


def _resume_line(config, workdir: str, step: int, meta: dict) -> str:
  name = config.stages[meta["stage_index"]]
  if _is_complete(config, meta):
    return (f"{workdir} is complete: every stage finished (last checkpoint: global step {step}); nothing to "
            "run. Use a new --workdir to train again.")
  where = "finished" if meta.get("done") else f"at step {meta['stage_step']} of {config[name].steps}"
  return f"resuming {workdir} from its checkpoint at global step {step} (stage {name} {where})"


def summary_lines(evals: list[dict]) -> list[str]:
  """The last evaluation of every stage side by side: one line per stage, the same columns. A stage evaluated
  at its start (a loaded model: `AT_STAGE_START` rows) also gets that line, "<stage> start", and its gain."""
  start, last = {}, {}
  for row in evals:
    (start if row.get(AT_STAGE_START) else last)[row["stage"]] = row
  if not last and not start:
    return []
  keys = [k for k in dict.fromkeys(k for r in [*start.values(), *last.values()] for k in r) if is_headline(k)]
  table = []                                      # (label, step or None, cells)
  for stage in dict.fromkeys(r["stage"] for r in evals):
    first, end = start.get(stage), last.get(stage)
    for label, row in ((f"{stage} start", first), (stage, end)):
      if row is not None:
        table.append((label, row["step"], [f"{row[k]:>10.3f}" if _is_number(row.get(k)) else f"{'-':>10s}"
                                           for k in keys]))
    if first is not None and end is not None:
      table.append((f"{stage} gain", None, [f"{end[k] - first[k]:>+10.3f}" if _is_number(end.get(k)) and
                                            _is_number(first.get(k)) else f"{'-':>10s}" for k in keys]))
  width = max(8, *(len(label) for label, _, _ in table))
  note = "; \"start\": a loaded model before its first update" if start else ""
  lines = [f"summary (held-out evaluation at the end of each stage{note}):",
           "  " + f"{'stage':{width}s} {'step':>6s} " + " ".join(f"{k[len('eval/'):]:>10s}" for k in keys)]
  for label, step, cells in table:
    lines.append(f"  {label:{width}s} {'' if step is None else step:>6} {' '.join(cells)}")
  return lines


def _is_number(value) -> bool:
  return isinstance(value, (int, float))


def stage_context(ctx: Context, config, name: str) -> Context:
  """The run's context, or for a stage with its own `task` one with that task and its data."""
  own = stage_config(config, name)
  if own is config:
    return ctx
  sources = _on_lead_first(lambda: build_data(own, ctx.workdir))
  test = sources.get("test", [])
  task = build_task(own)
  return dataclasses.replace(ctx, task=task, train_source=sources["train"],
                             eval_records=evaluated_records(task, test, config.eval.num_examples))


def _run_stages(ctx: Context, config, params, resume_step, resume_meta) -> Any:
  offsets = _stage_offsets(config)
  for index, name in enumerate(config.stages):
    cfg = config[name]
    stage = STAGES.get(cfg.kind)
    meta = {"stage": name, "stage_index": index, "offset": offsets[index], "seed": config.seed,
            # A loaded model's starting point is evaluated (a later stage starts where the last one's final
            # evaluation left it), so the summary shows the stage's gain over it.
            "eval_at_start": index == 0 and bool(config.model.path)}
    start, done = 0, False
    if resume_meta is not None and resume_meta["stage_index"] > index:
      ctx.logger.say(f"stage {name}: already finished")
      continue
    state = stage.init(ctx, cfg, params)
    if resume_meta is not None and resume_meta["stage_index"] == index:
      state, saved = ctx.checkpointer.restore(resume_step, state)
      start, done = saved["stage_step"], saved.get("done", False)
      meta.update(iterator=saved.get("iterator"), loss_ema=saved.get("loss_ema"),
                  skipped_run=saved.get("skipped_run", 0))
      resume_meta = None
    if start < cfg.steps and not done:
      state = stage.run(stage_context(ctx, config, name), cfg, state, start, meta)
    elif done:
      ctx.logger.say(f"stage {name}: already finished")
    params = state["train"].params
  return params
