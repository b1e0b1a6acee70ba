"""grain pipelines from a random-access source of examples to static-shape numpy batches.

A source is anything with `len()` and `[i] -> {"prompt", "answer", ...}`: a tfds data source from
`rlkit.data.tfds_builders` (text fields come back as bytes, extra fields as one JSON `fields` text) or a
list of rows from `load_jsonl` / `make_example` (extra fields as top-level keys). `decode_record` turns
either into the text fields as `str` plus `fields`, a dict of the extra fields.

  record indices --shuffle(seed)--> repeat(num_epochs, reshuffled each epoch) --> batch(global B)
    --> this process's slice of each index batch --> read those records --> decode --> collate

Multi-host: the *global* batch of step t depends only on the seed (it is what a single process reads), and
process p of P reads and collates only rows [p*B/P, (p+1)*B/P) of it. So runs with different process
counts see the same global batches, and for P=1 the order is that of the earlier record pipeline
(`MapDataset.source(src).shuffle(seed).repeat(n).batch(B)`): grain's shuffle permutes indices from the seed,
the length and the epoch only, so shuffling indices instead of records changes nothing.

RL prompts (`prompt_batch`): `prompt_tokens [B, P] int32` left-padded (real tokens end at column P-1, the
layout `Rollout.prompt` uses), `prompt_mask [B, P] bool`, the raw strings as object arrays `prompt [B]`,
`answer [B]`, `demonstration [B]` (the SFT target, see `completion_text`) for host-side verifiers, and
`fields [B]`, an object array of dicts: each example's extra fields (`{}` when it has none).

SFT (`sft_batch`): `tokens [B, T] int32` = [BOS] prompt completion EOS, right-padded; `attention_mask [B, T]`
True on real tokens; `loss_mask [B, T]` True on completion tokens including EOS; and the same object
columns. The mask marks *targets*: the loss on position t uses the logits at t-1, so a trainer takes
`loss_mask[:, 1:]` against `logits[:, :-1]`. Right padding keeps positions 0..n-1 without a shift; the model
derives positions from the mask either way.

Batches always have the configured shape (a row that does not fit raises; the last partial batch of a
finite run is dropped by default), so the jitted step compiles once. The iterator is a grain
`DatasetIterator`: `get_state()` / `set_state()` resume exactly, and everything runs in this process
(no worker processes; grain's multiprocessing needs parsed absl flags and a __main__ guard).
"""
from __future__ import annotations

import functools
import json
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

import numpy as np

from rlkit.data.turns import encode_turns
from rlkit.models.tokenizer import Tokenizer, pad_left, pad_right

if TYPE_CHECKING:
  import grain

TEXT_FIELDS = ("prompt", "answer", "demonstration", "solution")
_NOT_EXTRA = ("prompt", "answer", "demonstration")   # keys of a row that are not extra fields


def _text(value: Any) -> str:
  return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def decode_record(record: Mapping[str, Any]) -> dict[str, Any]:
  """The example's text fields as `str` plus `fields`, a fresh dict of its extra fields (`{}` if none).

  Accepts a stored record (`fields` as JSON text or bytes), a row (extra fields as top-level keys; they
  must be JSON values) or an already decoded record. Rows pass through JSON too, so every source gives the
  same values (tuples become lists), and a reward that mutates `fields` cannot change the source.
  """
  out = {k: _text(v) for k, v in record.items() if k in TEXT_FIELDS}
  fields = record.get("fields")
  if isinstance(fields, (str, bytes)):
    out["fields"] = json.loads(fields)
  else:
    if not isinstance(fields, Mapping):
      fields = {k: v for k, v in record.items() if k not in _NOT_EXTRA}
    out["fields"] = json.loads(json.dumps(fields))
  return out


as_text_record = decode_record   # the earlier name, still used by rlkit.train.evaluate


def _resolve_bos(tokenizer: Tokenizer, add_bos: Optional[bool]) -> bool:
  """None means: prepend BOS exactly when the tokenizer has one (the char tokenizer does, Qwen's does not)."""
  return tokenizer.bos_id is not None if add_bos is None else add_bos


def _object_columns(records: Sequence[Mapping[str, Any]]) -> dict[str, np.ndarray]:
  """prompt, answer, demonstration, fields as object arrays; always these four, so every batch has one
  structure."""
  columns = {}
  for key, value in (("prompt", lambda r: r["prompt"]), ("answer", lambda r: r["answer"]),
                     ("demonstration", completion_text), ("fields", lambda r: r["fields"])):
    columns[key] = np.empty(len(records), object)
    for row, record in enumerate(records):   # element by element: numpy would unpack lists of lists
      columns[key][row] = value(record)
  return columns


def completion_text(record: Mapping[str, Any]) -> str:
  """The SFT target: the demonstration (tfds sources), else the JSONL solution, else the answer."""
  return record.get("demonstration") or record.get("solution") or record["answer"]


def prompt_batch(records: Sequence[Mapping[str, Any]], tokenizer: Tokenizer, max_prompt_len: int,
                 add_bos: Optional[bool] = None) -> dict[str, np.ndarray]:
  """Tokenizes and left-pads prompts of source records (see `decode_record`); fields: module docstring."""
  records = [decode_record(r) for r in records]
  ids = tokenizer.encode_batch([r["prompt"] for r in records], add_bos=_resolve_bos(tokenizer, add_bos))
  tokens, mask = pad_left(ids, max_prompt_len, tokenizer.pad_id)
  return {"prompt_tokens": tokens, "prompt_mask": mask, **_object_columns(records)}


def encode_sft(records: Sequence[Mapping[str, Any]], tokenizer: Tokenizer, add_bos: Optional[bool] = None,
               turn_pattern: str = "") -> tuple[list[list[int]], list[list[int]]]:
  """([BOS] prompt ids, completion ids EOS) of decoded records, each text's turns encoded apart where
  `turn_pattern` names them (rlkit/data/turns.py)."""
  prompts = encode_turns(tokenizer, [r["prompt"] for r in records], turn_pattern,
                         add_bos=_resolve_bos(tokenizer, add_bos))
  return prompts, encode_turns(tokenizer, [completion_text(r) for r in records], turn_pattern, add_eos=True)


def sft_batch(records: Sequence[Mapping[str, Any]], tokenizer: Tokenizer, max_len: int,
              add_bos: Optional[bool] = None, loss_on: str = "completion",
              turn_pattern: str = "") -> dict[str, np.ndarray]:
  """[BOS] prompt completion EOS, right-padded to `max_len`; see the module docstring for the fields.
  `loss_on="all"` marks every real token as a target, the prompt's too; `turn_pattern` (rlkit/data/turns.py)
  encodes each turn of the prompt and the completion apart, as a multi-turn collector does."""
  records = [decode_record(r) for r in records]
  prompts, completions = encode_sft(records, tokenizer, add_bos, turn_pattern)
  tokens, attention_mask = pad_right([p + c for p, c in zip(prompts, completions)], max_len, tokenizer.pad_id)
  loss_mask = np.zeros_like(attention_mask)
  for row, (p, c) in enumerate(zip(prompts, completions)):
    loss_mask[row, 0 if loss_on == "all" else len(p):len(p) + len(c)] = True
  return {"tokens": tokens, "attention_mask": attention_mask, "loss_mask": loss_mask,
          **_object_columns(records)}


def token_lengths(records: Sequence[Mapping[str, Any]], tokenizer: Tokenizer,
                  add_bos: Optional[bool] = None, turn_pattern: str = "") -> tuple[list[int], list[int]]:
  """(prompt tokens, SFT sequence tokens) of each record, counted exactly as `prompt_batch` and `sft_batch`
  (with `turn_pattern`) lay them out, so a limit checked against these never fails inside a batch."""
  records = [decode_record(r) for r in records]
  sft_prompts, completions = encode_sft(records, tokenizer, add_bos, turn_pattern)
  prompts = (tokenizer.encode_batch([r["prompt"] for r in records], add_bos=_resolve_bos(tokenizer, add_bos))
             if turn_pattern else sft_prompts)           # prompt_batch encodes a prompt whole
  return [len(p) for p in prompts], [len(p) + len(c) for p, c in zip(sft_prompts, completions)]


def read_records(source: Any, indices: Sequence[int]) -> list:
  """`[source[i] for i in indices]`, in one batched read where the source has one (`__getitems__`: tfds's
  array_record sources read 2,000 random records ~25x faster that way than one `[i]` at a time)."""
  indices = [int(i) for i in indices]
  getitems = getattr(source, "__getitems__", None)
  return list(getitems(indices)) if getitems is not None else [source[i] for i in indices]


def _read_rows(indices: Sequence[int], source: Any, rows: slice, collate: Callable) -> dict[str, np.ndarray]:
  """Reads only this process's rows of a global index batch, and collates them."""
  return collate(read_records(source, indices[rows]))


def _iterator(source: Any, batch_size: int, seed: int, collate: Callable, num_epochs: Optional[int],
              drop_remainder: bool, process_index: int, process_count: int,
              read_threads: int) -> grain.DatasetIterator:
  if len(source) == 0:
    raise ValueError("the data source is empty; check the split name and the prepared dataset.")
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}.")
  if not 0 <= process_index < process_count:
    raise ValueError(f"need 0 <= process_index < process_count, got {process_index}, {process_count}.")
  if batch_size % process_count:
    raise ValueError(f"batch_size is the global batch, split evenly over processes: {batch_size} rows do "
                     f"not divide by process_count={process_count}; use a multiple of {process_count}.")
  if num_epochs is not None and num_epochs < 1:
    raise ValueError(f"num_epochs must be None (repeat forever) or >= 1, got {num_epochs}.")
  last = 0 if num_epochs is None or drop_remainder else len(source) * num_epochs % batch_size
  if last and process_count > 1:
    raise ValueError(f"the last global batch has {last} of {batch_size} rows and cannot be split over "
                     f"{process_count} processes; use drop_remainder=True.")
  per_process = batch_size // process_count
  rows = slice(process_index * per_process, (process_index + 1) * per_process)
  import grain     # here, not at the top: validating a config (launch.py --validate_only) never reads data
  ds = grain.MapDataset.range(len(source)).shuffle(seed=seed).repeat(num_epochs)
  ds = ds.batch(batch_size, drop_remainder=drop_remainder, batch_fn=list)
  ds = ds.map(functools.partial(_read_rows, source=source, rows=rows, collate=collate))
  # Few read threads: tokenization is cheap, and on 2-core hosts extra threads only contend with the
  # train step. Prefetching stays in order, so batches do not depend on thread timing.
  options = grain.ReadOptions(num_threads=read_threads, prefetch_buffer_size=max(2, read_threads * 2))
  return iter(ds.to_iter_dataset(options))


def make_iterator(source: Any, batch_size: int, seed: int, tokenizer: Tokenizer, max_prompt_len: int, *,
                  num_epochs: Optional[int] = None, add_bos: Optional[bool] = None,
                  drop_remainder: bool = True, process_index: int = 0, process_count: int = 1,
                  read_threads: int = 1) -> grain.DatasetIterator:
  """Checkpointable iterator of `prompt_batch` dicts, shuffled by `seed`; num_epochs=None repeats forever.

  `batch_size` is the global batch; this process gets its `batch_size // process_count` rows of each.
  """
  collate = functools.partial(prompt_batch, tokenizer=tokenizer, max_prompt_len=max_prompt_len,
                              add_bos=add_bos)
  return _iterator(source, batch_size, seed, collate, num_epochs, drop_remainder, process_index,
                   process_count, read_threads)


def make_sft_iterator(source: Any, batch_size: int, seed: int, tokenizer: Tokenizer, max_len: int, *,
                      num_epochs: Optional[int] = None, add_bos: Optional[bool] = None,
                      drop_remainder: bool = True, process_index: int = 0, process_count: int = 1,
                      read_threads: int = 1, loss_on: str = "completion",
                      turn_pattern: str = "") -> grain.DatasetIterator:
  """Checkpointable iterator of `sft_batch` dicts, shuffled by `seed`; `num_epochs=None` repeats forever.

  `batch_size` is the global batch; this process gets its `batch_size // process_count` rows of each.
  """
  collate = functools.partial(sft_batch, tokenizer=tokenizer, max_len=max_len, add_bos=add_bos, loss_on=loss_on,
                              turn_pattern=turn_pattern)
  return _iterator(source, batch_size, seed, collate, num_epochs, drop_remainder, process_index,
                   process_count, read_threads)
