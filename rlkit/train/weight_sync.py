"""The sampler's own copy of the policy's weights, kept in step with the trainer by a weight sync (`rl.sync`;
NeMo-DCR and the rollout/sync split of `methods/systems.md` §2 and §7; the transfer itself is `rlkit.sync`).

With `rl.sync.kind` set, the policy's state (the slice an `rl_stage.Learner` drives) holds two copies:

  trainer  the float32 master (`state["train"].params`) on the train mesh: scores, updates, checkpoints;
  sampler  e = export(view(master)) (`rlkit.sync.export_params`: floating leaves cast to `sync.dtype`, RNE,
           the matmul kernels in the format of `sync.quantizer`, e.g. int8 codes and scales that the
           sampler's weight matmul consumes: rlkit/quant/quantizers.py),
           where view is what the sampler runs (`rlkit.models.lora.sampling_params`: LoRA merged or not),
           laid out on the sampler's mesh (`sync.mesh`, by the default partition rules of
           `rlkit.parallel.rules`; all zeros: the master's own shardings), in `state["sampler"]` (a
           SamplerCopy). Collect samples from it.

Whichever stage drives the learner, after every update phase `rlkit.sync.sync_params` brings the copy up to
date (dense: every tensor; sparse_delta: the bits that changed since the last committed export, checked by
checksums, committed in two phases, resynced on a failure) and the iteration logs the sync's stats as
`sync/<stat>` (the stats are defined in rlkit/sync/backends.py). The sampler's module stores its params in the
sync dtype and computes in it, as an engine serving bf16 weights does (`rl.rollout_mismatch.dtype`, when set,
still picks the compute dtype). With a sampler mesh of its own, collect runs under that mesh (prompts laid out
on it) and its rollout is handed to the trainer's layout before scoring. Held-out evaluation still samples
from the master (it measures the trained policy).

Resume. The copy and the sparse baseline are not checkpointed (SAMPLER is a transient state entry,
rlkit/train/checkpoint.py): after a committed sync both equal e of the master (a failed sync ends in a resync,
which makes them so too), so at the stage's first iteration `start` rebuilds them from the master the
checkpoint restored: the state an uninterrupted run holds at that step
(tests/train/test_weight_sync.py checks that a resumed run logs what an uninterrupted one does). This start-up
resync is not logged; `sync/resynced` counts the syncs that failed and were repaired.

`verify_dense` (debug): each sync also builds the dense reshard of e (`device_put` onto the sampler's
shardings) and logs `sync/bit_exact`, 1.0 when every leaf's bits equal the copy's, and its time `sync/dense_s`.

Off (`kind = ""`, the default) nothing is built: the sampler reads the master as before.
Single process only, as `rlkit.sync`.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Any, Callable, NamedTuple, Optional

import jax
import ml_collections
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P

from kernels.sparse_delta import bits_view
from rlkit.core.sections import RL_SECTIONS, Section
from rlkit.models.lora import sampling_params
from rlkit.models.transformer import Transformer
from rlkit.parallel.mesh import AXES, make_mesh
from rlkit.parallel.rules import param_shardings, shard_batch
from rlkit.quant.quantizers import export_shardings
from rlkit.sync import (SYNC_BACKENDS, SyncConfig, SyncState, export_of, placed_by_arguments, resync, sync_config,
                        sync_defaults, sync_params)
from rlkit.train.checkpoint import TRANSIENT

LOGGED = ("change_rate", "payload_ratio", "payload_bytes", "dense_bytes", "header_bytes", "dense_fallbacks",
          "encode_s", "route_s", "apply_s", "verify_s", "committed", "resynced")


def sampler_sync_defaults() -> ml_collections.ConfigDict:
  """The `rl.sync` section: `rlkit.sync.sync_defaults()` (kind, dtype, capacity_frac, impl) off by default,
  plus the sampler's mesh and a debug check."""
  c = sync_defaults()
  c.kind = ""                   # "" (off: the sampler reads the trainer's params) | dense | sparse_delta
  c.mesh = ml_collections.ConfigDict()   # the sampler copy's mesh; all 0: the trainer params' own shardings
  c.mesh.data = 0               # sampler mesh's data axis (0 or 1: not split; -1 on one axis: every device)
  c.mesh.fsdp = 0               # its fsdp axis (the mesh takes the first data x fsdp x tensor devices)
  c.mesh.tensor = 0             # its tensor axis (params laid out by rlkit/parallel/rules.py's default rules)
  c.verify_dense = False        # debug: also reshard densely each sync and log sync/bit_exact (1.0: same bits)
  return c


def _library_fields(section) -> dict:
  return {k: section[k] for k in sync_defaults().keys()}


def _mesh_sizes(section) -> dict:
  return {a: int(section.mesh[a]) for a in AXES}


def check(section, where: str) -> None:
  """ValueError naming the key and the fix for a bad `sync` section (types are checked by config_checks.validate);
  reads no device."""
  if section.kind and section.kind not in SYNC_BACKENDS:
    raise ValueError(f"{where}.kind={section.kind!r} is not a sync backend; choose '' (off: the sampler reads "
                     f"the trainer's params) or one of: {', '.join(SYNC_BACKENDS.names())}.")
  try:
    sync_config({**_library_fields(section), "kind": section.kind or "dense"})
  except ValueError as e:
    raise ValueError(f"{where}: {e}") from None
  if not section.kind and section.get("quantizer", "none") != "none":
    raise ValueError(f"{where}.quantizer={section.quantizer!r} formats the sampler's own copy, which "
                     f"{where}.kind='' does not make: set {where}.kind (dense or sparse_delta), or quantizer='none'.")
  sizes = _mesh_sizes(section)
  if any(s < -1 for s in sizes.values()) or list(sizes.values()).count(-1) > 1:
    raise ValueError(f"{where}.mesh={sizes}: sizes are >= 1 (0: not split), with at most one axis -1 (every "
                     "device); all 0 keeps the trainer's shardings.")


def sampler_mesh(section, devices, where: str = "rl.sync") -> Optional[Mesh]:
  """The sampler's mesh of a `sync` section on `devices` (None: all sizes 0, the trainer's shardings)."""
  sizes = _mesh_sizes(section)
  if not any(sizes.values()):
    return None
  sizes = {a: 1 if s == 0 else s for a, s in sizes.items()}
  fixed, n = math.prod(s for s in sizes.values() if s > 0), len(devices)
  every = -1 in sizes.values()
  if fixed > n or (every and n % fixed):
    from rlkit.core.errors import ConfigError
    many = " (times a whole number)" if every else ""
    raise ConfigError(f"{where}.mesh={_mesh_sizes(section)} needs {fixed} devices{many}, but {n} are "
                      f"available: make data x fsdp x tensor at most {n} (e.g. "
                      f"--config.{where}.mesh.tensor={min(2, n)}), or set all three to 0 to sample on the "
                      "trainer's layout.")
  return make_mesh(sizes, list(devices) if every else list(devices)[:fixed])


def check_sampler_meshes(config, devices) -> None:
  """ConfigError unless every synced stage's sampler mesh fits `devices` (launch.py calls it once JAX is
  up; validation itself starts no backend)."""
  for name in config.stages:
    section = config[name].get("sync")
    if section is not None and section.kind:
      sampler_mesh(section, devices, f"{name}.sync")


# ---------------------------------------------------------------------------------------------------------
# The copy

# The policy state's entry holding its SamplerCopy: transient, since `start` remakes it from the master.
SAMPLER = "sampler"
TRANSIENT.add(SAMPLER)


class SamplerSync(NamedTuple):
  """What the sampler runs on (static for a stage): the sync config (None: off), its module, the copy's
  shardings and mesh (None: the trainer's layout), and `view` (master -> the tree the sampler runs)."""
  cfg: Optional[SyncConfig]
  verify_dense: bool
  model: Any
  shardings: Any
  mesh: Optional[Mesh]
  view: Callable[[Any], Any]


class SamplerCopy(NamedTuple):
  """The sampler's params and the sync's state (its baseline, for sparse_delta): the policy state's SAMPLER
  entry. Not checkpointed: see the module docstring."""
  params: Any
  state: SyncState


def sampler_module(model, dtype: str, compute_dtype: str = ""):
  """`model` with params stored in `dtype` and computing in `compute_dtype` or else `dtype` ("": as is)."""
  if not dtype:
    return model
  cfg = model.cfg.replace(param_dtype=dtype, dtype=compute_dtype or dtype)
  return model if cfg == model.cfg else Transformer(cfg)


def build(section, train_params, model, lora, compute_dtype: str = "", where: str = "rl.sync") -> SamplerSync:
  """The SamplerSync of a `sync` section (from the layout of `train_params`; `start` makes the copy).
  `model`: the module the sampler would run on the master; `lora`: the policy's `lora` section (the copy is of what the
  sampler runs: merged or not); `compute_dtype`: rl.rollout_mismatch.dtype."""
  view = functools.partial(sampling_params, section=lora)
  if not section.kind:
    return SamplerSync(None, False, model, None, None, view)
  if jax.process_count() > 1:
    from rlkit.core.errors import ConfigError
    raise ConfigError(f"{where}.kind={section.kind!r} runs in one process only (rlkit.sync has no cross-host "
                      f"transport yet); set {where}.kind='' for a {jax.process_count()}-process run.")
  cfg = sync_config(_library_fields(section))
  mesh = sampler_mesh(section, jax.devices(), where)
  source = view(train_params)
  # The rules see the master's paths and shapes; a quantized kernel's parts follow their kernel's layout.
  kernels = jax.tree.map(lambda x: x.sharding, source) if mesh is None else param_shardings(source, mesh)
  shardings = export_shardings(kernels, jax.eval_shape(lambda p: export_of(p, cfg), source))
  return SamplerSync(cfg, bool(section.verify_dense), sampler_module(model, cfg.dtype, compute_dtype),
                     shardings, mesh, view)


def start(sync: SamplerSync, train_params) -> Optional[SamplerCopy]:
  """The copy of `train_params` made by a dense resync (None when the sync is off): what an uninterrupted run
  holds after any committed sync, so a stage's start and a resume both begin here."""
  if sync.cfg is None:
    return None
  params, state, _ = resync(sync.view(train_params), sync.shardings, sync.cfg)
  return SamplerCopy(params, state)


def with_copy(sync: SamplerSync, state: dict) -> dict:
  """The policy state `state` with its sampler copy under SAMPLER, made by `start` from `state["train"]`'s
  params when missing (a stage's first iteration, a resumed one: checkpoints do not hold it); as is when the
  copy is there or the sync is off."""
  if sync.cfg is None or SAMPLER in state:
    return state
  return dict(state, **{SAMPLER: start(sync, state["train"].params)})


def sampling_source(copy: Optional[SamplerCopy], train_params):
  """What collect samples from: the copy's params, or the master when the sync is off."""
  return train_params if copy is None else copy.params


def on_sampler(sync: SamplerSync, collect_fn: Callable) -> Callable:
  """`collect_fn` (rlkit.train.phases.collect's signature) run on the sampler's mesh: the prompts laid out
  there, its rollout handed to the caller's `put_batch` layout (the trainer's); `collect_fn` itself when the
  sampler shares the trainer's layout."""
  if sync.mesh is None:
    return collect_fn
  mesh = sync.mesh

  def collect_there(model, params, batch, key, sampling, group_size, put_batch, **kwargs):
    key = jax.device_put(key, NamedSharding(mesh, P()))      # made under the train mesh: replicated there
    with jax.set_mesh(mesh):
      samples = collect_fn(model, params, batch, key, sampling, group_size, lambda b: shard_batch(b, mesh),
                           **kwargs)
    return dataclasses.replace(samples, rollout=put_batch(samples.rollout))

  return collect_there


@placed_by_arguments                        # the copy lives on the sampler's mesh, not the context one
def bits_equal(a: Any, b: Any) -> bool:
  """Whether two trees of arrays (same structure and shardings) hold the same bits in every leaf."""
  same = [(bits_view(x) == bits_view(y)).all() for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b))]
  return bool(all(jax.device_get(same)))


def update(sync: SamplerSync, copy: Optional[SamplerCopy], train_params) -> tuple[Optional[SamplerCopy], dict]:
  """One sync of the copy to the master after an update phase: (the new copy, its `sync/...` metrics)."""
  if copy is None:
    return None, {}
  source = sync.view(train_params)
  params, state, stats = sync_params(source, copy.state, copy.params, sync.cfg)
  metrics = {f"sync/{k}": float(stats[k]) for k in LOGGED if k in stats}
  if sync.verify_dense:
    t0 = time.perf_counter()
    dense = jax.block_until_ready(jax.tree.map(jax.device_put, export_of(source, sync.cfg), sync.shardings))
    metrics["sync/dense_s"] = time.perf_counter() - t0
    metrics["sync/bit_exact"] = float(bits_equal(params, dense))
  return SamplerCopy(params, state), metrics


RL_SECTIONS.add("sync", Section(sampler_sync_defaults,
                                lambda stage, name: check(stage.sync, f"{name}.sync"),
                                doc="the sampler's own weight copy and its sync (rlkit/train/weight_sync.py)"))
