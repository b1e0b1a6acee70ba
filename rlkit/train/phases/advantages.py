"""Phase 5, advantages: per-token advantages `[N, R]` from the rewards of each group (registry
`ADVANTAGES`, config `rl.advantage`; estimators in `rlkit.objectives.advantages`).

Groups are `capacity` contiguous rows. When augmenters left padding rows (`valid` False), each group's
statistics are taken over its valid rows only and padding rows get advantage 0; with every row valid the
estimator runs unmasked, exactly as on a plain GRPO batch.
"""
from __future__ import annotations

from typing import Optional

import jax.numpy as jnp
import numpy as np

from rlkit.objectives import group_advantages


def token_advantages(name: str, rewards: np.ndarray, capacity: int, response_len: int, eps: float,
                     valid: Optional[np.ndarray] = None) -> jnp.ndarray:
  """[N] rewards -> [N, R] float32 advantages (each row's advantage on every response position)."""
  r = jnp.asarray(rewards, jnp.float32)
  if valid is not None and np.all(valid):
    valid = None
  adv = group_advantages(name, r, capacity, eps, valid=None if valid is None else jnp.asarray(valid))
  return jnp.broadcast_to(adv[:, None], (adv.shape[0], response_len))
