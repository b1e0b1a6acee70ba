"""Where an embodied stage's flow expert comes from: the preceding stage's, another run's saved one
(`<stage>.expert_path`), or a fresh one.

`expert_path` names a workdir (its newest checkpoint), its `checkpoints` folder, or one `checkpoints/<step>`
folder of any embodied run. The expert is the saved params themselves (a flow_bc or fpo stage) or their `flow`
subtree (a reinflow stage, whose params add the noise head); a LoRA-trained stage's params are refused (its
expert is base + adapters: start from the checkpoint it was trained from). So one behaviour-cloned expert starts
many RL runs, as `model.path=WORKDIR` starts many RL runs of a language model from one SFT run.
"""
from __future__ import annotations

import os
from typing import Any, Optional

import jax
import jax.numpy as jnp

from rlkit.core.errors import ConfigError
from rlkit.envs import Env
from rlkit.models.flow import init_flow
from rlkit.train.checkpoint import CheckpointReader


def _locate(path: str) -> tuple[str, Optional[int]]:
  """(a checkpoints folder, the step to read or None for its newest) of an `expert_path`."""
  path = os.path.abspath(path)
  if os.path.isdir(os.path.join(path, "checkpoints")):
    return os.path.join(path, "checkpoints"), None
  name = os.path.basename(path)
  if name.isdigit() and os.path.isdir(path):
    return os.path.dirname(path), int(name)
  if os.path.isdir(path):
    return path, None
  raise ConfigError(f"expert_path={path!r} does not exist: give the saving run's workdir (an embodied or "
                    "gen_pretrain run), its checkpoints folder or one checkpoints/<step> folder.")


def _like(tree: Any, fresh: Any) -> bool:
  return (jax.tree.structure(tree) == jax.tree.structure(fresh)
          and all(tuple(a.shape) == tuple(b.shape) for a, b in zip(jax.tree.leaves(tree), jax.tree.leaves(fresh))))


def saved_expert(path: str, fresh: Any) -> Any:
  """The flow expert saved under `path` (module docstring), checked against `fresh` (an expert of the stage's
  `flow` fields and environment)."""
  directory, step = _locate(path)
  reader = CheckpointReader(directory)
  try:
    step = reader.latest_step() if step is None else step
    if step is None:
      raise ConfigError(f"expert_path={path!r}: {directory} holds no finished checkpoint; point it at a run that "
                        "saved one.")
    # read onto one device, then made uncommitted arrays like a fresh expert's, which the run's mesh places
    params = jax.tree.map(jnp.asarray, jax.device_get(reader.restore_saved_params(step)))
  finally:
    reader.close()
  for candidate in (params, params.get("flow") if isinstance(params, dict) else None):
    if candidate is not None and _like(candidate, fresh):
      return candidate
  raise ConfigError(f"expert_path={path!r}: the params of checkpoint step {step} are not a flow expert of this "
                    f"stage's `flow` fields and environment or data (top-level keys "
                    f"{sorted(params) if isinstance(params, dict) else type(params).__name__}); give the same flow "
                    "fields and env (or data) as the run that saved it (a LoRA-trained stage's params are not an "
                    "expert: start from the checkpoint it was trained from).")


def expert_params(params: Any, cfg, env: Env, fc, key) -> Any:
  """The stage's starting expert: the preceding stage's (`params`), else the one saved at `cfg.expert_path`, else
  a fresh one; a clear error for preceding params that are not an expert of the stage's `flow` fields."""
  fresh = init_flow(fc, env.obs_dim, key)
  if params is None:
    return saved_expert(cfg.expert_path, fresh) if cfg.get("expert_path") else fresh
  if cfg.get("expert_path"):
    raise ConfigError("expert_path is set on a stage that follows another: it starts from the preceding stage's "
                      "expert; set expert_path only on a run's first stage.")
  if not _like(params, fresh):
    raise ConfigError("An embodied stage starts from the preceding stage's flow expert, but its parameters are not "
                      "an expert of this stage's `flow` fields and environment: put a flow_bc stage with the same flow "
                      "and env fields before it, or make it the run's first stage (a fresh expert, or expert_path).")
  return params
