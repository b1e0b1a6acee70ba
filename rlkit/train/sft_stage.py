"""The `sft` stage: supervised fine-tuning on the task's demonstrations (next-token NLL on the completion).

One iteration: an `sft_batch` ([BOS] prompt completion EOS, right-padded; the loss on completion tokens) ->
one jitted `sft_step`. `pack=True` fills every row with whole examples instead (rlkit/data/packing.py), and
`loss_on="all"` trains on the prompts too: together, pretraining on a task's examples (experiments/base).
`stop_at_loss` ends the stage once the loss's moving average is below it. `turn_pattern` encodes each turn of
multi-turn demonstrations apart, as the multi-turn collector lays them out (rlkit/data/turns.py).
"""
from __future__ import annotations

import jax
import numpy as np

from rlkit.data.packing import LOSS_ON, make_packed_sft_iterator
from rlkit.data.pipeline import make_sft_iterator
from rlkit.data.turns import check_turn_pattern
from rlkit.optim.optimizers import gradient_path, make_optimizer
from rlkit.core.errors import ConfigError
from rlkit.train.config import sft_defaults
from rlkit.train.phases.update import reduce_over_steps
from rlkit.train.stages import Stage, loop, numeric, register_stage
from rlkit.train.steps import init_train_state, make_sft_step


def _init(ctx, cfg, params):
  return {"train": init_train_state(params, make_optimizer(cfg.optimizer, cfg.steps), gradient_path(cfg.optimizer))}


def _run(ctx, cfg, state, start: int, meta: dict):
  tx = make_optimizer(cfg.optimizer, cfg.steps)
  step_fn = make_sft_step(ctx.model, tx, cfg.micro_batches, gradient_path(cfg.optimizer))
  make = make_packed_sft_iterator if cfg.pack else make_sft_iterator
  it = make(ctx.train_source, cfg.batch_size, ctx.config.seed + 1000 * meta["stage_index"], ctx.tokenizer,
            cfg.max_len, loss_on=cfg.loss_on, process_index=jax.process_index(), process_count=jax.process_count(),
            turn_pattern=cfg.turn_pattern)

  def iteration(state, batch, key, iterator, step):
    del key, iterator, step
    train, m = step_fn(state["train"], ctx.put_batch(numeric(batch)), {})
    skipped = [int(jax.device_get(m["skipped_updates"].value))]
    return {"train": train}, dict(reduce_over_steps(m, 1), tokens=int(np.sum(batch["attention_mask"]))), skipped

  return loop(ctx, cfg, state, start, meta, it, iteration, ("loss", "token_accuracy"), cfg.stop_at_loss)


def validate(section, name: str) -> None:
  if section.batch_size < 1 or section.micro_batches < 1 or section.batch_size % section.micro_batches:
    raise ConfigError(f"{name}.batch_size={section.batch_size} must be a positive multiple of "
                      f"{name}.micro_batches={section.micro_batches} (>= 1).")
  if section.stop_at_loss < 0:
    raise ConfigError(f"{name}.stop_at_loss={section.stop_at_loss} must be >= 0 (0 turns it off).")
  if section.max_len == 1 or section.max_len < 0:
    raise ConfigError(f"{name}.max_len={section.max_len} must be >= 2 (a prompt token and a target), or 0 to "
                      "derive it from the data.")
  if section.pack and section.max_len == 0:
    raise ConfigError(f"{name}.pack=True packs examples into rows of {name}.max_len tokens, so it needs the row "
                      f"length: set {name}.max_len (e.g. 256) instead of 0.")
  if section.loss_on not in LOSS_ON:
    raise ConfigError(f"{name}.loss_on={section.loss_on!r} is not one of {', '.join(LOSS_ON)}.")
  check_turn_pattern(section.turn_pattern, f"{name}.turn_pattern")


register_stage("sft", Stage(_init, _run, sft_defaults, validate))
