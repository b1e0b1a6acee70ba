"""Checkpoints: Orbax `CheckpointManager` over (train state pytree, JSON metadata, JSON model spec).

A checkpoint holds everything a run needs to continue exactly as if it had never stopped: params, optimizer
state, the global step, and JSON metadata (stage index and step within it, data-iterator state, PRNG key
data, and anything else the loop wants back). Orbax writes each step into a temporary folder and renames it
only once complete, so a save killed mid-write never replaces the previous good checkpoint; unfinished
temporary folders are ignored on restore. Saves are synchronous: a step reported as saved is on disk.

Each step folder `<directory>/<step>/` holds one Orbax item per part:

  state   the stage state pytree, `{"train": TrainState(step, params, opt_state), ...}` (StandardSave),
          without its transient entries (`TRANSIENT`: what a stage rebuilds from the rest when it starts)
  meta    the loop's JSON metadata
  model   the model spec (`Checkpointer(..., model_spec=...)`): what the params are, as JSON
          (`rlkit.train.models.model_spec`), so that `rlkit.train.models.load_model` can rebuild the model

`CheckpointReader` reads checkpoints without knowing the optimizer that wrote them: `restore_params` restores
only `state["train"].params`, by an Orbax partial restore (see its docstring).
"""
from __future__ import annotations

import dataclasses
import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp
from orbax.checkpoint._src.metadata import array_metadata_store
from orbax.checkpoint._src.serialization import type_handler_registry
from orbax.checkpoint.checkpoint_managers import preservation_policy

from rlkit.parallel.rules import path_str

STATE, META, MODEL = "state", "meta", "model"   # item names inside a step folder

# State entries (dict keys, at any depth) that are not saved: each is a function of the rest, rebuilt when the
# stage starts, so a resumed run holds what an uninterrupted one does. Registered by their owners, e.g. the
# sampler's weight copy (rl.sync, rlkit/train/weight_sync.py), remade from the restored master.
TRANSIENT: set = set()


def persistent(state: Any) -> Any:
  """`state` without its TRANSIENT entries (what a checkpoint holds)."""
  if isinstance(state, dict):
    return {k: persistent(v) for k, v in state.items() if k not in TRANSIENT}
  return state


def _state_handler() -> ocp.StandardCheckpointHandler:
  """The state item's handler: Orbax's standard one, but in a single process without replica-parallel writes.

  Orbax (0.12, off the GPU) splits each replicated array into one slice per replica so that several hosts
  share the writing; in one process the same process writes every slice, so the split only adds a device
  slice and a host transfer per replica per array: on 8 simulated CPU devices ~3x the time of a small save, and
  each slice an eager op compiled per shape and device (56 of the 139 compiles of a `test`-preset run).
  A checkpoint written either way restores the same. The standard handler takes no type registry, hence its
  `_impl` is rebuilt with one (orbax-checkpoint is pinned in requirements.txt).
  """
  handler = ocp.StandardCheckpointHandler()
  if jax.process_count() == 1:
    # Orbax's default registry with its jax.Array handler (built as Orbax builds it) made serial.
    array = ocp.type_handlers.ArrayHandler(use_replica_parallel=False,
                                           array_metadata_store=array_metadata_store.Store())
    handlers = [(ty, array if ty is jax.Array else h) for ty, h in type_handler_registry._DEFAULT_TYPE_HANDLERS]
    handler._impl = ocp.PyTreeCheckpointHandler(
        type_handler_registry=type_handler_registry.create_type_handler_registry(*handlers))
  return handler


class Checkpointer:
  """Saves every `every` steps (and when forced), keeps the newest `max_to_keep` and, whatever that is, the
  last checkpoint of every stage (the one whose metadata says `done`), so a finished SFT stage can still
  start another run (`model.path=WORKDIR/checkpoints/<step>`) after RL has rotated newer ones out.

  `model_spec` (a JSON dict), when given, is written into every checkpoint as the `model` item.
  """

  def __init__(self, directory: str, every: int, max_to_keep: int = 2, model_spec: Optional[dict] = None):
    self.directory = os.path.abspath(directory)
    self.every = every
    self.model_spec = model_spec
    self._final_steps: set[int] = set()   # read by the preservation policy at every save
    policy = preservation_policy.AnyPreservationPolicy(
        [preservation_policy.LatestN(max_to_keep), _KeepSteps(self._final_steps)])
    options = ocp.CheckpointManagerOptions(create=True, enable_async_checkpointing=False,
                                           preservation_policy=policy)
    handlers = {STATE: _state_handler(), META: ocp.JsonCheckpointHandler(), MODEL: ocp.JsonCheckpointHandler()}
    self._manager = ocp.CheckpointManager(self.directory, item_handlers=handlers, options=options)
    # Orbax does not persist which steps a policy chose to keep, so they are found again from the metadata.
    self._final_steps.update(s for s in self._manager.all_steps() if self.restore_meta(s).get("done"))

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def should_save(self, step: int) -> bool:
    return self.every > 0 and step % self.every == 0

  def save(self, step: int, state: Any, meta: dict) -> None:
    if step in self._manager.all_steps():
      return
    items = {STATE: ocp.args.StandardSave(persistent(state)), META: ocp.args.JsonSave(meta)}
    if self.model_spec is not None:
      items[MODEL] = ocp.args.JsonSave(self.model_spec)
    if meta.get("done"):
      self._final_steps.add(step)
    self._manager.save(step, args=ocp.args.Composite(**items), force=True)
    self._manager.wait_until_finished()

  def restore(self, step: int, target: Any) -> tuple[Any, dict]:
    """Restores onto `target`'s structure, shapes, dtypes and shardings (arrays or ShapeDtypeStructs)."""
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), target)
    out = self._manager.restore(step, args=ocp.args.Composite(**{STATE: ocp.args.StandardRestore(abstract),
                                                                 META: ocp.args.JsonRestore()}))
    return out.state, out.meta

  def restore_meta(self, step: int) -> dict:
    """Only the JSON metadata of a checkpoint (cheap: no arrays are read)."""
    return self._manager.restore(step, args=ocp.args.Composite(**{META: ocp.args.JsonRestore()})).meta

  def close(self) -> None:
    self._manager.close()


@dataclasses.dataclass
class _KeepSteps(preservation_policy.PreservationPolicy):
  """Preserves the checkpoints whose step is in `steps` (a set the Checkpointer keeps up to date)."""
  steps: set

  def should_preserve(self, checkpoints, *, context) -> list[bool]:
    del context
    return [c.step in self.steps for c in checkpoints]


# ------------------------------------------------------------------------------------------- reading

def _on_one_device(metadata: Any) -> Any:
  """ShapeDtypeStructs on the first local device for a tree of Orbax array metadata."""
  one = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])
  return jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), m.dtype, sharding=one), metadata)


class CheckpointReader:
  """Reads the checkpoints under `directory` without writing anything (Orbax `read_only`).

  The state item is read through `PyTreeCheckpointHandler`: it reads the files that the
  `StandardCheckpointHandler` of `Checkpointer.save` wrote (the standard handler wraps it) and, unlike the
  standard one, offers `partial_restore`.
  """

  def __init__(self, directory: str):
    self.directory = os.path.abspath(directory)
    options = ocp.CheckpointManagerOptions(read_only=True, create=False, max_to_keep=None,
                                           save_interval_steps=0, enable_async_checkpointing=False)
    handlers = {STATE: ocp.PyTreeCheckpointHandler(), META: ocp.JsonCheckpointHandler(),
                MODEL: ocp.JsonCheckpointHandler()}
    self._manager = ocp.CheckpointManager(self.directory, item_handlers=handlers, options=options)

  def latest_step(self) -> Optional[int]:
    """The newest finished step (unfinished temporary folders are skipped), None if there is none."""
    return self._manager.latest_step()

  def step_dir(self, step: int) -> str:
    return os.path.join(self.directory, str(step))

  def model_spec(self, step: int) -> dict:
    """The `model` item of `step`; a checkpoint written without one is refused by name."""
    where = self.step_dir(step)
    if not os.path.isdir(os.path.join(where, MODEL)):
      raise FileNotFoundError(
          f"Checkpoint {where} has no model spec (no {MODEL!r} item, only {sorted(os.listdir(where))}): it was "
          "saved without Checkpointer(model_spec=...), e.g. by an older rlkit, so which model and tokenizer "
          "its params belong to is unknown. Build the model from config fields and read the params with "
          "CheckpointReader.restore_params, or re-save the checkpoint with a model spec.")
    return self._manager.restore(step, args=ocp.args.Composite(**{MODEL: ocp.args.JsonRestore()}))[MODEL]

  def saved_params(self, step: int) -> Any:
    """The metadata (shape, dtype per leaf) of `state["train"].params` of `step`; nothing is read."""
    tree = self._manager.item_metadata(step)[STATE].tree
    saved = tree.get("train", {}).get("params") if isinstance(tree, dict) else None
    if saved is None:
      raise ValueError(f"Checkpoint {self.step_dir(step)} has no train/params in its state (top-level keys: "
                       f"{sorted(tree) if isinstance(tree, dict) else type(tree).__name__}); expected a stage "
                       "state {'train': TrainState(step, params, opt_state), ...}.")
    return saved

  def restore_saved_params(self, step: int) -> Any:
    """`state["train"].params` of `step` as saved (its tree from the metadata), every array on one device: for a
    caller that does not know the params' structure in advance (e.g. which stage wrote them)."""
    return self.restore_params(step, _on_one_device(self.saved_params(step)))

  def restore_state(self, step: int) -> Any:
    """The whole saved state of `step` (params, optimizer state, everything else), every array on one device,
    its tree read from the checkpoint's metadata: for analysis tools that need, e.g., Adam's second moments."""
    target = _on_one_device(self._manager.item_metadata(step)[STATE].tree)
    restore_args = jax.tree.map(lambda t: ocp.ArrayRestoreArgs(sharding=t.sharding, dtype=t.dtype), target)
    out = self._manager.restore(step, args=ocp.args.Composite(**{STATE: ocp.args.PyTreeRestore(
        item=target, restore_args=restore_args)}))
    return out[STATE]

  def restore_params(self, step: int, target: Any) -> Any:
    """`state["train"].params` of `step`, restored onto `target` (ShapeDtypeStructs with shardings).

    Only the params are read, whatever else the state holds (the state of any optimizer, reference params):
    the state's tree comes from the checkpoint's metadata, its `train/params` subtree is checked against
    `target` (same paths and shapes, else a `ValueError` listing the differences), and Orbax restores
    `PyTreeRestore(item={"train": {"params": target}}, partial_restore=True)`, which drops every leaf the
    item omits before reading anything. Each array is read straight into its `target` sharding and cast to
    its `target` dtype.
    """
    where = self.step_dir(step)
    _check_like(self.saved_params(step), target, where)
    item = {"train": {"params": target}}
    restore_args = jax.tree.map(lambda t: ocp.ArrayRestoreArgs(sharding=t.sharding, dtype=t.dtype), item)
    out = self._manager.restore(step, args=ocp.args.Composite(**{STATE: ocp.args.PyTreeRestore(
        item=item, restore_args=restore_args, partial_restore=True)}))
    return out[STATE]["train"]["params"]

  def close(self) -> None:
    self._manager.close()


def _shapes(tree: Any) -> dict[str, tuple[int, ...]]:
  return {path_str(p): tuple(x.shape) for p, x in jax.tree_util.tree_leaves_with_path(tree)}


def _check_like(saved: Any, target: Any, where: str) -> None:
  got, want = _shapes(saved), _shapes(target)
  if got != want:
    diff = sorted(f"{k}: checkpoint {got.get(k)}, expected {want.get(k)}" for k in set(got) | set(want)
                  if got.get(k) != want.get(k))
    raise ValueError(f"Checkpoint {where} holds params that do not match the expected model: "
                     f"{diff[:10]}{' ...' if len(diff) > 10 else ''}.")
