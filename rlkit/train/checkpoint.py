"""Checkpoints: Orbax `CheckpointManager` over (train state pytree, JSON metadata).

A checkpoint holds everything a run needs to continue exactly as if it had never stopped: params, optimizer
state, the global step, and JSON metadata (stage index and step within it, data-iterator state, PRNG key
data, and anything else the loop wants back). Orbax writes each step into a temporary folder and renames it
only once complete, so a save killed mid-write never replaces the previous good checkpoint; unfinished
temporary folders are ignored on restore. Saves are synchronous: a step reported as saved is on disk.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import jax
import orbax.checkpoint as ocp


class Checkpointer:
  """Saves every `every` steps (and when forced), keeps the newest `max_to_keep`."""

  def __init__(self, directory: str, every: int, max_to_keep: int = 2):
    self.directory = os.path.abspath(directory)
    self.every = every
    options = ocp.CheckpointManagerOptions(max_to_keep=max_to_keep, create=True,
                                           enable_async_checkpointing=False)
    self._manager = ocp.CheckpointManager(self.directory, options=options)

  def latest_step(self) -> Optional[int]:
    return self._manager.latest_step()

  def should_save(self, step: int) -> bool:
    return self.every > 0 and step % self.every == 0

  def save(self, step: int, state: Any, meta: dict) -> None:
    if step in self._manager.all_steps():
      return
    self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     meta=ocp.args.JsonSave(meta)), force=True)
    self._manager.wait_until_finished()

  def restore(self, step: int, target: Any) -> tuple[Any, dict]:
    """Restores onto `target`'s structure, shapes, dtypes and shardings (arrays or ShapeDtypeStructs)."""
    abstract = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=getattr(x, "sharding", None)), target)
    out = self._manager.restore(step, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                              meta=ocp.args.JsonRestore()))
    return out.state, out.meta

  def restore_meta(self, step: int) -> dict:
    """Only the JSON metadata of a checkpoint (cheap: no arrays are read)."""
    return self._manager.restore(step, args=ocp.args.Composite(meta=ocp.args.JsonRestore())).meta

  def close(self) -> None:
    self._manager.close()
