"""NeMo-DCR's sparse delta of one tensor: encode on the train mesh, route and apply on the sampler mesh
(`methods/systems.md` §2, "Computation and resharding"; the layout is our DESIGN).

With e = the export (sampler dtype, train sharding) and b = the baseline (the last committed export, same
sharding), every train device r holding block B_r (offsets o_r; one device per block, replicas skip) sends

    C_r = {u in B_r : bits(e)_u != bits(b)_u}     as global flat indices g = ravel(u + o_r, shape),
                                                  gap-coded (`codec`), with the new bits e_g.

C_r has at most `cap` entries (a fixed capacity: static shapes); a device with more reports its true count,
and the caller sends the whole tensor densely instead. Routing: the messages are broadcast to the sampler
mesh (NeMo's relay tree also hands every receiver the whole payload); sampler device d, owning the block R_d
(`devices_indices_map`, offsets q_d), decodes them and keeps the entries with g in R_d as local flat indices
ravel(coords(g) - q_d, local_shape), so replicated sampler devices each receive their copy. Applying
overwrites those elements (`dst.flat[loc] = bits`), which makes the receiver bit-identical to a dense
`jax.device_put(e, sampler_sharding)` whenever its previous weights equal b.

Each step is one jitted `shard_map` per tensor (shape), compiled once; `impl` picks the Pallas kernels of
`kernels/sparse_delta.py` ("pallas") or their jnp references ("reference") for the compaction and the
overwrite.
"""
from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec as P

from kernels import sparse_delta as kernels
from rlkit.sync import codec
from rlkit.sync.shards import Geometry, geometry, named_sharding, offsets_on_devices

Array = jax.Array


class SparseLeaf(NamedTuple):
  """One tensor's delta as sent: row r is train device r's message (rows in `mesh.devices.flat` order)."""
  gaps: Array          # uint16[devices, cap]: gap-coded global flat indices (codec.GapCode.gaps)
  escapes: Array       # uint32[devices, cap]: codec.GapCode.escapes
  values: Array        # uint[devices, cap]: the new bits of the exported dtype
  counts: Array        # int32[devices, 2]: (entries, escaped gaps) of each message
  starts: np.ndarray   # int32[devices]: each message's gap origin (its block's first global index - 1)
  sent: np.ndarray     # bool[devices]: rows that are messages (replicas of a train block send nothing)
  checksum: int        # the sender's checksum of the whole export (codec.checksum)


class Encoded(NamedTuple):
  """`encode_leaf`'s dispatched messages (device arrays, as in SparseLeaf), their layout and capacity."""
  gaps: Array
  escapes: Array
  values: Array
  counts: Array
  geometry: Geometry
  cap: int


def capacity(g: Geometry, capacity_frac: float) -> int:
  """Entries a message of this layout holds: ceil(capacity_frac x block size), at least 1."""
  return max(1, math.ceil(capacity_frac * math.prod(g.local_shape)))


def _interpret() -> bool:
  return jax.default_backend() != "gpu"       # the kernels compile for GPU (Triton) only


def _compact(impl: str):
  if impl == "pallas":
    return functools.partial(kernels.compact_changes, interpret=_interpret())
  return kernels.compact_changes_reference


def _scatter(impl: str):
  if impl == "pallas":
    return functools.partial(kernels.scatter_apply, interpret=_interpret())
  return kernels.scatter_apply_reference


# ---------------------------------------------------------------------------------------------------------
# Sender: encode

@functools.lru_cache(maxsize=None)
def _encode_fn(sharding: NamedSharding, shape: tuple, cap: int, impl: str):
  g = geometry(sharding, shape)
  local_shape, compact = g.local_shape, _compact(impl)

  def local(new, base, offsets):
    o = offsets[0]
    idx, val, count = compact(new, base, capacity=cap)
    coords = [c + o[k] for k, c in enumerate(codec.unravel(idx, local_shape))]
    glob = jnp.where(idx >= 0, codec.ravel(coords, shape), -1)
    start = codec.ravel(list(o), shape) - 1
    code = codec.gap_encode(glob, count, start)
    return code.gaps[None], code.escapes[None], val[None], jnp.stack([count, code.n_escapes])[None]

  spec = g.sharding.spec
  return jax.jit(jax.shard_map(local, mesh=g.sharding.mesh, in_specs=(spec, spec, g.rows),
                               out_specs=(g.rows,) * 4, check_vma=False))


def encode_leaf(export: Array, baseline: Array, capacity_frac: float, impl: str) -> Encoded:
  """Dispatches the messages of one tensor (not waiting for them): the caller fetches all tensors' counts
  at once to decide which go sparse and which overflow to dense."""
  sharding, shape = named_sharding(export.sharding), tuple(export.shape)
  if math.prod(shape) >= 2 ** 31:
    raise ValueError(f"sparse_delta: a tensor of shape {shape} has 2^31 elements or more, past int32 flat "
                     f"indices; split it, or sync it with sync.kind='dense'.")
  g = geometry(sharding, shape)
  if baseline.sharding != export.sharding:      # e.g. a baseline restored onto another mesh: move its bits
    baseline = jax.device_put(baseline, export.sharding)
  cap = capacity(g, capacity_frac)
  messages = _encode_fn(sharding, shape, cap, impl)(export, baseline, offsets_on_devices(sharding, shape))
  return Encoded(*messages, g, cap)


def starts_of(g: Geometry) -> np.ndarray:
  """Each train device's gap origin: the global flat index of its block's first element, minus 1."""
  strides = np.cumprod((1,) + g.shape[::-1][:-1])[::-1] if g.shape else np.zeros(0, np.int64)
  return (g.offsets.astype(np.int64) @ strides.astype(np.int64) - 1).astype(np.int32)


# ---------------------------------------------------------------------------------------------------------
# Receiver: route, then apply

@functools.lru_cache(maxsize=None)
def _route_fn(sharding: NamedSharding, shape: tuple, starts: tuple, sent: tuple):
  g = geometry(sharding, shape)
  local_shape = g.local_shape
  starts, sent = np.asarray(starts, np.int32), np.asarray(sent)

  def local(gaps, escapes, counts, offsets):
    q = offsets[0]
    entries = jnp.where(sent, counts[:, 0], 0)                     # replicas' rows carry nothing
    glob = jax.vmap(lambda *m: codec.gap_decode(codec.GapCode(*m[:3]), m[3], m[4]))(
        gaps, escapes, counts[:, 1], entries, starts)
    coords = [c - q[k] for k, c in enumerate(codec.unravel(glob, shape))]
    inside = glob >= 0
    for c, n in zip(coords, local_shape):
      inside &= (c >= 0) & (c < n)
    return jnp.where(inside, codec.ravel(coords, local_shape), -1).reshape(1, -1)

  return jax.jit(jax.shard_map(local, mesh=g.sharding.mesh, in_specs=(P(), P(), P(), g.rows),
                               out_specs=g.rows, check_vma=False))


@functools.lru_cache(maxsize=None)
def _apply_fn(sharding: NamedSharding, shape: tuple, impl: str):
  g = geometry(sharding, shape)
  scatter = _scatter(impl)

  def local(block, loc, values):
    return scatter(block, loc[0], values.reshape(-1))

  spec = g.sharding.spec
  return jax.jit(jax.shard_map(local, mesh=g.sharding.mesh, in_specs=(spec, g.rows, P()), out_specs=spec,
                               check_vma=False))


def route_leaf(leaf: SparseLeaf, target: Array) -> tuple[Array, Array]:
  """Broadcasts a tensor's messages to the sampler mesh of `target` and turns them into each sampler
  device's local flat indices (-1: not its element, or padding): (loc [devices, rows x cap], values)."""
  sharding, shape = named_sharding(target.sharding), tuple(target.shape)
  gaps, escapes, values, counts = jax.device_put((leaf.gaps, leaf.escapes, leaf.values, leaf.counts),
                                                 NamedSharding(sharding.mesh, P()))
  route = _route_fn(sharding, shape, tuple(leaf.starts.tolist()), tuple(leaf.sent.tolist()))
  return route(gaps, escapes, counts, offsets_on_devices(sharding, shape)), values


def apply_leaf(target: Array, loc: Array, values: Array, impl: str) -> Array:
  """The sampler tensor with the routed entries overwritten, on its own sharding."""
  sharding = named_sharding(target.sharding)
  if target.sharding is sharding:
    return _apply_fn(sharding, tuple(target.shape), impl)(target, loc, values)
  # A single-device array: patched as the block of a 1-device mesh, handed back on its own sharding.
  out = _apply_fn(sharding, tuple(target.shape), impl)(jax.device_put(target, sharding), loc, values)
  return jax.device_put(out, target.sharding)


def leaf_bytes(counts: np.ndarray, sent: np.ndarray, itemsize: int) -> dict[str, int]:
  """Bytes of a tensor's messages: coded indices, values, and per-message headers (the two int32 counts)."""
  entries, escaped = counts[sent, 0].astype(np.int64), counts[sent, 1].astype(np.int64)
  return {"index_bytes": int(codec.coded_index_bytes(entries, escaped).sum()),
          "value_bytes": int(entries.sum()) * itemsize, "header_bytes": 8 * int(sent.sum())}
