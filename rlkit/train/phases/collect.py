"""Phase 1, collect: G trajectories for each prompt of a batch, as `Samples` (device rollout + host rows), by
the stage's collector (registry `COLLECTORS`, config `rl.collector`).

A collector is `fn(model, params, batch, key, sampling, group_size, put_batch, first_group_id=0, perturb=None)
-> Samples`, registered as `CollectorSpec(make, check)`: `make(cfg, env) -> fn` is built once per learner from
the stage section and a `CollectEnv` (the tokenizer, the task, the other models; a collector with an
environment or tools builds them there), and `check(section, name)` validates the collector's settings with
the rest of the section (ValueError naming the key and the fix). `single_turn` (the default) samples one
completion per row with the KV-cache sampler; a multi-turn collector drives the resumable sampler
(`rlkit.rollout.resumable`: prefill, decode until a stop set, append an observation into the live cache,
decode again) and returns a `Rollout` whose loss mask leaves the appended tokens out, with their segment kinds
and turn ids.

`Samples` keeps the sampler's `Rollout` (device arrays, every row) beside what the host knows of each row's
example (prompt text, answer, extra fields) and where the row came from (`row_source`, `valid`), so later
phases (rewards, filters, augmenters) can select and append rows without losing the pairing.

Multi-host: the rollout's arrays are global; the host lists hold this process's rows only, in the order
`host_rows` returns them (the process's contiguous slice of the global batch).
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable, NamedTuple, Optional, Sequence

import jax
import numpy as np

from rlkit.core.registry import Registry
from rlkit.core.types import ROW_SOURCE, Rollout
from rlkit.parallel.hosts import concat_rows, take_rows
from rlkit.rollout.sampler import SamplingConfig, generate


@dataclasses.dataclass
class Samples:
  """Rows of one iteration so far. `rollout` [N, ...] on device; the host lists and arrays are [n] for this
  process's n rows (n == N on one process)."""
  rollout: Rollout
  examples: list                # [n] dicts: prompt, answer, demonstration, fields (the example's extras)
  row_source: np.ndarray        # [n] int32 index into ROW_SOURCES
  valid: np.ndarray             # [n] bool; False on padding rows (all masks False)
  weight: Optional[np.ndarray] = None   # [n] float32 loss weight of each row (TrainBatch.token_weights); None: 1
  metrics: dict = dataclasses.field(default_factory=dict)   # name -> count the collector reports (logged as
                                # collect/<name>: tool errors, episodes cut); they describe the collection
                                # work, so `take` keeps them whole and `concat` sums them

  def __len__(self) -> int:
    return len(self.examples)

  def weights(self) -> np.ndarray:
    return np.ones(len(self), np.float32) if self.weight is None else self.weight

  def take(self, rows: np.ndarray) -> "Samples":
    rows = np.asarray(rows, np.int64)
    return Samples(take_rows(self.rollout, rows, len(self)), [self.examples[i] for i in rows],
                   self.row_source[rows], self.valid[rows], None if self.weight is None else self.weight[rows],
                   self.metrics)

  @staticmethod
  def concat(parts: Sequence["Samples"]) -> "Samples":
    if len(parts) == 1:
      return parts[0]
    rollout = concat_rows([p.rollout for p in parts], [len(p) for p in parts])
    weight = None if all(p.weight is None for p in parts) else np.concatenate([p.weights() for p in parts])
    metrics = {}
    for p in parts:
      for k, v in p.metrics.items():
        metrics[k] = metrics.get(k, 0) + v
    return Samples(rollout, [x for p in parts for x in p.examples],
                   np.concatenate([p.row_source for p in parts]), np.concatenate([p.valid for p in parts]), weight,
                   metrics)


def collect(model, params, batch: dict, key: jax.Array, sampling: SamplingConfig, group_size: int,
            put_batch: Callable[[dict], dict], first_group_id: int = 0, perturb=None) -> Samples:
  """Samples `group_size` completions for every prompt of `batch` (a `prompt_batch` dict of this process's
  prompts). Group ids are `first_group_id + prompt index`, so ids stay unique across sampling rounds.
  `model` and `perturb` are the sampler's (`rlkit.rollout.mismatch`: a simulated inference engine)."""
  n_prompts = len(batch["answer"])
  rep = np.repeat(np.arange(n_prompts), group_size)
  offset = first_group_id + jax.process_index() * n_prompts
  dev = put_batch({"prompt": batch["prompt_tokens"][rep], "mask": batch["prompt_mask"][rep],
                   "group_ids": (offset + rep).astype(np.int32)})
  rollout = generate(model, params, dev["prompt"], dev["mask"], key, sampling, group_ids=dev["group_ids"],
                     perturb=perturb)
  examples = [{"prompt": batch["prompt"][i], "answer": batch["answer"][i],
               "demonstration": batch["demonstration"][i],
               "fields": batch["fields"][i] if "fields" in batch else {}} for i in range(n_prompts)]
  return Samples(rollout, [examples[i] for i in rep], np.full(len(rep), ROW_SOURCE["policy"], np.int32),
                 np.ones(len(rep), bool))


def sampling_config(cfg, tokenizer) -> SamplingConfig:
  """The sampler's settings of an RL stage section `cfg` (its stop and pad ids from `tokenizer`)."""
  return SamplingConfig(max_new_tokens=cfg.max_new_tokens, temperature=cfg.temperature, top_k=cfg.top_k,
                        top_p=cfg.top_p, stop_ids=tokenizer.stop_ids, pad_id=tokenizer.pad_id)


class CollectEnv(NamedTuple):
  """What a collector may build from besides its section: the run's tokenizer (to encode observations and
  tool results), its task, the `config.models` roles (rlkit.train.models.Model), e.g. a simulated user, and
  the policy's model folder."""
  tokenizer: Any
  task: Any = None
  models: dict = {}
  model_path: str = ""   # the policy's `model.path` (a Hugging Face folder: e.g. its chat template), or ""


def _no_check(section, name: str) -> None:
  del section, name


class CollectorSpec(NamedTuple):
  make: Callable[..., Callable[..., Samples]]     # (stage section, CollectEnv) -> the collect function
  check: Callable[[Any, str], None] = _no_check   # (stage section, its name) -> None; raises ValueError


COLLECTORS: Registry[CollectorSpec] = Registry("collector")
COLLECTORS.add("single_turn", CollectorSpec(lambda cfg, env: collect))
