"""grain pipelines from a random-access source of examples to static-shape numpy batches.

A source is anything with `len()` and `[i] -> {"prompt", "answer", ...}`: a tfds data source from
`rlkit.data.tfds_builders` (text fields come back as bytes) or a list of rows from `load_jsonl`.

  records --shard--> shuffle(seed) --> repeat(num_epochs, reshuffled each epoch) --> batch(collate)

RL prompts (`prompt_batch`): `prompt_tokens [B, P] int32` left-padded (real tokens end at column P-1, the
layout `Rollout.prompt` uses), `prompt_mask [B, P] bool`, and the raw strings as object arrays `prompt [B]`,
`answer [B]`, `demonstration [B]` (the SFT target, see `completion_text`) for host-side verifiers.

SFT (`sft_batch`): `tokens [B, T] int32` = [BOS] prompt completion EOS, right-padded; `attention_mask [B, T]`
True on real tokens; `loss_mask [B, T]` True on completion tokens including EOS. The mask marks *targets*:
the loss on position t uses the logits at t-1, so a trainer takes `loss_mask[:, 1:]` against
`logits[:, :-1]`. Right padding keeps positions 0..n-1 without a shift; the model derives positions from the
mask either way.

Batches always have the configured shape (a row that does not fit raises; the last partial batch of a
finite run is dropped by default), so the jitted step compiles once. The iterator is a grain
`DatasetIterator`: `get_state()` / `set_state()` resume exactly, and everything runs in this process
(no worker processes; grain's multiprocessing needs parsed absl flags and a __main__ guard).
"""
from __future__ import annotations

import functools
from typing import Any, Callable, Mapping, Optional, Sequence

import grain
import numpy as np

from rlkit.models.tokenizer import Tokenizer, pad_left, pad_right

TEXT_FIELDS = ("prompt", "answer", "demonstration", "solution")


def as_text_record(record: Mapping[str, Any]) -> dict[str, str]:
  """The example's text fields as `str` (tfds Text features read back as bytes)."""
  return {k: v.decode("utf-8") if isinstance(v, bytes) else str(v)
          for k, v in record.items() if k in TEXT_FIELDS}


def _resolve_bos(tokenizer: Tokenizer, add_bos: Optional[bool]) -> bool:
  """None means: prepend BOS exactly when the tokenizer has one (the char tokenizer does, Qwen's does not)."""
  return tokenizer.bos_id is not None if add_bos is None else add_bos


def _text_columns(records: Sequence[Mapping[str, str]]) -> dict[str, np.ndarray]:
  """prompt, answer, demonstration as object arrays; always these three, so every batch has one structure."""
  columns = {}
  for key, text in (("prompt", lambda r: r["prompt"]), ("answer", lambda r: r["answer"]),
                    ("demonstration", completion_text)):
    columns[key] = np.empty(len(records), object)
    columns[key][:] = [text(r) for r in records]
  return columns


def completion_text(record: Mapping[str, str]) -> str:
  """The SFT target: the demonstration (tfds sources), else the JSONL solution, else the answer."""
  return record.get("demonstration") or record.get("solution") or record["answer"]


def prompt_batch(records: Sequence[Mapping[str, str]], tokenizer: Tokenizer, max_prompt_len: int,
                 add_bos: Optional[bool] = None) -> dict[str, np.ndarray]:
  """Tokenizes and left-pads prompts; see the module docstring for the fields."""
  ids = tokenizer.encode_batch([r["prompt"] for r in records], add_bos=_resolve_bos(tokenizer, add_bos))
  tokens, mask = pad_left(ids, max_prompt_len, tokenizer.pad_id)
  return {"prompt_tokens": tokens, "prompt_mask": mask, **_text_columns(records)}


def sft_batch(records: Sequence[Mapping[str, str]], tokenizer: Tokenizer, max_len: int,
              add_bos: Optional[bool] = None) -> dict[str, np.ndarray]:
  """[BOS] prompt completion EOS, right-padded to `max_len`; see the module docstring for the fields."""
  prompts = tokenizer.encode_batch([r["prompt"] for r in records], add_bos=_resolve_bos(tokenizer, add_bos))
  completions = tokenizer.encode_batch([completion_text(r) for r in records], add_eos=True)
  tokens, attention_mask = pad_right([p + c for p, c in zip(prompts, completions)], max_len, tokenizer.pad_id)
  loss_mask = np.zeros_like(attention_mask)
  for row, (p, c) in enumerate(zip(prompts, completions)):
    loss_mask[row, len(p):len(p) + len(c)] = True
  return {"tokens": tokens, "attention_mask": attention_mask, "loss_mask": loss_mask,
          **_text_columns(records)}


def _iterator(source: Any, batch_size: int, seed: int, collate: Callable, num_epochs: Optional[int],
              drop_remainder: bool, shard_index: int, shard_count: int,
              read_threads: int) -> grain.DatasetIterator:
  if len(source) == 0:
    raise ValueError("the data source is empty; check the split name and the prepared dataset.")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"need 0 <= shard_index < shard_count, got {shard_index}, {shard_count}.")
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f"num_epochs must be None (repeat forever) or >= 1, got {num_epochs}.")
  ds = grain.MapDataset.source(source)[shard_index::shard_count]   # each host reads a disjoint slice
  ds = ds.shuffle(seed=seed).repeat(num_epochs).map(as_text_record)
  ds = ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=collate)
  # Few read threads: tokenization is cheap, and on 2-core hosts extra threads only contend with the
  # train step. Prefetching stays in order, so batches do not depend on thread timing.
  options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=max(2, read_threads * 2))
  return iter(ds.to_iter_dataset(options))


def make_iterator(source: Any, batch_size: int, seed: int, tokenizer: Tokenizer, max_prompt_len: int, *,
                  num_epochs: Optional[int] = None, add_bos: Optional[bool] = None,
                  drop_remainder: bool = True, shard_index: int = 0, shard_count: int = 1,
                  read_threads: int = 1) -> grain.DatasetIterator:
  """Checkpointable iterator of `prompt_batch` dicts, shuffled by `seed`; num_epochs=None repeats forever."""
  collate = functools.partial(prompt_batch, tokenizer=tokenizer, max_prompt_len=max_prompt_len,
                              add_bos=add_bos)
  return _iterator(source, batch_size, seed, collate, num_epochs, drop_remainder, shard_index, shard_count,
                   read_threads)


def make_sft_iterator(source: Any, batch_size: int, seed: int, tokenizer: Tokenizer, max_len: int, *,
                      num_epochs: Optional[int] = None, add_bos: Optional[bool] = None,
                      drop_remainder: bool = True, shard_index: int = 0, shard_count: int = 1,
                      read_threads: int = 1) -> grain.DatasetIterator:
  """Checkpointable iterator of `sft_batch` dicts, shuffled by `seed`; `num_epochs=None` repeats forever."""
  collate = functools.partial(sft_batch, tokenizer=tokenizer, max_len=max_len, add_bos=add_bos)
  return _iterator(source, batch_size, seed, collate, num_epochs, drop_remainder, shard_index, shard_count,
                   read_threads)
