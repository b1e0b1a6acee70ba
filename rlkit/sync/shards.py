"""Where each device's block of a tensor sits, and per-tensor checksums computed shard by shard.

A weight sync moves a tensor between two layouts (a train mesh's sharding and a sampler mesh's). Both sides
work per device under `jax.shard_map`; this module gives them the static geometry of a layout, in the row
order of `mesh.devices.flat` (the order in which `P(mesh.axis_names)` stacks per-device rows):

  offsets[r]   the global coordinates of row r's block (from `sharding.devices_indices_map(shape)`)
  replica[r]   0 for the first device (in mesh order) holding its block, 1 for the next copy, ...

and `offsets_on_devices`, which hands each device its own row inside a shard_map.

Verification: `device_checksums(x)` is each device's partial checksum (`codec.checksum`) of the block it
holds. The devices with replica k together hold every block once, so their partial sums add up to the
tensor's checksum: `tensor_checksum` uses replica 0; `verify` requires every replica set to match, so a copy
that one replicated sampler device missed is caught too.
"""
from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P, SingleDeviceSharding

from rlkit.sync.codec import checksum

Array = jax.Array


class Geometry(NamedTuple):
  """A tensor of `shape` laid out by `sharding`: its blocks' shape and, per mesh device, offsets/replica."""
  sharding: NamedSharding
  shape: tuple
  local_shape: tuple
  offsets: np.ndarray     # int32[devices, ndim]
  replica: np.ndarray     # int32[devices]

  @property
  def rows(self) -> P:
    """The spec that stacks one row per mesh device along dim 0."""
    return P(tuple(self.sharding.mesh.axis_names))


def named_sharding(sharding) -> NamedSharding:
  """`sharding` as a NamedSharding (a single device becomes a 1-device mesh); other kinds are refused."""
  if isinstance(sharding, NamedSharding):
    return sharding
  if isinstance(sharding, SingleDeviceSharding):
    return NamedSharding(Mesh(np.array(list(sharding.device_set)), ("device",)), P())
  raise TypeError(f"Weight sync needs NamedSharding (or single-device) arrays, got {type(sharding).__name__}; "
                  f"place the params with rlkit.parallel.shard_params or jax.device_put(x, NamedSharding(...)).")


@functools.lru_cache(maxsize=None)
def geometry(sharding: NamedSharding, shape: tuple) -> Geometry:
  """The static geometry of `shape` under `sharding` (cached: it is asked for at every sync)."""
  shape = tuple(int(s) for s in shape)
  local_shape = tuple(sharding.shard_shape(shape))
  index_map = sharding.devices_indices_map(shape)
  offsets, replica, seen = [], [], {}
  for device in sharding.mesh.devices.flat:
    block = tuple(sl.indices(size)[:2] for sl, size in zip(index_map[device], shape))
    if any(stop - start != n for (start, stop), n in zip(block, local_shape)):
      raise ValueError(f"Weight sync needs evenly divided shards: {shape} under {sharding.spec} gives device "
                       f"{device} the block {block}, not of shape {local_shape}.")
    offsets.append([start for start, _ in block])
    replica.append(seen.get(block, 0))
    seen[block] = replica[-1] + 1
  return Geometry(sharding, shape, local_shape, np.asarray(offsets, np.int32).reshape(len(replica), len(shape)),
                  np.asarray(replica, np.int32))


@functools.lru_cache(maxsize=None)
def offsets_on_devices(sharding: NamedSharding, shape: tuple) -> Array:
  """`geometry(sharding, shape).offsets` with row r on device r: a per-device input of the shard_maps."""
  g = geometry(sharding, shape)
  return jax.device_put(g.offsets, NamedSharding(sharding.mesh, g.rows))


@functools.lru_cache(maxsize=None)
def _device_checksum_fn(sharding: NamedSharding, shape: tuple):
  g = geometry(sharding, shape)

  def local(block, offsets):
    return checksum(block, offsets[0], shape)[None]

  return jax.jit(jax.shard_map(local, mesh=sharding.mesh, in_specs=(sharding.spec, g.rows), out_specs=g.rows,
                               check_vma=False))


def device_checksums(x: Array) -> tuple[Array, np.ndarray]:
  """(each mesh device's partial checksum of its block, uint32[devices], dispatched, not fetched; the
  devices' replica numbers)."""
  sharding = named_sharding(x.sharding)
  if x.sharding is not sharding:                 # a single-device array: view it on its 1-device mesh
    x = jax.device_put(x, sharding)
  g = geometry(sharding, tuple(x.shape))
  sums = _device_checksum_fn(sharding, g.shape)(x, offsets_on_devices(sharding, g.shape))
  return sums, g.replica


def _replica_sums(partials: np.ndarray, replica: np.ndarray) -> np.ndarray:
  partials = np.asarray(partials, np.uint64)
  return np.array([int(partials[replica == k].sum() % 2 ** 32) for k in range(int(replica.max()) + 1)])


def tensor_checksum(partials: np.ndarray, replica: np.ndarray) -> int:
  """The tensor's checksum from `device_checksums`: the sum of replica 0's partials, mod 2^32."""
  return int(_replica_sums(partials, replica)[0])


def verify(partials: np.ndarray, replica: np.ndarray, expected: int) -> bool:
  """Whether every replica set's partials add up to `expected` (the sender's `tensor_checksum`)."""
  return bool(np.all(_replica_sums(partials, replica) == expected))


def checksums_of(arrays) -> list[tuple[np.ndarray, np.ndarray]]:
  """`device_checksums` of each array, dispatched together and fetched in one transfer."""
  dispatched = [device_checksums(x) for x in arrays]
  fetched = jax.device_get([sums for sums, _ in dispatched])
  return [(np.asarray(s), replica) for s, (_, replica) in zip(fetched, dispatched)]

