"""Phase 8, update: `epochs` passes over the iteration's rows, each split into `minibatches` shuffled
optimizer steps of the jitted step; metrics combined by their declared reductions (`Metric.reduce`).
"""
from __future__ import annotations

import jax
import numpy as np

from rlkit.train.steps import combine_metrics


def reduce_over_steps(sums: dict, steps: int) -> dict[str, float]:
  """Host floats from device metrics combined over `steps` update steps: means averaged, the rest as is."""
  host = jax.device_get({k: m.value for k, m in sums.items()})
  return {k: float(host[k]) / steps if m.reduce == "mean" else float(host[k]) for k, m in sums.items()}


def ppo_updates(step_fn, train, batch, key, epochs: int, minibatches: int, step_inputs: dict):
  """Returns (train state, combined metrics {name: float}, per-step skipped flags [epochs * minibatches])."""
  n_rows = batch.num_rows
  sums, skipped = None, []
  for epoch in range(epochs):
    perm = np.asarray(jax.random.permutation(jax.random.fold_in(key, 7_000 + epoch), n_rows))
    for part in np.split(perm, minibatches):
      train, m = step_fn(train, jax.tree.map(lambda x: x[part], batch), step_inputs)
      skipped.append(m["skipped_updates"].value)
      sums = m if sums is None else combine_metrics(sums, m)
  return train, reduce_over_steps(sums, epochs * minibatches), np.asarray(jax.device_get(skipped))
