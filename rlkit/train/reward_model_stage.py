"""The `reward_model` stage: trains a reward head (rlkit/rewards/reward_heads.py: scalar, Bradley-Terry, Gaussian,
quantile; rlkit/rewards/drm.py: the diffusion reward model, our design) on frozen embeddings of (prompt, response)
from the run's model, and writes it where the `reward_model` reward loads it (rlkit/rewards/reward_model.py).

Data: every example carries `response` (str) and `ratings` (a list of numbers, one per annotator; lists may
differ in length), or for `bradley_terry` `chosen` and `rejected` (str). The embedding is the mean of the
model's final hidden states over the prompt and response tokens, computed once for every example at the start
(the model is frozen: it passes through the stage unchanged). Rating heads get the training ratings' mean and
std as their fixed standardisation (`rating_scale`) unless `head_kwargs` sets them.

One iteration: `batch_size` examples drawn by a seeded stream indexed by the step (a resumed stage draws the same
ones), one step of the head through the shared update step (rlkit/train/steps.py: its non-finite guard skips
an update whose loss or gradient is not finite, and counts it in `skipped_updates`); the head's loss draws its
noise from the iteration's key. The stage's state is {"train": the frozen decoder's TrainState, "head": the
head's TrainState}. Evaluations (every `eval_every`, and at the end) add, on the held-out
examples that carry ratings, the W1 distance and CRPS of the head's samples against the ratings
(`eval/rm/w1`, `eval/rm/crps`; rlkit/rewards/reward_metrics.py) to the model's usual evaluation. At the end the
head is written to <workdir>/reward_model/<stage name>/.
"""
from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax

from rlkit.core.errors import ConfigError
from rlkit.core.types import Metric
from rlkit.data.pipeline import decode_record
from rlkit.optim.optimizers import gradient_path, make_optimizer
from rlkit.rewards.head_catalog import build_head, head_spec
from rlkit.rewards.reward_heads import rating_scale
from rlkit.rewards.reward_metrics import crps, wasserstein1
from rlkit.rewards.reward_model import embed, save_head
from rlkit.train.config import optimizer_defaults
from rlkit.train.models import Model
from rlkit.train.stages import Stage, loop, register_stage
from rlkit.train.steps import init_train_state, make_update_step


def reward_model_defaults() -> ml_collections.ConfigDict:
  c = ml_collections.ConfigDict()
  c.kind = "reward_model"       # stage kind (registry STAGES)
  c.steps = 500                 # optimizer steps of the head
  c.batch_size = 64             # examples per step
  c.head = "diffusion"          # reward head (registry REWARD_HEADS): scalar | bradley_terry | gaussian | quantile |
                                # diffusion
  c.head_kwargs = ml_collections.ConfigDict()   # the head's own parameters (rating_mean/std: from the data if unset)
  c.eval_every = 0              # evaluate every N steps (0: only at the end of the stage)
  c.eval_samples = 64           # reward samples per held-out example for W1 and CRPS
  c.max_skipped_updates = 10    # stop after this many head steps in a row with a non-finite loss/grad (0: never)
  c.optimizer = optimizer_defaults()
  return c


def _ratings(records, where: str) -> tuple[np.ndarray, np.ndarray]:
  """([N, A] ratings padded with 0, [N, A] mask) from each record's `ratings` field."""
  rows = []
  for i, r in enumerate(records):
    value = r["fields"].get("ratings")
    if not isinstance(value, list) or not value or not all(isinstance(x, (int, float)) for x in value):
      raise ConfigError(f"{where}: example {i} needs a non-empty list of numbers as its `ratings` field (one per "
                        f"annotator), got {value!r:.60}.")
    rows.append(value)
  width = max(len(r) for r in rows)
  ratings, mask = np.zeros((len(rows), width), np.float32), np.zeros((len(rows), width), np.float32)
  for i, r in enumerate(rows):
    ratings[i, :len(r)], mask[i, :len(r)] = r, 1.0
  return ratings, mask


# The example field whose text each conditioning array of a head's batch embeds (the head's `batch_keys`).
TEXT_FIELDS = {"cond": "response", "cond_chosen": "chosen", "cond_rejected": "rejected"}


def _data(ctx, cfg, params, records, where: str, embed_texts: bool = True) -> dict:
  """The arrays the head's loss reads (its spec's `batch_keys`) for the whole training or evaluation set: the
  embeddings of each example's response texts (skipped with `embed_texts=False`), its ratings and their mask."""
  decoder = Model(ctx.model, params, ctx.tokenizer, False)
  records = [decode_record(r) for r in records]
  prompts = [r["prompt"] for r in records]
  data = {}
  for key in head_spec(cfg.head).batch_keys:
    if key == "ratings":
      data["ratings"], data["mask"] = _ratings(records, where)
      continue
    if key not in TEXT_FIELDS:
      raise ConfigError(f"{where}: head {cfg.head!r} reads the array {key!r}, which this stage cannot build (it "
                        f"builds ratings and the embeddings {sorted(TEXT_FIELDS)}).")
    field = TEXT_FIELDS[key]
    missing = [i for i, r in enumerate(records) if not isinstance(r["fields"].get(field), str)]
    if missing:
      raise ConfigError(f"{where}: example {missing[0]} needs a string `{field}` field (head {cfg.head!r} reads "
                        f"{[TEXT_FIELDS.get(k, k) for k in head_spec(cfg.head).batch_keys]}).")
    if embed_texts:
      data[key] = embed(decoder, prompts, [r["fields"][field] for r in records])
  return data


def _all(source) -> list:
  return [source[i] for i in range(len(source))]


def _head(cfg, data) -> tuple[dict, object]:
  kwargs = dict(cfg.head_kwargs)
  if "ratings" in data and "rating_mean" in head_spec(cfg.head).keywords:
    kwargs = {**rating_scale(data["ratings"], data["mask"]), **kwargs}
  return kwargs, build_head(cfg.head, kwargs)


def _init(ctx, cfg, params):
  # The head's shapes need only the embedding width, and its kwargs only the ratings: no embedding pass here.
  data = _data(ctx, cfg, params, _all(ctx.train_source), "reward_model stage", embed_texts=False)
  kwargs, module = _head(cfg, data)
  spec = head_spec(cfg.head)
  first = jnp.zeros((1, ctx.model.cfg.hidden_size), jnp.float32)
  head = jax.jit(lambda k: spec.init(module, k, first))(jax.random.fold_in(ctx.key, 17))
  tx = make_optimizer(cfg.optimizer, cfg.steps)
  return {"train": init_train_state(params, optax.set_to_zero()),
          "head": init_train_state(head, tx, gradient_path(cfg.optimizer))}


class _Steps:
  """The stage's data stream: step s draws its batch from a generator seeded by (seed, stage, s), so the
  stream's state is the step itself (what the shared loop checkpoints)."""

  def __init__(self, n: int, batch: int, seed: int):
    self.n, self.batch, self.seed, self.step = n, batch, seed, 0

  def __next__(self) -> np.ndarray:
    rng = np.random.default_rng([self.seed, self.step])
    self.step += 1
    return rng.choice(self.n, self.batch, replace=self.batch > self.n)

  def get_state(self) -> dict:
    return {"step": self.step}

  def set_state(self, state: dict) -> None:
    self.step = int(state["step"])


def _run(ctx, cfg, state, start: int, meta: dict):
  params = state["train"].params
  data = _data(ctx, cfg, params, _all(ctx.train_source), "reward_model stage")
  held_out = [r for r in map(decode_record, ctx.eval_records) if "ratings" in r["fields"]]
  evals = _data(ctx, cfg, params, held_out, "reward_model stage (held-out)") if held_out and "ratings" in data else None
  kwargs, module = _head(cfg, data)
  spec = head_spec(cfg.head)
  tx = make_optimizer(cfg.optimizer, cfg.steps)

  def head_loss(head, batch, step_inputs):
    loss, metrics = spec.loss(head, module.apply, step_inputs["key"], batch)
    return loss, {name: Metric(value) for name, value in metrics.items()}

  step = make_update_step(head_loss, tx, 1, lambda batch: {}, gradient_path(cfg.optimizer))

  draw = jax.jit(lambda head, key, cond: spec.samples(head, module.apply, key, cond, cfg.eval_samples))
  key = jax.random.fold_in(ctx.key, 1000 + meta["stage_index"])

  def head_eval(head) -> dict:
    if evals is None:
      return {}
    s = draw(head, jax.random.fold_in(key, 2 ** 30), jnp.asarray(evals["cond"]))   # one fixed evaluation key
    counts = (evals["mask"] > 0).sum(-1)
    w1 = np.zeros(len(counts))
    for n in np.unique(counts):        # rows with n observed ratings (kept first by _ratings) in one call
      rows = np.flatnonzero(counts == n)
      w1[rows] = np.asarray(wasserstein1(s[rows], jnp.asarray(evals["ratings"][rows, :n])))
    return {"eval/rm/w1": float(np.mean(w1)),
            "eval/rm/crps": float(np.nanmean(crps(s, jnp.asarray(evals["ratings"]), jnp.asarray(evals["mask"]))))}

  def iteration(state, rows, k, iterator, i):
    batch = {name: jnp.asarray(value[rows]) for name, value in data.items()}
    train, m = step(state["head"], batch, {"key": k})
    metrics = {name: float(metric.value) for name, metric in m.items()}
    skipped = bool(metrics["skipped_updates"])
    last = i + 1 == cfg.steps
    if last or (cfg.eval_every and (i + 1) % cfg.eval_every == 0):
      metrics.update(head_eval(train.params))
    if last and jax.process_index() == 0:
      save_head(os.path.join(ctx.workdir, "reward_model", meta["stage"]), cfg.head, kwargs,
                jax.device_get(train.params))
    return dict(state, head=train), metrics, [skipped]

  it = _Steps(len(ctx.train_source), cfg.batch_size, ctx.config.seed + 1000 * meta["stage_index"])
  return loop(ctx, cfg, state, start, meta, it, iteration, ("loss",))


def validate(section, name: str) -> None:
  try:
    build_head(section.head, dict(section.head_kwargs))     # an unknown head names the registered ones
  except (TypeError, ValueError) as e:
    raise ConfigError(f"{name}.head_kwargs: {e}") from None
  if section.batch_size < 1 or section.eval_samples < 2:
    raise ConfigError(f"{name}: batch_size={section.batch_size} must be >= 1 and eval_samples="
                      f"{section.eval_samples} >= 2.")
  if section.optimizer.kl_target:
    raise ConfigError(f"{name}.optimizer.kl_target={section.optimizer.kl_target}: the reward head has no policy "
                      "whose KL could be predicted; set it to 0.")


register_stage("reward_model", Stage(_init, _run, reward_model_defaults, validate))
