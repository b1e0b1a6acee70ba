"""tfds datasets of task examples, written as array_record and read back as random-access data sources.

One builder, `TaskDataset`, holds either a synthetic task's examples (`prepare`) or JSONL rows
(`prepare_jsonl`). Features: prompt, answer, demonstration and fields (all Text; they read back as bytes).
`fields` holds the example's extra fields (every key but prompt and answer, see `rlkit.data.tasks`) as
canonical JSON (sorted keys, so equal fields are equal bytes): a tfds Text feature cannot hold nested values
of arbitrary structure, JSON can. `rlkit.data.pipeline.decode_record` turns it back into a dict.

Why this shape (see methods/platform.md §1): without TensorFlow, tfds can still *write* a
GeneratorBasedBuilder with file_format="array_record" and *read* it with `as_data_source()`; `tfds.load`,
`as_dataset` and the tfrecord format all need TF and are not used here.

Each parameter set gets its own BuilderConfig whose name is the task name plus a hash of the canonical JSON
of the parameters, so different configs never collide in one data_dir and the same config is built once:
`prepare` is idempotent (tfds skips a dataset whose files are complete, and writes into a temporary folder
that it renames at the end, so an interrupted build leaves nothing that looks finished).

Synthetic splits are `rlkit.data.splits.generate_splits` (no tfds there, so validating a config does not
import it).
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from typing import Any, Iterable, Mapping, Optional, Sequence

import tensorflow_datasets as tfds
from absl import logging

from rlkit.data.jsonl import as_field_names, load_jsonl
from rlkit.data.splits import generate_splits, stored_example
from rlkit.data.tasks import make_task

FILE_FORMAT = "array_record"   # the only random-access format tfds writes without TensorFlow


@dataclasses.dataclass(eq=False)
class TaskDatasetConfig(tfds.core.BuilderConfig):
  """`spec` is what the data depends on (hashed into the name); `paths` only says where JSONL files are."""
  spec: dict = dataclasses.field(default_factory=dict, repr=False)   # `description` holds it as JSON
  paths: dict = dataclasses.field(default_factory=dict)


def config_name(prefix: str, spec: Mapping[str, Any]) -> str:
  """A stable name: `prefix` plus 12 hex digits of sha256 over the spec's canonical (sorted-key) JSON."""
  try:
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
  except TypeError as e:
    raise ValueError("dataset parameters must be plain JSON values (str, int, float, bool, list, dict): "
                     f"{e}; got {spec!r}.") from None
  return f"{prefix}_{hashlib.sha256(canonical.encode()).hexdigest()[:12]}"


class TaskDataset(tfds.core.GeneratorBasedBuilder, skip_registration=True):
  """Prompts, answers and demonstrations of one task configuration (see the module docstring).

  skip_registration: configs are made on the fly from parameters, never looked up by name through
  `tfds.builder`, so the class stays out of tfds's global registry.
  """
  VERSION = tfds.core.Version("1.1.0")
  RELEASE_NOTES = {"1.0.0": "prompt, answer, demonstration.",
                   "1.1.0": "fields: the extra fields of each example as canonical JSON."}

  @tfds.core.utils.classproperty
  @classmethod
  def code_path(cls) -> None:
    # tfds only uses this to find a download-checksums file (we download nothing). Its default, for a
    # builder defined inside a package, touches `importlib_resources`, a backport tfds 4.9.10 declares
    # only for Python < 3.9, so on 3.11 it raised ModuleNotFoundError during download_and_prepare.
    return None

  # tfds announces a download ("Downloading and preparing dataset Unknown size ...") and draws progress bars;
  # nothing is downloaded here, so one line says what is written, and the bars are off (`_build`).
  def _log_download_bytes(self) -> None:
    print(f"data: writing {self.builder_config.name} to {self.data_dir}", flush=True)

  def _log_download_done(self) -> None:
    pass

  def _info(self) -> tfds.core.DatasetInfo:
    return self.dataset_info_from_configs(
        features=tfds.features.FeaturesDict({
            "prompt": tfds.features.Text(),
            "answer": tfds.features.Text(),
            "demonstration": tfds.features.Text(),
            "fields": tfds.features.Text(),   # canonical JSON object, "{}" when there are none
        }),
        # Keep generation order on disk; shuffling is the pipeline's job (seeded, checkpointable).
        disable_shuffling=True,
    )

  def _split_generators(self, dl_manager):
    del dl_manager  # everything is generated locally
    spec, paths = self.builder_config.spec, self.builder_config.paths
    if spec["kind"] == "synthetic":
      task = make_task(spec["task"], **spec["task_kwargs"])
      splits = generate_splits(task, spec["num_train"], spec["num_test"], spec["seed"])
    else:
      task = make_task("jsonl", path=next(iter(paths.values())))
      splits = {split: [stored_example(task, row) for row in load_jsonl(path)] for split, path in paths.items()}
    return {split: self._generate_examples(rows) for split, rows in splits.items() if rows}

  def _generate_examples(self, rows: Iterable[dict]):
    for i, row in enumerate(rows):
      yield i, row


def _build(prefix: str, spec: dict, data_dir: str, paths: Optional[dict] = None) -> dict[str, Any]:
  config = TaskDatasetConfig(name=config_name(prefix, spec), description=json.dumps(spec, sort_keys=True),
                             spec=spec, paths=dict(paths or {}))
  tfds.disable_progress_bar()
  verbosity = logging.get_verbosity()
  logging.set_verbosity(logging.ERROR)   # tfds warns "Using custom data configuration" for every build
  try:
    builder = TaskDataset(config=config, data_dir=os.fspath(data_dir), file_format=FILE_FORMAT)
    builder.download_and_prepare()   # no-op when this config's files already exist
  finally:
    logging.set_verbosity(verbosity)
  return dict(builder.as_data_source())


def prepare(task_name: str, task_kwargs: Mapping[str, Any], num_train: int, num_test: int, seed: int,
            data_dir: str) -> dict[str, Any]:
  """Builds the task's train/test array_record files once and returns {split: random-access source}.

  A source supports `len(src)` and `src[i] -> {"prompt", "answer", "demonstration", "fields"}` (all bytes;
  `fields` is JSON, see `rlkit.data.pipeline.decode_record`).
  """
  if not (isinstance(num_train, int) and num_train >= 1 and isinstance(num_test, int) and num_test >= 0):
    raise ValueError(f"prepare: need num_train >= 1 and num_test >= 0, got {num_train}, {num_test}.")
  task_kwargs = dict(task_kwargs)
  make_task(task_name, **task_kwargs)   # fail on bad parameters before touching data_dir
  spec = {"kind": "synthetic", "task": task_name, "task_kwargs": task_kwargs, "num_train": num_train,
          "num_test": num_test, "seed": int(seed)}
  return _build(task_name, spec, data_dir)


def file_sha256(path: str) -> str:
  """The SHA-256 of a file's bytes, read in 1 MiB blocks."""
  digest = hashlib.sha256()
  with open(path, "rb") as f:
    for block in iter(lambda: f.read(1 << 20), b""):
      digest.update(block)
  return digest.hexdigest()


def prepare_jsonl(split_paths: Mapping[str, str], data_dir: str,
                  required_fields: Sequence[str] = ()) -> dict[str, Any]:
  """Writes JSONL files ({"train": path, "test": path, ...}) as array_record; returns {split: source}.

  The config name hashes the files' contents, not their paths: editing a file gives a new dataset, moving
  it does not. Every file is validated first (every line of every split must have `required_fields`, e.g.
  the jsonl task's), so a malformed one fails before anything is written.
  """
  if not split_paths:
    raise ValueError("prepare_jsonl: give at least one split, e.g. {'train': 'data/train.jsonl'}.")
  paths = {split: os.fspath(p) for split, p in split_paths.items()}
  required = as_field_names(required_fields, "prepare_jsonl")
  for path in paths.values():
    load_jsonl(path, required)
  # required_fields only validate: the stored data, hence the name, does not depend on them
  spec = {"kind": "jsonl", "sha256": {split: file_sha256(p) for split, p in paths.items()}}
  return _build("jsonl", spec, data_dir, paths)
