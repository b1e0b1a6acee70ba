"""Host-side views of global arrays in multi-process runs: each process's own rows, and sums over processes.

With one process everything here is the identity. With several (`jax.distributed`), a batch-sharded global
array is not fully addressable: `host_rows` returns the rows whose shards live on this process (its
contiguous slice of the global batch, the slice `shard_batch` placed there), so decoding, rewards and
metrics run on each host's own rows; `process_sum` and `process_max` combine host-side numbers so every
process (and the metrics process 0 writes) sees the global value.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def host_rows(x) -> np.ndarray:
  """This process's rows of a batch-sharded global array, in global order (all rows on one process)."""
  if not isinstance(x, jax.Array) or x.is_fully_addressable:
    return np.asarray(x)
  if x.is_fully_replicated:
    return np.asarray(x.addressable_data(0))
  shards = {}
  for shard in x.addressable_shards:
    rows = shard.index[0] if shard.index else slice(None)
    shards.setdefault(rows.start or 0, shard.data)
  return np.concatenate([np.asarray(shards[k]) for k in sorted(shards)], axis=0)


def _gathered(values) -> np.ndarray:
  """[P, ...] float64 values of every process. Sent as raw bytes: without jax_enable_x64 an allgather of
  float64 would round to float32, and the sums would differ from a one-process run's."""
  from jax.experimental import multihost_utils
  values = np.ascontiguousarray(values, np.float64)
  raw = np.asarray(multihost_utils.process_allgather(values.view(np.uint8)))
  return raw.view(np.float64).reshape((raw.shape[0],) + values.shape)


def process_sum(values) -> np.ndarray:
  """Elementwise sum over processes of a host array (float64); the array itself with one process."""
  values = np.asarray(values, np.float64)
  return values if jax.process_count() == 1 else _gathered(values).sum(axis=0)


def process_max(values) -> np.ndarray:
  """Elementwise max over processes of a host array (float64)."""
  values = np.asarray(values, np.float64)
  return values if jax.process_count() == 1 else _gathered(values).max(axis=0)


def _process_major(x, index: np.ndarray):
  """Rows `index` of a global array, laid out again with the data sharding (each process its own block)."""
  sharding = getattr(x, "sharding", None)
  return jax.jit(lambda a: a[index], out_shardings=sharding)(x)


def take_rows(tree, rows: np.ndarray, num_local: int):
  """Rows `rows` (this process's indices into its own `num_local` rows) of every leaf of a global pytree.

  One process: plain indexing. Several: every process's choice is gathered (they may differ) and each
  process's chosen rows stay in its own block of the result, so `host_rows` of the result are its rows.
  """
  rows = np.asarray(rows, np.int64)
  if jax.process_count() == 1:
    return jax.tree.map(lambda x: x[rows], tree)
  from jax.experimental import multihost_utils
  chosen = np.asarray(multihost_utils.process_allgather(rows))                       # [P, k]
  index = (chosen + num_local * np.arange(chosen.shape[0])[:, None]).reshape(-1)
  return jax.tree.map(lambda x: _process_major(x, index), tree)


def concat_rows(trees: list, num_local: list[int]):
  """Concatenation along rows of global pytrees, each process's parts in its own block (one process:
  `jnp.concatenate`)."""
  joined = jax.tree.map(lambda *xs: jnp.concatenate(xs, axis=0), *trees)
  if jax.process_count() == 1:
    return joined
  procs = jax.process_count()
  offsets = np.cumsum([0] + [n * procs for n in num_local])[:-1]
  index = np.concatenate([off + p * n + np.arange(n) for p in range(procs)
                          for off, n in zip(offsets, num_local)])
  return jax.tree.map(lambda x: _process_major(x, index), joined)
