"""Packed SFT batches (`sft.pack`): examples concatenated into full rows, as language-model pretraining does.

  record indices --shuffle(seed), repeat forever--> chunks of CHUNK records, read in one batched read
    --> [BOS] prompt completion EOS per record, concatenated --> cut into B rows of max_len tokens
    --> this process's rows

Short examples ("12+7=19" is ~8 tokens) padded to a fixed length would spend most of every step on padding;
packed, every position is a real token. An example that does not fit the rest of a row continues at the start
of the next one, and attention runs across the examples of a row (GPT-style: no per-example mask, positions
0..max_len-1), so a row reads like a long document of independent examples, each starting with BOS.

The batch has the fields of `sft_batch`'s numeric part: `tokens [B, T] int32`, `attention_mask [B, T]` (all
True), `loss_mask [B, T]` True on the targets: completion tokens and EOS (`loss_on="completion"`) or every
token (`"all"`, pretraining: the prompts are text to model as well). Multi-host: every process packs the same
global stream and keeps its rows, so the global batch depends on the seed only, as in `rlkit.data.pipeline`.
The iterator's `get_state()` / `set_state()` resume exactly (checkpointed by the sft stage): the chunk iterator's
grain state plus the tokens read but not yet cut into a batch (fewer than one chunk's).

Why chunks: a pretraining step reads ~170 examples; tfds's array_record source takes ~5 ms for one `[i]` and
~0.2 ms a record in a batched read, and the tokenizer encodes a list in one call.
"""
from __future__ import annotations

import functools
from typing import Any, Optional

import numpy as np

from rlkit.data.pipeline import decode_record, encode_sft, read_records
from rlkit.models.tokenizer import Tokenizer

LOSS_ON = ("completion", "all")


CHUNK = 256                     # records per batched read (their order is the shuffled order either way)


def encode_chunk(indices, source: Any, tokenizer: Tokenizer, loss_on: str, add_bos: Optional[bool],
                 turn_pattern: str = "") -> dict:
  """Records `indices` as one concatenation {"tokens": int32 [n], "loss_mask": bool [n]} of [BOS] prompt
  completion EOS each, in order (`encode_sft`)."""
  records = [decode_record(r) for r in read_records(source, indices)]
  prompts, completions = encode_sft(records, tokenizer, add_bos, turn_pattern)
  tokens, loss_mask = [], []
  for p, c in zip(prompts, completions):
    tokens += p + c
    loss_mask += [loss_on == "all"] * len(p) + [True] * len(c)
  return {"tokens": np.asarray(tokens, np.int32), "loss_mask": np.asarray(loss_mask, bool)}


class PackedIterator:
  """Batches of `batch_size` rows of `max_len` tokens cut from the stream of chunks; this process's `rows`."""

  def __init__(self, chunks, batch_size: int, max_len: int, rows: slice):
    self._chunks, self._shape, self._rows = chunks, (batch_size, max_len), rows
    self._tokens, self._loss_mask = np.zeros(0, np.int32), np.zeros(0, bool)

  def __iter__(self):
    return self

  def __next__(self) -> dict[str, np.ndarray]:
    need = self._shape[0] * self._shape[1]
    while len(self._tokens) < need:
      chunk = next(self._chunks)
      self._tokens = np.concatenate([self._tokens, chunk["tokens"]])
      self._loss_mask = np.concatenate([self._loss_mask, chunk["loss_mask"]])
    tokens, self._tokens = self._tokens[:need].reshape(self._shape)[self._rows], self._tokens[need:]
    loss_mask, self._loss_mask = self._loss_mask[:need].reshape(self._shape)[self._rows], self._loss_mask[need:]
    return {"tokens": tokens, "attention_mask": np.ones(tokens.shape, bool), "loss_mask": loss_mask}

  def get_state(self) -> dict:
    return {"chunks": self._chunks.get_state(), "tokens": self._tokens.tolist(),
            "loss_mask": self._loss_mask.astype(int).tolist()}

  def set_state(self, state: dict) -> None:
    self._chunks.set_state(state["chunks"])
    self._tokens = np.asarray(state["tokens"], np.int32)
    self._loss_mask = np.asarray(state["loss_mask"], bool)


def make_packed_sft_iterator(source: Any, batch_size: int, seed: int, tokenizer: Tokenizer, max_len: int, *,
                             loss_on: str = "completion", add_bos: Optional[bool] = None, process_index: int = 0,
                             process_count: int = 1, read_threads: int = 1, turn_pattern: str = "") -> PackedIterator:
  """Checkpointable, endless iterator of packed batches (module docstring); `batch_size` is the global batch."""
  import grain

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
  encode = functools.partial(encode_chunk, source=source, tokenizer=tokenizer, loss_on=loss_on, add_bos=add_bos,
                             turn_pattern=turn_pattern)
  ds = grain.MapDataset.range(len(source)).shuffle(seed=seed).repeat(None)
  ds = ds.batch(CHUNK, batch_fn=list).map(encode)
  options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=max(2, read_threads * 2))
  rows = slice(process_index * per_process, (process_index + 1) * per_process)
  return PackedIterator(iter(ds.to_iter_dataset(options)), batch_size, max_len, rows)
