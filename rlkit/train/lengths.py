"""Token-length limits checked against the data before any work, or derived from it.

`data.max_prompt_len` bounds every prompt the run reads (RL, evaluation; every split of the run's task and
of each stage's own task), `<stage>.max_len` every SFT sequence of that stage (prompt + completion + EOS).
A limit set to 0 becomes the data's longest; a limit shorter than the data's longest stops the run with the
key to raise and the example that needs it, instead of failing later inside a batch. The rows are those the
run will store: read from the JSONL files, or generated exactly as `prepare` will generate them (a pure
function of the task, the sizes and the seed), so nothing is written to check them.
"""
from __future__ import annotations

import copy
import functools
import os
from typing import Any

import ml_collections

from rlkit.data.jsonl import load_jsonl
from rlkit.data.pipeline import token_lengths
from rlkit.data.tasks import make_task
from rlkit.data.splits import PromptSpaceError, generate_splits, generate_test_split
from rlkit.core.errors import ConfigError
from rlkit.train.config import data_files, stage_config, task_kwargs


# Validating several configs in one process (a sweep's commands, the README recipes) would generate the same
# splits again for each; tasks are frozen dataclasses, so the arguments key a cache. The rows are only read.
_generated_splits = functools.lru_cache(maxsize=4)(generate_splits)


def split_rows(config, with_train: bool = True) -> dict[str, list[dict[str, Any]]]:
  """{split: rows} the run's data will hold (see the module docstring); without the train split when
  `with_train` is False (it is not generated: the test split is drawn first, from its own stream)."""
  files = data_files(config)
  if files is not None:
    return {split: load_jsonl(path) for split, path in files.items() if with_train or split != "train"}
  task = make_task(config.task.name, **task_kwargs(config))
  try:
    if not with_train:
      return {"test": generate_test_split(task, config.data.num_test, config.seed)}
    generate = _generated_splits if _hashable(task) else generate_splits   # unhashable: generated afresh
    return generate(task, config.data.num_train, config.data.num_test, config.seed)
  except PromptSpaceError as e:
    raise ConfigError(f"{e} (data.num_train={config.data.num_train}, data.num_test={config.data.num_test}: "
                      "--config.data.num_train / --config.data.num_test)") from None


def _hashable(task) -> bool:
  try:
    hash(task)
  except TypeError:
    return False
  return True


def _longest(lengths: list[int], rows: list[dict], where: str) -> tuple[int, str]:
  i = max(range(len(lengths)), key=lengths.__getitem__)
  prompt = str(rows[i]["prompt"])
  preview = prompt if len(prompt) <= 60 else prompt[:57] + "..."
  return lengths[i], f"{where} row {i + 1}, prompt {preview!r}"


def _token_lengths(rows, tokenizer, where: str, turn_pattern: str = ""):
  try:
    return token_lengths(rows, tokenizer, turn_pattern=turn_pattern)
  except ValueError as e:   # text the tokenizer cannot encode (a character outside the char alphabet)
    raise ConfigError(f"{where}: {e} Or use a tokenizer that covers the data (tokenizer.kind=hf).") from None


def _where(config, split: str) -> str:
  files = data_files(config)
  return f"{os.path.basename(files[split])}" if files else f"the generated {split} split"


def needed_lengths(config, tokenizer) -> dict[str, tuple[int, str]]:
  """{limit key: (the data's longest, which example)} for the limits the configured stages use."""
  from rlkit.train.catalog import STAGES
  needed: dict[str, tuple[int, str]] = {}

  def need(key: str, length: int, where: str) -> None:
    if key not in needed or length > needed[key][0]:
      needed[key] = (length, where)

  cache: dict[tuple, dict] = {}
  for name in config.stages:
    if "data" not in STAGES.get(config[name].kind).needs:
      continue
    own = stage_config(config, name)
    # A packed stage (sft.pack) reads its training examples only as rows of max_len tokens, split wherever a
    # row ends: no limit applies to them, so they are neither generated nor tokenised here (a pretraining
    # corpus of a million examples would take minutes).
    with_train = not config[name].get("pack")
    turns = config[name].get("turn_pattern", "")
    key = (id(own), with_train, turns)
    if key not in cache:
      cache[key] = {split: (rows, *_token_lengths(rows, tokenizer, _where(own, split), turns))
                    for split, rows in split_rows(own, with_train).items() if rows}
    for split, (rows, prompts, sequences) in cache[key].items():
      need("data.max_prompt_len", *_longest(prompts, rows, _where(own, split)))
      if "max_len" in config[name] and split == "train":
        need(f"{name}.max_len", *_longest(sequences, rows, _where(own, split)))
  return needed


def _get(config, key: str) -> int:
  section, field = key.rsplit(".", 1)
  return config[section][field]


def resolve_lengths(config: ml_collections.ConfigDict, tokenizer) -> tuple[ml_collections.ConfigDict, list[str]]:
  """(config with every 0 limit set to the data's longest, one note per derived limit); raises ConfigError
  naming the key and the longest example when a set limit is too short."""
  needed = needed_lengths(config, tokenizer)
  too_short = [(key, _get(config, key), n, where) for key, (n, where) in needed.items() if 0 < _get(config, key) < n]
  if too_short:
    raise ConfigError("; ".join(
        f"{key}={value} is shorter than the longest example, {n} tokens ({where}): raise --config.{key} to at "
        f"least {n} (or set it to 0 to derive it from the data)" for key, value, n, where in too_short) + ".")
  derived = [(key, n, where) for key, (n, where) in needed.items() if _get(config, key) == 0]
  if not derived:
    return config, []
  out = copy.deepcopy(config)
  with out.unlocked():
    for key, n, _ in derived:
      section, field = key.rsplit(".", 1)
      out[section][field] = n
  return out, [f"{key}=0: derived {n} tokens from the data (longest: {where})" for key, n, where in derived]
