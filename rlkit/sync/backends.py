"""Trainer -> sampler weight sync: the `sync` config section, the SYNC_BACKENDS registry and the two-phase
protocol every backend follows (`methods/systems.md` §2 and §7).

The trainer holds float32 master params on its mesh; the sampler holds a copy of the same tree, possibly on
another mesh, with other shardings and another dtype (bf16). One sync:

  prepare  (trainer)  e = export(params): floating leaves cast to the sampler dtype (round-to-nearest-even,
                      as `astype`), the matmul kernels in the format of `sync.quantizer`
                      (rlkit/quant/quantizers.py: none, bf16, int8, fp8 or FP4 codes + scales), on the train
                      shardings.
                      The backend turns e into a Payload (per tensor, a dense copy or a sparse delta, with
                      the checksum of e) and a pending state.
  receive  (sampler)  each tensor routed onto its sampler sharding and applied, then checked: the receiver's
                      checksum (`codec.checksum`, every replica) against the sender's. One ack per tensor.
  commit   (trainer)  the pending state (baseline = e) replaces the old one only if every tensor acked.
                      Receiver writes are not rolled back, so after a failed sync only `resync` (dense: the
                      sampler rebuilt from e, the baseline reset to e) restores agreement; `sync_params` does
                      it by itself.

Backends, by `sync.kind`:
  dense         every tensor `jax.device_put(e, sampler sharding)`; keeps no baseline.
  sparse_delta  NeMo-DCR: only the bits that changed since the baseline (`rlkit.sync.sparse_delta`); a tensor
                whose changes overflow a message's capacity (`capacity_frac`) goes dense. Keeps the baseline:
                one copy of e on the train mesh, the state to checkpoint (`SyncState` is a pytree).
Both paths give the sampler the same bits as a dense reshard of e: the tests check it at every step. A
quantized kernel of e (`sync.quantizer`) is a pytree of codes and scales: both backends send each part as a
leaf of its own, so every quantizer works with both (sparse_delta reads any 1, 2, 4 or 8-byte leaf's bits).

Stats of a sync (floats): change_rate (elements whose exported bits changed / all elements; sparse_delta
only), entries (changes sent sparsely), payload_bytes = index_bytes (gap-coded) + value_bytes (including
the whole of every tensor sent dense), dense_bytes (every element once, in the exported dtype),
payload_ratio = payload_bytes / dense_bytes, header_bytes (8 per sparse message: its two counts; kept out
of payload_bytes, as in the spec's (idx_bytes + 2) s N estimate), dense_fallbacks (tensors that overflowed),
encode_s / route_s / apply_s / verify_s (wall seconds of those host calls, each ended by
`block_until_ready`; encode_s includes the export and the sender's checksums), verified, committed, resynced.

Single process only: the payload's arrays live on this process's devices (no cross-host transport yet).
"""
from __future__ import annotations

import dataclasses
import functools
import time
from typing import Any, Callable, NamedTuple, Optional, Union

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np

from kernels.sparse_delta import bits_view
from rlkit.core.registry import Registry
from rlkit.quant import quantizers
from rlkit.quant.quantizers import QUANTIZERS
from rlkit.sync import shards
from rlkit.sync import sparse_delta as sparse

Array = jax.Array
IMPLS = ("auto", "pallas", "reference")


def sync_defaults() -> ml_collections.ConfigDict:
  """The `sync` section: how the trainer's params reach the sampler; every field is documented here, once."""
  c = ml_collections.ConfigDict()
  c.kind = "dense"           # SYNC_BACKENDS name: dense (every tensor) | sparse_delta (changed bits only)
  c.dtype = "bfloat16"       # sampler copy's dtype for floating leaves (cast as astype, RNE); "" keeps theirs
  c.quantizer = "none"       # QUANTIZERS name, the format of the copy's matmul kernels: none (cast to dtype) |
  #                            bf16 | int8 | fp8 (weight-only, per-channel scales) | mxfp4 | nvfp4 (block-scaled
  #                            FP4, MoE experts and dense kernels) | mxfp4_experts | nvfp4_experts (experts
  #                            only) | mxfp4_w4a4 | nvfp4_w4a4 (dense activations in FP4 too);
  #                            rlkit/quant/quantizers.py
  c.quant_layers = ()        # the decoder layers (indices) whose kernels the quantizer converts; (): all. With
  #                            FP4 experts in training it must equal model.expert_quant_layers
  c.capacity_frac = 0.05     # sparse_delta: a train shard's message holds ceil(frac x shard size) changes;
  #                            a tensor with more goes dense that sync
  c.impl = "auto"            # sparse_delta encode/apply: pallas (kernels/sparse_delta.py: compiled on GPU,
  #                            interpreted elsewhere: slow, for tests) | reference (jnp) | auto (pallas on
  #                            GPU, else reference)
  return c


@dataclasses.dataclass(frozen=True)
class SyncConfig:
  """A validated `sync` section (see `sync_defaults` for the fields)."""
  kind: str = "dense"
  dtype: str = "bfloat16"
  capacity_frac: float = 0.05
  impl: str = "auto"
  quantizer: str = "none"
  quant_layers: tuple = ()

  def __post_init__(self):
    SYNC_BACKENDS.check(self.kind, "sync.kind")
    QUANTIZERS.check(self.quantizer, "sync.quantizer")
    object.__setattr__(self, "quant_layers", tuple(int(i) for i in self.quant_layers))   # hashable: a jit key
    if self.dtype:
      try:
        jnp.dtype(self.dtype)
      except TypeError:
        raise ValueError(f"sync.dtype={self.dtype!r} is not a dtype; use e.g. 'bfloat16', 'float32', or '' "
                         f"to keep the train dtype.") from None
    if not 0.0 < self.capacity_frac <= 1.0:
      raise ValueError(f"sync.capacity_frac={self.capacity_frac} must be in (0, 1].")
    if self.impl not in IMPLS:
      raise ValueError(f"sync.impl={self.impl!r} is not one of {', '.join(IMPLS)}.")

  @property
  def kernel_impl(self) -> str:
    """'pallas' or 'reference': what `impl` means on this backend."""
    if self.impl == "auto":
      return "pallas" if jax.default_backend() == "gpu" else "reference"
    return self.impl


def sync_config(section: Union[ml_collections.ConfigDict, SyncConfig, dict]) -> SyncConfig:
  """The SyncConfig of a `sync` section (validated; unknown keys refused)."""
  if isinstance(section, SyncConfig):
    return section
  fields = dict(section.to_dict() if hasattr(section, "to_dict") else section)
  unknown = sorted(set(fields) - {f.name for f in dataclasses.fields(SyncConfig)})
  if unknown:
    raise ValueError(f"Unknown sync config keys {unknown}; valid keys: {sorted(sync_defaults().keys())}.")
  return SyncConfig(**fields)


class SyncState(NamedTuple):
  """What a sync keeps between calls (a pytree: checkpoint it with the train state)."""
  baseline: Any          # the last committed export (sampler dtype, train shardings); None for dense
  version: Array         # int32[]: syncs committed so far, resyncs included


class DenseLeaf(NamedTuple):
  """One tensor sent whole: the export on the train sharding, and its checksum."""
  array: Array
  checksum: int


class UnchangedLeaf(NamedTuple):
  """One tensor whose exported bits did not change: nothing is sent; the receiver still verifies."""
  checksum: int


class Payload(NamedTuple):
  """What `prepare` hands to `receive`: a DenseLeaf, SparseLeaf or UnchangedLeaf per leaf, and the sender's
  stats."""
  treedef: Any
  leaves: tuple
  stats: dict


class SyncBackend(NamedTuple):
  """prepare(export leaves, baseline leaves or None, cfg) -> (payload leaves, sender stats)."""
  prepare: Callable[[list, Optional[list], SyncConfig], tuple[list, dict]]
  keeps_baseline: bool


SYNC_BACKENDS: Registry[SyncBackend] = Registry("sync backend")


def placed_by_arguments(fn):
  """Runs `fn` without the caller's context mesh (`jax.set_mesh`), restored afterwards. A sync works on two
  meshes, each array where its sharding puts it and each shard_map on its own mesh; JAX refuses both under a
  context mesh other than theirs (the trainer's, as a train loop runs). Every public entry point is wrapped."""
  @functools.wraps(fn)
  def wrapped(*args, **kwargs):
    with jax.set_mesh(None):
      return fn(*args, **kwargs)
  return wrapped


@functools.partial(jax.jit, static_argnames=("dtype", "quantizer", "layers"))
def export_params(train_params: Any, dtype: str, quantizer: str = "none", layers: tuple = ()) -> Any:
  """The sampler's view of the train params: floating leaves cast to `dtype` (RNE), matmul kernels (of the
  decoder `layers`, () all) in the format of `quantizer` (`rlkit.quant.quantizers.export`), on the train
  shardings."""
  return quantizers.export(train_params, quantizer, dtype, layers)


def export_of(train_params: Any, cfg) -> Any:
  """`export_params` with a SyncConfig's dtype, quantizer and layers."""
  return export_params(train_params, cfg.dtype, cfg.quantizer, cfg.quant_layers)


def _nbytes(x) -> int:
  return int(np.prod(x.shape, dtype=np.int64)) * jnp.dtype(x.dtype).itemsize


def _timed(fn):
  t0 = time.perf_counter()
  out = jax.block_until_ready(fn())
  return out, time.perf_counter() - t0


# ---------------------------------------------------------------------------------------------------------
# Backends (the sender's half; receive is shared)

def _whole_tensor_stats(exports: list) -> dict:
  """The size stats of sending every tensor whole (dense backend, resync)."""
  dense = float(sum(_nbytes(e) for e in exports))
  return {"entries": float(sum(e.size for e in exports)), "payload_bytes": dense, "index_bytes": 0.0,
          "value_bytes": dense, "header_bytes": 0.0, "dense_fallbacks": 0.0}


def _dense_prepare(exports: list, baselines: Optional[list], cfg: SyncConfig) -> tuple[list, dict]:
  del baselines, cfg
  sums = shards.checksums_of(exports)
  return [DenseLeaf(e, shards.tensor_checksum(*s)) for e, s in zip(exports, sums)], _whole_tensor_stats(exports)


def _sparse_prepare(exports: list, baselines: Optional[list], cfg: SyncConfig) -> tuple[list, dict]:
  if baselines is None:
    raise ValueError("sync.kind='sparse_delta' needs a baseline, and this SyncState has none (it was made by "
                     "the dense backend, or not at all): call rlkit.sync.resync first.")
  impl = cfg.kernel_impl
  encoded = [sparse.encode_leaf(e, b, cfg.capacity_frac, impl) if e.ndim else None
             for e, b in zip(exports, baselines)]
  sums = shards.checksums_of(exports)
  # A 0-d leaf has no message: its change count is a bit comparison.
  counts = jax.device_get([m.counts if m else (bits_view(e) != bits_view(b)).astype(jnp.int32).reshape(1, 1)
                           for m, e, b in zip(encoded, exports, baselines)])
  leaves, changed_total = [], 0
  stats = dict.fromkeys(("entries", "index_bytes", "value_bytes", "header_bytes", "dense_fallbacks"), 0)
  for e, m, s, c in zip(exports, encoded, sums, counts):
    checksum = shards.tensor_checksum(*s)
    sent = np.ones(1, bool) if m is None else m.geometry.replica == 0     # replicas' messages are not sent
    changed = int(c[sent, 0].sum())
    changed_total += changed
    if not changed:
      leaves.append(UnchangedLeaf(checksum))
    elif m is None or int(c[sent, 0].max()) > m.cap:
      # A changed 0-d leaf (its value is cheaper than any index), or an overflow: a message holds only
      # `cap` of its changes, so the tensor goes whole.
      stats["dense_fallbacks"] += m is not None
      stats["value_bytes"] += _nbytes(e)
      leaves.append(DenseLeaf(e, checksum))
    else:
      stats["entries"] += changed
      for k, v in sparse.leaf_bytes(c, sent, m.values.dtype.itemsize).items():
        stats[k] += v
      leaves.append(sparse.SparseLeaf(m.gaps, m.escapes, m.values, m.counts, sparse.starts_of(m.geometry),
                                      sent, checksum))
  stats["payload_bytes"] = stats["index_bytes"] + stats["value_bytes"]
  total = sum(e.size for e in exports)
  return leaves, {"change_rate": changed_total / max(total, 1), **{k: float(v) for k, v in stats.items()}}


SYNC_BACKENDS.add("dense", SyncBackend(_dense_prepare, keeps_baseline=False))
SYNC_BACKENDS.add("sparse_delta", SyncBackend(_sparse_prepare, keeps_baseline=True))


# ---------------------------------------------------------------------------------------------------------
# The protocol

def _targets(treedef, sampler_params, exports: list) -> list:
  """The sampler leaves in the export's order, checked against it (shape and dtype) by path."""
  try:
    targets = treedef.flatten_up_to(sampler_params)
  except (ValueError, TypeError) as e:
    raise ValueError(f"The sampler params do not have the train params' tree structure: {e}") from None
  paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_flatten_with_path(sampler_params)[0]]
  for path, e, t in zip(paths, exports, targets):
    if tuple(t.shape) != tuple(e.shape) or t.dtype != e.dtype:
      raise ValueError(f"Sampler param {path} is {t.dtype}{list(t.shape)}, but the trainer exports "
                       f"{e.dtype}{list(e.shape)}; build the sampler params with rlkit.sync.resync (sync.dtype "
                       f"and sync.quantizer decide the exported leaves).")
  return targets


@placed_by_arguments
def prepare(train_params: Any, state: SyncState, sampler_params: Any, cfg) -> tuple[Payload, SyncState]:
  """The sender's phase: (payload for `receive`, pending state for `commit`). See the module docstring."""
  cfg = sync_config(cfg)
  backend = SYNC_BACKENDS.get(cfg.kind)
  t0 = time.perf_counter()
  export = export_of(train_params, cfg)
  exports, treedef = jax.tree.flatten(export)
  _targets(treedef, sampler_params, exports)
  baselines = None if state.baseline is None else treedef.flatten_up_to(state.baseline)
  leaves, stats = backend.prepare(exports, baselines, cfg)
  jax.block_until_ready(leaves)
  dense = float(sum(_nbytes(e) for e in exports))
  stats.update(dense_bytes=dense, payload_ratio=stats["payload_bytes"] / max(dense, 1.0),
               encode_s=time.perf_counter() - t0)
  pending = SyncState(export if backend.keeps_baseline else None, jnp.asarray(state.version, jnp.int32) + 1)
  return Payload(treedef, tuple(leaves), stats), pending


@placed_by_arguments
def receive(payload: Payload, sampler_params: Any, cfg) -> tuple[Any, tuple[bool, ...], dict]:
  """The receiver's phase: (new sampler params, one ack per leaf: its checksum matched on every replica,
  stats). Tensors are overwritten where the payload says; nothing is rolled back on a failed ack."""
  impl = sync_config(cfg).kernel_impl
  targets = payload.treedef.flatten_up_to(sampler_params)

  def route_one(leaf, target):
    if isinstance(leaf, sparse.SparseLeaf):
      return sparse.route_leaf(leaf, target)
    if isinstance(leaf, DenseLeaf):
      return jax.device_put(leaf.array, target.sharding)
    return target                            # UnchangedLeaf

  def route():
    return [route_one(leaf, t) for leaf, t in zip(payload.leaves, targets)]

  def apply():
    return [sparse.apply_leaf(t, *r, impl) if isinstance(leaf, sparse.SparseLeaf) else r
            for leaf, t, r in zip(payload.leaves, targets, routed)]

  routed, route_s = _timed(route)
  out, apply_s = _timed(apply)
  t0 = time.perf_counter()
  acks = tuple(shards.verify(*sums, leaf.checksum)
               for leaf, sums in zip(payload.leaves, shards.checksums_of(out)))
  stats = {"route_s": route_s, "apply_s": apply_s, "verify_s": time.perf_counter() - t0,
           "verified": float(all(acks))}
  return jax.tree.unflatten(payload.treedef, out), acks, stats


@placed_by_arguments
def commit(state: SyncState, pending: SyncState, acks) -> tuple[SyncState, bool]:
  """(pending if every tensor acked, else state unchanged; whether it committed). The trainer's phase 2."""
  ok = all(bool(a) for a in acks)
  return (pending if ok else state), ok


@placed_by_arguments
def resync(train_params: Any, sampler_shardings: Any, cfg,
           state: Optional[SyncState] = None) -> tuple[Any, SyncState, dict]:
  """The dense path: (sampler params = export on `sampler_shardings` (a tree of shardings), a state whose
  baseline is that export (None for dense), stats). Use it to build the sampler copy, after a failed sync,
  and on resume, where both sides must start from the same weights. Raises if a tensor fails to verify."""
  cfg = sync_config(cfg)
  backend = SYNC_BACKENDS.get(cfg.kind)
  export, encode_s = _timed(lambda: export_of(train_params, cfg))
  exports, treedef = jax.tree.flatten(export)
  targets = treedef.flatten_up_to(sampler_shardings)
  sent = [shards.tensor_checksum(*s) for s in shards.checksums_of(exports)]
  out, route_s = _timed(lambda: [jax.device_put(e, t) for e, t in zip(exports, targets)])
  t0 = time.perf_counter()
  bad = [i for i, (c, s) in enumerate(zip(sent, shards.checksums_of(out))) if not shards.verify(*s, c)]
  if bad:
    raise RuntimeError(f"resync: leaves {bad} differ from the export after a dense device_put.")
  version = jnp.int32(0) if state is None else jnp.asarray(state.version, jnp.int32)
  new_state = SyncState(export if backend.keeps_baseline else None, version + 1)
  stats = _whole_tensor_stats(exports)
  stats.update(dense_bytes=stats["payload_bytes"], payload_ratio=1.0, encode_s=encode_s, route_s=route_s,
               apply_s=0.0, verify_s=time.perf_counter() - t0, verified=1.0, committed=1.0, resynced=1.0)
  return jax.tree.unflatten(treedef, out), new_state, stats


@placed_by_arguments
def sync_params(train_params: Any, state: SyncState, sampler_params: Any, cfg) -> tuple[Any, SyncState, dict]:
  """One whole sync: prepare, receive, commit; if a tensor failed to verify, a resync (stats['resynced']).
  Returns (sampler params, state, stats). The sampler params passed in are superseded (not modified)."""
  payload, pending = prepare(train_params, state, sampler_params, cfg)
  out, acks, received = receive(payload, sampler_params, cfg)
  state, ok = commit(state, pending, acks)
  stats = {**payload.stats, **received, "committed": float(ok), "resynced": 0.0}
  if not ok:
    shardings = jax.tree.map(lambda x: x.sharding, sampler_params)
    out, state, _ = resync(train_params, shardings, cfg, state)
    stats["resynced"] = 1.0
  return out, state, stats
