"""Packed SFT batches (`sft.pack`): examples concatenated into full rows, as language-model pretraining does.

  record indices --shuffle(seed), repeat forever--> [BOS] prompt completion EOS per record
    --> concatenate, cut into rows of max_len tokens (grain's ConcatThenSplit)--> batch(global B)
    --> this process's rows

Short examples ("12+7=19" is ~8 tokens) padded to a fixed length would spend most of every step on padding;
packed, every position is a real token. An example that does not fit the rest of a row continues at the start
of the next one, and attention runs across the examples of a row (GPT-style: no per-example mask, positions
0..max_len-1), so a row reads like a long document of independent examples, each starting with BOS.

The batch has the fields of `sft_batch`'s numeric part: `tokens [B, T] int32`, `attention_mask [B, T]` (all
True), `loss_mask [B, T]` True on the targets: completion tokens and EOS (`loss_on="completion"`) or every
token (`"all"`, pretraining: the prompts are text to model as well). Multi-host: every process packs the same
global stream and keeps its rows, so the global batch depends on the seed only, as in `rlkit.data.pipeline`.
The iterator's `get_state()` / `set_state()` resume exactly (checkpointed by the sft stage).
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import numpy as np

from rlkit.data.pipeline import _resolve_bos, completion_text, decode_record
from rlkit.models.tokenizer import Tokenizer

LOSS_ON = ("completion", "all")


def encode_example(index: int, source: Any, tokenizer: Tokenizer, loss_on: str, add_bos: bool) -> dict:
  """One record as {"tokens": int32 [n], "loss_mask": bool [n]}: [BOS] prompt completion EOS."""
  record = decode_record(source[int(index)])
  prompt = tokenizer.encode_batch([record["prompt"]], add_bos=add_bos)[0]
  completion = tokenizer.encode_batch([completion_text(record)], add_eos=True)[0]
  tokens = np.asarray(prompt + completion, np.int32)
  loss_mask = np.ones(len(tokens), bool)
  if loss_on == "completion":
    loss_mask[:len(prompt)] = False
  return {"tokens": tokens, "loss_mask": loss_mask}


def _rows(batch: dict, rows: slice) -> dict[str, np.ndarray]:
  tokens = batch["tokens"][rows].astype(np.int32)
  return {"tokens": tokens, "attention_mask": np.ones(tokens.shape, bool),
          "loss_mask": batch["loss_mask"][rows].astype(bool)}


def make_packed_sft_iterator(source: Any, batch_size: int, seed: int, tokenizer: Tokenizer, max_len: int, *,
                             loss_on: str = "completion", add_bos: Optional[bool] = None, process_index: int = 0,
                             process_count: int = 1, read_threads: int = 1):
  """Checkpointable, endless iterator of packed batches (module docstring); `batch_size` is the global batch."""
  import grain
  from grain.experimental import ConcatThenSplitIterDataset

  if len(source) == 0:
    raise ValueError("the data source is empty; check the split name and the prepared dataset.")
  if loss_on not in LOSS_ON:
    raise ValueError(f"loss_on must be one of {LOSS_ON}, got {loss_on!r}.")
  if max_len < 2:
    raise ValueError(f"a packed row needs max_len >= 2 tokens, got {max_len}.")
  if batch_size < 1 or batch_size % process_count or not 0 <= process_index < process_count:
    raise ValueError(f"batch_size={batch_size} must be a positive multiple of process_count={process_count} "
                     f"(and 0 <= process_index={process_index} < process_count).")
  per_process = batch_size // process_count
  encode = functools.partial(encode_example, source=source, tokenizer=tokenizer, loss_on=loss_on,
                             add_bos=_resolve_bos(tokenizer, add_bos))
  ds = grain.MapDataset.range(len(source)).shuffle(seed=seed).repeat(None).map(encode)
  options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=max(2, read_threads * 2))
  packed = ConcatThenSplitIterDataset(ds.to_iter_dataset(options),
                                      length_struct={"tokens": max_len, "loss_mask": max_len})
  rows = slice(process_index * per_process, (process_index + 1) * per_process)
  return iter(packed.batch(batch_size).map(functools.partial(_rows, rows=rows)))
