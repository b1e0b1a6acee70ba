"""The RL stage's sampler copy (rl.sync, rlkit/train/weight_sync.py) on simulated devices: the trainer's float32
master on a train mesh (data 2 x fsdp 4), the sampler's bf16 copy on its own mesh (tensor 2), synced after every
update phase.

Runs reuse tests/train/test_stages.py's tiny model, config and memoised step functions; each is a few RL
iterations, memoised by its overrides. The runs: sync off, sparse_delta + verify_dense, dense + verify_dense,
and the f32 dense copy on the trainer's layout (the copy path with nothing changed); a resumed run. Then, without
an RL iteration: every field of `rl.sync` flipped on one sync of the tiny model's params (the stage's no-dead-flags
check points here), LoRA with sync (merged and unmerged sampling), and the config errors.
"""
from __future__ import annotations

import contextlib
import functools
import json
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import pytest

import test_stages as ts
from kernels import sparse_delta as kernels
from rlkit.parallel.mesh import make_mesh
from rlkit.parallel.rules import shard_batch, shard_params
from rlkit.sync import sparse_delta as sparse_impl
from rlkit.train import rl_stage, weight_sync
from rlkit.train.phases.collect import COLLECTORS, CollectorSpec, collect
from rlkit.train.phases import score as score_phase
from rlkit.core.errors import ConfigError
from rlkit.train.config import base_config
from rlkit.train.rl_config import rl_defaults
from rlkit.train.catalog import STAGES
from rlkit.train.checkpoint import persistent
from rlkit.train.stages import Context

STEPS = 3
TRAIN_MESH = {"data": 2, "fsdp": 4}
SAMPLER = {"sync.mesh.tensor": 2}
# A message capacity above the runs' change rates (4-7% per iteration at LR), so tensors go sparse.
SPARSE = {"sync.kind": "sparse_delta", "sync.verify_dense": True, "sync.capacity_frac": 0.25, **SAMPLER}
DENSE = {"sync.kind": "dense", "sync.verify_dense": True, **SAMPLER}
# Metrics that are wall times (they differ between any two runs).
TIMES = ("_s", "_per_s")
# Every run: a learning rate at which a few percent of the bf16 weights change per iteration (at the shared
# tests' 1e-3 nearly all do, and every tensor would overflow to dense).
LR = {"optimizer.lr": 1e-6}


@functools.lru_cache(maxsize=1)
def _train_mesh():
  return make_mesh(TRAIN_MESH)


class _MemoryCheckpointer:
  """Keeps a copy of the state and metadata of every step (the step donates the live state)."""
  directory = "<memory>"

  def __init__(self):
    self.saved = {}

  def should_save(self, step):
    return True

  def save(self, step, state, meta):                 # what the Orbax Checkpointer writes: the persistent part
    self.saved[step] = (jax.tree.map(lambda x: jnp.copy(x) if isinstance(x, jax.Array) else x, persistent(state)),
                        dict(meta))


class Run(NamedTuple):
  rows: list
  delta: np.ndarray
  batches: list
  sampled_from: list         # the params collect sampled from, per round (their leaves' dtypes and meshes)
  checkpointer: Any


_SAMPLED_FROM: list = []


def _recording_collector(cfg, env):
  """The single-turn collector, recording the params it samples from (their dtype, mesh) and the model's dtype."""
  def collect_and_record(model, params, *args, **kwargs):
    leaf = jax.tree.leaves(params)[0]
    _SAMPLED_FROM.append((leaf.dtype, dict(leaf.sharding.mesh.shape), model.cfg.dtype))
    return collect(model, params, *args, **kwargs)
  return collect_and_record


COLLECTORS.add("test_weight_sync_recording", CollectorSpec(_recording_collector))


def _run(overrides: dict, start: int = 0, resume: Any = None) -> Run:
  """The rl stage of `ts._config(overrides)` for STEPS iterations on the train mesh; `resume`: (state, meta)
  of a saved step to continue from at `start`."""
  mesh = _train_mesh()
  config = base_config()
  config.data.max_prompt_len = 5
  config.eval.update(batch_size=8, max_new_tokens=ts.MAX_NEW, pass_k=0)
  rng = np.random.default_rng(0)
  source = [dict(ts.TASK.make_example(rng)) for _ in range(64)]
  cfg = ts._config({"steps": STEPS, **LR, "collector": "test_weight_sync_recording", **overrides})
  ckpt = _MemoryCheckpointer()
  batches, sampled_from = [], _SAMPLED_FROM
  sampled_from.clear()
  with ts._fast_compile():
    initial = ts._initial_params()

  def capture(ppo_updates):
    def wrapped(step_fn, train, batch, *args, **kwargs):
      batches.append(jax.device_get(batch))
      return ppo_updates(step_fn, train, batch, *args, **kwargs)
    return wrapped

  patches = [(rl_stage, "make_rl_step", ts._memo_step), (score_phase, "make_scorer", ts._memo_scorer),
             (rl_stage, "ppo_updates", capture)]
  with contextlib.ExitStack() as stack:
    stack.enter_context(ts._fast_compile())
    stack.enter_context(jax.set_mesh(mesh))
    for module, name, wrap in patches:
      original = getattr(module, name)
      stack.callback(setattr, module, name, original)
      setattr(module, name, wrap(original))
    ctx = Context(config=config, model=ts.MODEL, tokenizer=ts.TOK, task=ts.TASK, train_source=source,
                  eval_records=[], logger=ts._Log(), checkpointer=ckpt, key=jax.random.key(1),
                  put_batch=lambda b: shard_batch(b, mesh), models={})
    stage = STAGES.get("rl")
    meta = {"stage": "rl", "stage_index": 0, "offset": 0}
    if resume is None:
      state = stage.init(ctx, cfg, shard_params(jax.tree.map(jnp.copy, initial), mesh))   # (the step donates)
    else:
      state, saved = resume
      state = jax.tree.map(lambda x: jnp.copy(x) if isinstance(x, jax.Array) else x, state)
      meta.update(iterator=saved["iterator"], loss_ema=saved["loss_ema"], skipped_run=saved["skipped_run"])
    state = stage.run(ctx, cfg, state, start, meta)
  delta = np.concatenate([np.ravel(np.asarray(a) - np.asarray(b)) for a, b in
                          zip(jax.tree.leaves(state["train"].params), jax.tree.leaves(jax.device_get(initial)))])
  return Run(ctx.logger.rows, delta, batches, list(sampled_from), ckpt)


_RUNS: dict = {}


def run(**overrides) -> Run:
  key = json.dumps(overrides, sort_keys=True)
  if key not in _RUNS:
    _RUNS[key] = _run(overrides)
  return _RUNS[key]


def _untimed(row: dict) -> dict:
  return {k: v for k, v in row.items() if not k.endswith(TIMES)}


def _bits(x) -> np.ndarray:
  x = np.asarray(x)
  return x.view(np.uint32) if x.dtype == np.float32 else x


# ------------------------------------------------------------------------------------------- RL runs

def test_sparse_sync_is_bit_exact_every_iteration_across_meshes():
  r = run(**SPARSE)
  assert len(r.rows) == STEPS
  for row in r.rows:
    assert row["sync/bit_exact"] == 1.0 and row["sync/committed"] == 1.0 and row["sync/resynced"] == 0.0, row
    assert 0.0 < row["sync/change_rate"] < 0.25 and row["sync/payload_ratio"] < 0.5
    assert row["sync/header_bytes"] > 0 and row["sync/dense_fallbacks"] == 0            # sent sparsely
    assert row["sync/payload_bytes"] == pytest.approx(row["sync/payload_ratio"] * row["sync/dense_bytes"])
    n = sum(x.size for x in jax.tree.leaves(ts._initial_params()))
    assert row["sync/dense_bytes"] == 2 * n                      # every element once, as bf16
    for k in ("sync/encode_s", "sync/route_s", "sync/apply_s", "sync/dense_s", "sync/dense_fallbacks"):
      assert row[k] >= 0.0
  # Collect ran on the copy: bf16 params on the sampler's tensor=2 mesh, in a bf16-computing module.
  assert r.sampled_from == [(jnp.bfloat16, {"data": 1, "fsdp": 1, "tensor": 2}, "bfloat16")] * STEPS


def test_dense_sync_samples_the_same_bits_as_sparse():
  sparse, dense = run(**SPARSE), run(**DENSE)
  assert all(row["sync/bit_exact"] == 1.0 and row["sync/payload_ratio"] == 1.0 for row in dense.rows)
  for a, b in zip(sparse.batches, dense.batches):
    np.testing.assert_array_equal(a.tokens, b.tokens)
    np.testing.assert_array_equal(_bits(a.rollout_logp), _bits(b.rollout_logp))
  np.testing.assert_array_equal(_bits(sparse.delta), _bits(dense.delta))


def test_the_sampler_samples_from_the_bf16_copy():
  """The rollout log-probs are the bf16 copy's: they differ from the f32 trainer's scores by a small nonzero
  amount, more than the trainer's own sampler differs from its scorer (sync off)."""
  off, synced = run(), run(**SPARSE)
  assert off.sampled_from == [(jnp.float32, dict(_train_mesh().shape), "float32")] * STEPS
  first_off, first_synced = off.rows[0]["mismatch/mean"], synced.rows[0]["mismatch/mean"]
  assert 0.0 < first_synced < 0.05 and first_synced > 10 * first_off, (first_off, first_synced)


def test_sync_off_leaves_the_run_unchanged():
  """kind '' ignores the other sync fields (no copy, no sync metrics), and an f32 dense copy on the
  trainer's layout, which changes nothing the sampler sees, gives the very same run as no copy."""
  off = run()
  ignored = run(**{"sync.dtype": "float32", "sync.verify_dense": True, **SAMPLER})
  same = run(**{"sync.kind": "dense", "sync.dtype": ""})
  assert not any(k.startswith("sync/") for k in off.rows[0])
  assert same.sampled_from == off.sampled_from and "sync/committed" in same.rows[0]
  for other in (ignored, same):
    for a, b in zip(off.rows, other.rows):
      b = {k: v for k, v in b.items() if not k.startswith("sync/")}
      assert _untimed(a) == _untimed(b)
    np.testing.assert_array_equal(_bits(off.delta), _bits(other.delta))
    for a, b in zip(off.batches, other.batches):
      np.testing.assert_array_equal(a.tokens, b.tokens)
      np.testing.assert_array_equal(_bits(a.rollout_logp), _bits(b.rollout_logp))


def test_a_resumed_run_equals_the_uninterrupted_one_with_sync_on():
  """The copy and the sparse baseline are rebuilt from the restored master (a resync at the stage's start),
  not checkpointed: resuming after step 1 logs exactly the uninterrupted run's steps 2..STEPS."""
  full = run(**SPARSE)
  state, meta = full.checkpointer.saved[1]
  assert weight_sync.SAMPLER not in state and set(state) == {"train"}     # the copy is a transient entry
  resumed = _run(SPARSE, start=1, resume=(state, meta))
  assert [_untimed(r) for r in resumed.rows] == [_untimed(r) for r in full.rows[1:]]
  np.testing.assert_array_equal(_bits(resumed.delta), _bits(full.delta))


# ------------------------------------------------------------------------------------------- the fields

def _section(**fields) -> ml_collections.ConfigDict:
  section = weight_sync.sampler_sync_defaults()
  for key, value in fields.items():
    ts.override(section, {key: value})
  return section


@functools.lru_cache(maxsize=1)
def _params_pair():
  """The tiny model's params on the train mesh, and a copy with every 128th element of each leaf moved by 1%
  (fewer changes per shard than a message of the default capacity holds)."""
  mesh = _train_mesh()
  before = shard_params(jax.tree.map(jnp.copy, ts._initial_params()), mesh)

  def nudge(x):
    pick = (jnp.arange(x.size) % 128 == 0).reshape(x.shape)
    return jnp.where(pick, x * 1.01 + 1e-3, x)

  return before, shard_params(jax.tree.map(nudge, before), mesh)


def _sync(**fields):
  """(SamplerSync, copy after one sync of the nudged params, its metrics) for a section with `fields`."""
  before, after = _params_pair()
  with jax.set_mesh(_train_mesh()):
    sync = weight_sync.build(_section(**fields), before, ts.MODEL, base_config().model.lora)
    copy = weight_sync.start(sync, before)
    copy, metrics = weight_sync.update(sync, copy, after)
  return sync, copy, metrics


def test_every_sync_field_changes_the_sampler_copy():
  """Each field of rl.sync, flipped from a sparse_delta baseline (kind: from off), changes the copy or its
  sync: what the stage's no-dead-flags check (tests/train/test_stages.py COVERED_ELSEWHERE) points here for."""
  off_sync, off_copy, off_metrics = _sync()
  assert off_copy is None and off_metrics == {} and off_sync.model is ts.MODEL
  base_sync, base, m = _sync(**{"kind": "sparse_delta"})
  assert m["sync/committed"] == 1.0 and 0 < m["sync/change_rate"] < 0.05 and m["sync/payload_ratio"] < 0.2
  assert "sync/bit_exact" not in m and m["sync/dense_fallbacks"] == 0
  leaf = jax.tree.leaves(base.params)[0]
  assert leaf.dtype == jnp.bfloat16 and base_sync.model.cfg.param_dtype == "bfloat16"
  assert leaf.sharding == jax.tree.leaves(_params_pair()[0])[0].sharding      # mesh all 0: the train layout
  # kind: dense sends everything
  assert _sync(kind="dense")[2]["sync/payload_ratio"] == 1.0
  # dtype: an f32 copy in an f32 module (dense: the flips below that do not need the encoder skip compiling it)
  f32_sync, f32, _ = _sync(kind="dense", dtype="float32")
  assert jax.tree.leaves(f32.params)[0].dtype == jnp.float32 and f32_sync.model.cfg.dtype == "float32"
  # capacity_frac: a message too small for one shard's changes sends those tensors whole
  assert _sync(kind="sparse_delta", capacity_frac=1e-6)[2]["sync/dense_fallbacks"] > 0
  # verify_dense: the dense reshard is built and compared
  assert _sync(kind="sparse_delta", verify_dense=True)[2]["sync/bit_exact"] == 1.0
  # mesh.<axis>: the copy lives on a mesh of that shape (sparse_delta onto tensor=2: the RL runs above)
  for axis in ("data", "fsdp", "tensor"):
    s, copy, m = _sync(**{"kind": "dense", f"mesh.{axis}": 2})
    assert dict(s.mesh.shape) == {"data": 1, "fsdp": 1, "tensor": 1, axis: 2}
    assert all(dict(x.sharding.mesh.shape) == dict(s.mesh.shape) for x in jax.tree.leaves(copy.params))
    assert m["sync/committed"] == 1.0
  # quant_layers: the quantizer converts those decoder layers' kernels only (this model's one layer is 0)
  from rlkit.models.matmul import QuantizedWeight
  kinds = lambda copy: {type(x) for x in jax.tree.leaves(copy.params["layers_0"], is_leaf=lambda x: isinstance(
      x, QuantizedWeight)) if isinstance(x, QuantizedWeight)}                     # noqa: E731
  assert kinds(_sync(kind="dense", quantizer="int8")[1]) and not kinds(_sync(kind="dense", quantizer="int8",
                                                                             quant_layers=(1,))[1])
  # impl: the Pallas kernels (interpreted on CPU) instead of their jnp references
  calls = []
  original = kernels.compact_changes
  sparse_impl._encode_fn.cache_clear()
  try:
    kernels.compact_changes = lambda *a, **k: calls.append(1) or original(*a, **k)
    _, pallas, m = _sync(kind="sparse_delta", impl="pallas")
  finally:
    kernels.compact_changes = original
    sparse_impl._encode_fn.cache_clear()
  assert calls and m["sync/committed"] == 1.0
  assert all(np.array_equal(_bits(np.asarray(a, np.float32)), _bits(np.asarray(b, np.float32)))
             for a, b in zip(jax.tree.leaves(pallas.params), jax.tree.leaves(base.params)))


# ------------------------------------------------------------------------------------------- config errors

def test_config_mistakes_are_named():
  def validate(**fields):
    cfg = rl_defaults()
    ts.override(cfg, {f"sync.{k}": v for k, v in fields.items()})
    rl_stage.validate(cfg, "rl")

  validate(**{"kind": "sparse_delta", "mesh.tensor": 2})
  with pytest.raises(ConfigError, match=r"rl.sync.kind='sparse'.*'' \(off.*dense, sparse_delta"):
    validate(kind="sparse")
  with pytest.raises(ConfigError, match=r"rl.sync.*capacity_frac"):
    validate(kind="dense", capacity_frac=2.0)
  with pytest.raises(ConfigError, match=r"at most one axis -1"):
    validate(**{"kind": "dense", "mesh.data": -1, "mesh.tensor": -1})
  with pytest.raises(ConfigError, match=r"rl.sync.mesh=.*needs 16 devices, but 8 are available.*mesh.tensor=2"):
    weight_sync.sampler_mesh(_section(**{"mesh.tensor": 16}), jax.devices())
  config = base_config()
  config.stages, config.rl = ("rl",), rl_defaults()
  ts.override(config.rl, {"sync.kind": "dense", "sync.mesh.fsdp": 3, "sync.mesh.data": -1})
  with pytest.raises(ConfigError, match=r"needs 3 devices \(times a whole number\)"):
    weight_sync.check_sampler_meshes(config, jax.devices())


@pytest.mark.parametrize("merged", [True, False])
def test_with_lora_the_copy_is_what_the_sampler_runs(merged):
  """LoRA + sync: the copy is the export of `sampling_params(master)`: the merged kernels (no adapters) with
  merged sampling, else the base and the adapters as they are; a sync after the adapters move keeps it so."""
  from rlkit.models import lora
  section = base_config().model.lora
  section.rank, section.merged_sampling = 2, merged
  mesh = _train_mesh()
  master = lora.add_adapters(jax.tree.map(jnp.copy, ts._initial_params()), section, jax.random.key(7))
  master = shard_params(master, mesh)
  moved = jax.tree_util.tree_map_with_path(
      lambda p, x: x + 0.01 if jax.tree_util.keystr(p).endswith(f"{lora.B}']") else x, master)
  with jax.set_mesh(mesh):
    sync = weight_sync.build(_section(kind="sparse_delta", capacity_frac=0.25), master, ts.MODEL, section)
    copy = weight_sync.start(sync, master)
    copy, m = weight_sync.update(sync, copy, moved)
  assert m["sync/committed"] == 1.0 and m["sync/change_rate"] > 0
  assert lora.has_adapters(copy.params) == (not merged)
  expected = jax.device_get(jax.jit(lambda p: jax.tree.map(lambda x: x.astype(jnp.bfloat16), p))(
      lora.sampling_params(moved, section)))
  assert jax.tree.structure(expected) == jax.tree.structure(copy.params)
  for a, b in zip(jax.tree.leaves(copy.params), jax.tree.leaves(expected)):
    np.testing.assert_array_equal(np.asarray(a).view(np.uint16), np.asarray(b).view(np.uint16))


def test_logra_composes_with_sparse_sync():
  """The optimizer `logra` (sketched gradients) under the sparse sync: its updates reach the bf16 copy bit-exactly
  and committed at every iteration, as AdamW's do."""
  r = run(**SPARSE, **{"optimizer.name": "logra", "optimizer.logra_rank": 4})
  assert len(r.rows) == STEPS and np.abs(r.delta).max() > 0
  for row in r.rows:
    assert row["sync/bit_exact"] == 1.0 and row["sync/committed"] == 1.0 and row["sync/change_rate"] > 0, row
