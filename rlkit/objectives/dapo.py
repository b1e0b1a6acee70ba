"""DAPO's batch-level pieces: dynamic sampling (drop flat groups, refill) and soft overlong punishment.

(The other two DAPO changes live elsewhere: clip-higher is `ppo_clip_loss(eps_low=0.2, eps_high=0.28)`,
token-level loss is the "token-mean" aggregation.) methods/llm.md §12, "DAPO".

Dynamic sampling: a group whose rewards (or accuracies) are all equal has zero advantage and no gradient,
so it only dilutes the batch. DAPO keeps sampling rounds until `target_groups` informative groups are
collected, then trains on exactly that many (verl recipe `filter_groups`, `fill_to_train_bsz`).
`dynamic_sampling_select` is a host-side (numpy) helper for that loop, outside any jitted step.

Overlong punishment, with `L_start = max_len - cache_len`:

  r_len(L) = 0                                   L <= L_start
           = -factor * (L - L_start) / cache_len L_start < L <= max_len
           = -factor                              L > max_len

Tunix and the verl recipe use the middle line without a floor; we floor at -factor so lengths past
`max_len` (e.g. a sampler with a larger cap) are not punished without bound.
"""
from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from rlkit.objectives.advantages import informative_groups

__all__ = ["informative_groups", "DynamicSampleSelection", "dynamic_sampling_select", "overlong_penalty"]


class DynamicSampleSelection(NamedTuple):
  """Result of `dynamic_sampling_select`.

  Attributes:
    done: True when at least `target_groups` informative groups exist; then `group_indices` holds exactly
      `target_groups` of them. False: sample another round, append it, and call again.
    group_indices: `[k]` int64 indices of the kept groups in the accumulated batch, in order.
    row_indices: `[k * G]` int64 rows of those groups (each group's G rows contiguous), for gathering.
    num_informative: informative groups found so far (may exceed `target_groups`; the surplus is dropped).
  """
  done: bool
  group_indices: np.ndarray
  row_indices: np.ndarray
  num_informative: int


def dynamic_sampling_select(rewards: np.ndarray, group_size: int,
                            target_groups: int) -> DynamicSampleSelection:
  """Picks the first `target_groups` informative groups from all groups sampled so far.

  :param rewards: `[N_total]` per-row reward (or accuracy: whatever the filter is on) of every round so
    far, rounds concatenated in order, each group's G rows contiguous.
  :param group_size: G.
  :param target_groups: groups the training batch needs.
  :returns: a `DynamicSampleSelection`. Taking the first groups in sampling order (not a random subset)
    keeps the result a deterministic function of the rollouts, as in verl.
  """
  rewards = np.asarray(rewards)
  if rewards.ndim != 1 or group_size < 1 or rewards.shape[0] % group_size:
    raise ValueError(
        f"rewards must be a flat vector of whole groups of {group_size}, got shape {rewards.shape}.")
  if target_groups < 1:
    raise ValueError(f"target_groups must be >= 1, got {target_groups}.")
  grouped = rewards.reshape(-1, group_size)
  # Numpy, not `informative_groups`: host-side, and float64 rewards must not be rounded to float32.
  informative = np.flatnonzero(grouped.max(axis=1) > grouped.min(axis=1))
  kept = informative[:target_groups].astype(np.int64)
  rows = (kept[:, None] * group_size + np.arange(group_size, dtype=np.int64)).reshape(-1)
  return DynamicSampleSelection(done=bool(informative.size >= target_groups), group_indices=kept,
                                row_indices=rows, num_informative=int(informative.size))


def overlong_penalty(lengths: jax.Array, max_len: int, cache_len: int, factor: float = 1.0) -> jax.Array:
  """DAPO soft overlong punishment per row, `[N]` lengths -> `[N]` float32 rewards in [-factor, 0].

  :param lengths: response lengths in tokens.
  :param max_len: L_max, where the penalty reaches -factor.
  :param cache_len: L_cache, the width of the linear ramp ending at `max_len`.
  :param factor: penalty at and beyond `max_len`.
  """
  if not 0 < cache_len <= max_len:
    raise ValueError(f"Need 0 < cache_len <= max_len, got cache_len={cache_len}, max_len={max_len}.")
  excess = jnp.asarray(lengths).astype(jnp.float32) - (max_len - cache_len)
  return -factor * jnp.clip(excess / cache_len, 0.0, 1.0)
