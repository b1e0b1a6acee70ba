"""Phase 3, filter: which groups of the rows sampled so far to train on, and whether to sample more
(registry `FILTERS`, config `rl.filter`).

A filter is `fn(rewards [n], group_size, target_groups) -> Selection`: `done` says the collected rows
suffice (else the stage samples another round of prompts, up to `rl.max_sampling_rounds` extra ones), and
`groups` lists the kept groups in order. `select_rows` turns the final selection into exactly
`target_groups` groups of rows: when too few groups qualified after the last round, the first others are
added (they carry no gradient when their advantages are 0, e.g. DAPO's flat groups).

  none              keep the first target_groups groups (no extra sampling)
  dynamic_sampling  DAPO: keep groups whose rewards are not all equal; sample more until enough
"""
from __future__ import annotations

from typing import Callable, NamedTuple

import numpy as np

from rlkit.core.registry import Registry
from rlkit.objectives import dynamic_sampling_select


class Selection(NamedTuple):
  done: bool
  groups: np.ndarray            # [k] int64 indices of the kept groups (k <= target_groups)


FILTERS: Registry[Callable[..., Selection]] = Registry("group filter")


@FILTERS.register("none")
def keep_all(rewards: np.ndarray, group_size: int, target_groups: int) -> Selection:
  return Selection(True, np.arange(min(len(rewards) // group_size, target_groups), dtype=np.int64))


@FILTERS.register("dynamic_sampling")
def informative_only(rewards: np.ndarray, group_size: int, target_groups: int) -> Selection:
  sel = dynamic_sampling_select(rewards, group_size, target_groups)
  return Selection(sel.done, sel.group_indices)


def select_rows(selection: Selection, num_rows: int, group_size: int, target_groups: int) -> np.ndarray:
  """Rows of exactly `target_groups` groups: the selected ones, topped up with the first unselected."""
  groups = selection.groups
  if len(groups) < target_groups:
    rest = np.setdiff1d(np.arange(num_rows // group_size), groups)[:target_groups - len(groups)]
    groups = np.concatenate([groups, rest])
  return (groups[:, None] * group_size + np.arange(group_size)).reshape(-1)
