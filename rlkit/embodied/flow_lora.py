"""LoRA adapters for a flow expert's Dense kernels (methods/embodied.md §2: "LoRA targeted at the timestep modules
vs standard LoRA"): W' = W + (alpha / r) A B on every 2-D kernel whose '/'-joined path matches `targets`, with A
[in, r] ~ N(0, 1 / in) and B [r, out] = 0, so the merged expert starts equal to W. The adapters are a flat dict
{path: {"a", "b"}}; `merge` rebuilds the expert's params. `TARGETS` names the two readings the study compares.
"""
from __future__ import annotations

import re
from typing import Any

import jax
import jax.numpy as jnp

from rlkit.models.flow import TIMESTEP_MODULES
from rlkit.parallel.rules import path_str

TARGETS = {"timestep": TIMESTEP_MODULES, "all": r"kernel$"}


def pattern(targets: str) -> str:
  """A `TARGETS` name or a regex over parameter paths."""
  return TARGETS.get(targets, targets)


def init_adapters(params: Any, targets: str, rank: int, key) -> dict:
  """{path: {"a": [in, r], "b": [r, out]}} for every 2-D kernel of `params` matching `targets`."""
  regex = pattern(targets)
  out = {}
  for i, (path, leaf) in enumerate(jax.tree_util.tree_flatten_with_path(params)[0]):
    name = path_str(path)
    if leaf.ndim == 2 and name.endswith("kernel") and re.search(regex, name):
      fan_in, fan_out = leaf.shape
      a = jax.random.normal(jax.random.fold_in(key, i), (fan_in, rank)) / jnp.sqrt(fan_in)
      out[name] = {"a": a.astype(leaf.dtype), "b": jnp.zeros((rank, fan_out), leaf.dtype)}
  if not out:
    raise ValueError(f"LoRA targets {targets!r} match no 2-D kernel of the expert; its kernels: "
                     f"{[path_str(p) for p, x in jax.tree_util.tree_flatten_with_path(params)[0] if x.ndim == 2]}.")
  return out


def merge(params: Any, adapters: dict, alpha: float, rank: int) -> Any:
  """The expert's params with every adapted kernel W + (alpha / rank) A B."""
  scale = alpha / rank

  def one(path, leaf):
    ad = adapters.get(path_str(path))
    return leaf if ad is None else leaf + scale * ad["a"] @ ad["b"]
  return jax.tree_util.tree_map_with_path(one, params)
