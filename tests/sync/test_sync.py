"""rlkit.sync: dense and sparse-delta weight sync from a train mesh (fsdp=4, float32 master) to a sampler mesh
(tensor=2, bf16) on simulated CPU devices (tests/conftest.py: 8 of them).

The property every test comes back to: after each sync the sampler's bf16 bits equal those of a dense
reshard, `jax.device_put(export, sampler sharding)`, on every device, replicas included."""
import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import optax
import pytest
from jax.sharding import NamedSharding, PartitionSpec as P

from rlkit import sync
from rlkit.parallel.mesh import make_mesh
from rlkit.sync import codec, shards
from rlkit.sync.sparse_delta import SparseLeaf

pytestmark = pytest.mark.skipif(len(jax.devices()) < 8, reason="needs 8 (simulated) devices: tests/conftest.py")

# name: (shape, train spec, sampler spec). Odd sizes; the sampler splits other dims than the trainer.
LAYOUT = {
    "w": ((64, 36), P("fsdp", None), P(None, "tensor")),
    "emb": ((20, 32), P(None, "fsdp"), P()),               # replicated on the sampler: every device receives
    "b": ((36,), P(), P("tensor")),                        # replicated on the trainer: one copy is sent
    "scale": ((), P(), P()),                               # 0-d: sent as a value when it changes
}
SPARSE = sync.SyncConfig(kind="sparse_delta")


@pytest.fixture(scope="module")
def meshes():
  devices = jax.devices()
  return {"train": make_mesh({"fsdp": 4}, devices=devices[:4]),
          "sampler": make_mesh({"tensor": 2}, devices=devices[4:6]),
          "sampler_replicated": make_mesh({"data": 2, "tensor": 2}, devices=devices[4:8])}


def _shardings(mesh, which):
  return {k: NamedSharding(mesh, spec[which]) for k, spec in
          ((k, {"train": v[1], "sampler": v[2]}) for k, v in LAYOUT.items())}


def _train_params(mesh, seed=0):
  rng = np.random.default_rng(seed)
  params = {k: (0.05 * rng.standard_normal(shape)).astype(np.float32) for k, (shape, _, _) in LAYOUT.items()}
  params["scale"] = np.float32(1.0)
  return jax.device_put(params, _shardings(mesh, "train"))


def _adam_steps(params, n, lr, seed=1):
  """n Adam steps on a random quadratic, yielding the float32 master params after each."""
  target = jax.tree.map(lambda x: jnp.ones_like(x), params)
  opt = optax.adam(lr)
  state = opt.init(params)

  @jax.jit
  def step(params, state, key):
    grads = jax.tree.map(lambda p, t, k: (p - t) * (1 + jax.random.normal(k, p.shape)),
                         params, target, dict(zip(params, jax.random.split(key, len(params)))))
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for i in range(n):
    params, state = step(params, state, jax.random.key(seed * 1000 + i))
    yield params


def _bits(x):
  x = np.asarray(x)
  return x.view({2: np.uint16, 4: np.uint32}[x.dtype.itemsize])


def _assert_equals_dense_reshard(sampler_params, train_params, cfg=SPARSE):
  """Every device's block (replicas included) has the bits of a dense reshard of the export."""
  shardings = jax.tree.map(lambda x: x.sharding, sampler_params)
  dense = jax.device_put(sync.export_params(train_params, cfg.dtype), shardings)
  for k in LAYOUT:
    got, want = sampler_params[k], dense[k]
    assert got.sharding == want.sharding and got.dtype == want.dtype
    by_device = {s.device: s.data for s in want.addressable_shards}
    for s in got.addressable_shards:
      np.testing.assert_array_equal(_bits(s.data), _bits(by_device[s.device]), err_msg=f"{k} on {s.device}")


@pytest.mark.parametrize("impl,steps", [("reference", 4), ("pallas", 2)])
def test_sparse_delta_is_bit_identical_to_a_dense_reshard_every_step(meshes, impl, steps):
  cfg = sync.SyncConfig(kind="sparse_delta", impl=impl)
  params = _train_params(meshes["train"])
  sampler, state, _ = sync.resync(params, _shardings(meshes["sampler"], "sampler"), cfg)
  _assert_equals_dense_reshard(sampler, params)
  sparse_steps = 0
  for params in _adam_steps(params, steps, lr=1e-6):
    sampler, new_state, stats = sync.sync_params(params, state, sampler, cfg)
    _assert_equals_dense_reshard(sampler, params)
    assert stats["verified"] == stats["committed"] == 1.0 and stats["resynced"] == 0.0
    assert int(new_state.version) == int(state.version) + 1
    assert 0 < stats["change_rate"] < 0.05              # Adam at 1e-6: most updates round away in bf16
    assert stats["payload_bytes"] < stats["dense_bytes"]
    sparse_steps += stats["entries"] > 0 and stats["dense_fallbacks"] == 0
    state = new_state
    # The committed baseline is the export, on the train shardings (what the next sync diffs against).
    for k, b in state.baseline.items():
      assert b.sharding == params[k].sharding and b.dtype == jnp.bfloat16
  assert sparse_steps == steps


def test_dense_backend_gives_the_same_bits(meshes):
  params = _train_params(meshes["train"])
  shardings = _shardings(meshes["sampler"], "sampler")
  sampler, state, _ = sync.resync(params, shardings, sync.SyncConfig(kind="dense"))
  assert state.baseline is None                         # dense keeps no baseline
  params = next(_adam_steps(params, 1, lr=1e-6))
  sampler, state, stats = sync.sync_params(params, state, sampler, sync.SyncConfig(kind="dense"))
  _assert_equals_dense_reshard(sampler, params)
  assert stats["payload_ratio"] == 1.0 and stats["committed"] == 1.0


def test_unchanged_step_sends_nothing(meshes):
  params = _train_params(meshes["train"])
  sampler, state, _ = sync.resync(params, _shardings(meshes["sampler"], "sampler"), SPARSE)
  payload, _ = sync.prepare(params, state, sampler, SPARSE)
  assert all(isinstance(leaf, sync.UnchangedLeaf) for leaf in payload.leaves)
  assert payload.stats["entries"] == payload.stats["payload_bytes"] == payload.stats["header_bytes"] == 0
  assert payload.stats["change_rate"] == 0.0
  sampler, state, stats = sync.sync_params(params, state, sampler, SPARSE)
  assert stats["verified"] == 1.0
  _assert_equals_dense_reshard(sampler, params)


def test_overflow_falls_back_to_dense_and_stays_exact(meshes):
  params = _train_params(meshes["train"])
  sampler, state, _ = sync.resync(params, _shardings(meshes["sampler"], "sampler"), SPARSE)
  params = next(_adam_steps(params, 1, lr=1e-2))        # a big step: most bf16 values change
  sampler, state, stats = sync.sync_params(params, state, sampler, SPARSE)
  assert stats["change_rate"] > 0.5 and stats["dense_fallbacks"] == 3      # every tensor but the 0-d one
  assert stats["payload_ratio"] > 0.5 and stats["committed"] == 1.0
  _assert_equals_dense_reshard(sampler, params)
  params = next(_adam_steps(params, 1, lr=1e-6, seed=2))                 # back to sparse from that baseline
  sampler, state, stats = sync.sync_params(params, state, sampler, SPARSE)
  assert stats["dense_fallbacks"] == 0 and stats["entries"] > 0
  _assert_equals_dense_reshard(sampler, params)


def _sparse_leaf_with_entries(payload):
  """(position, leaf, message row) of a sparse leaf's first message that carries entries."""
  for i, leaf in enumerate(payload.leaves):
    if isinstance(leaf, SparseLeaf):
      counts = np.asarray(leaf.counts)
      rows = np.flatnonzero(leaf.sent & (counts[:, 0] > 0))
      if rows.size:
        return i, leaf, int(rows[0])
  raise AssertionError("no sparse message with entries")


def _drop_message(leaf, row):
  return leaf._replace(counts=leaf.counts.at[row, 0].set(0))           # the receiver gets nothing from row


def _corrupt_value(leaf, row):
  return leaf._replace(values=leaf.values.at[row, 0].set(leaf.values[row, 0] ^ 1))    # one flipped bit


@pytest.mark.parametrize("fault", [_drop_message, _corrupt_value])
def test_faults_are_caught_the_baseline_is_kept_and_resync_recovers(meshes, fault):
  params = _train_params(meshes["train"])
  shardings = _shardings(meshes["sampler"], "sampler")
  sampler, state, _ = sync.resync(params, shardings, SPARSE)
  params = next(_adam_steps(params, 1, lr=1e-6))
  payload, pending = sync.prepare(params, state, sampler, SPARSE)
  i, leaf, row = _sparse_leaf_with_entries(payload)
  leaves = list(payload.leaves)
  leaves[i] = fault(leaf, row)
  received, acks, stats = sync.receive(payload._replace(leaves=tuple(leaves)), sampler, SPARSE)
  assert not acks[i] and sum(not a for a in acks) == 1 and stats["verified"] == 0.0
  new_state, committed = sync.commit(state, pending, acks)
  assert not committed and new_state is state                            # the baseline is not committed
  with pytest.raises(AssertionError):
    _assert_equals_dense_reshard(received, params)
  sampler, state, stats = sync.resync(params, shardings, SPARSE, state)
  _assert_equals_dense_reshard(sampler, params)
  assert int(state.version) == int(new_state.version) + 1
  # After the resync, sparse syncs are exact again.
  params = next(_adam_steps(params, 1, lr=1e-6, seed=3))
  sampler, state, stats = sync.sync_params(params, state, sampler, SPARSE)
  assert stats["committed"] == 1.0 and stats["entries"] > 0
  _assert_equals_dense_reshard(sampler, params)


def test_sync_params_resyncs_by_itself_after_a_failed_sync(meshes, monkeypatch):
  params = _train_params(meshes["train"])
  sampler, state, _ = sync.resync(params, _shardings(meshes["sampler"], "sampler"), SPARSE)
  params = next(_adam_steps(params, 1, lr=1e-6))
  real_receive = sync.backends.receive

  def lossy_receive(payload, sampler_params, cfg):
    i, leaf, row = _sparse_leaf_with_entries(payload)
    leaves = list(payload.leaves)
    leaves[i] = _drop_message(leaf, row)
    return real_receive(payload._replace(leaves=tuple(leaves)), sampler_params, cfg)

  monkeypatch.setattr(sync.backends, "receive", lossy_receive)
  sampler, new_state, stats = sync.sync_params(params, state, sampler, SPARSE)
  assert stats["verified"] == 0.0 and stats["committed"] == 0.0 and stats["resynced"] == 1.0
  _assert_equals_dense_reshard(sampler, params)
  assert int(new_state.version) == int(state.version) + 1


def test_replicated_sampler_devices_and_a_checkpointed_baseline(meshes):
  """A sampler mesh data=2 x tensor=2 holds each block twice: both copies are patched and verified. The
  baseline, saved as numpy and restored onto the train shardings, continues the syncs exactly."""
  params = _train_params(meshes["train"])
  shardings = _shardings(meshes["sampler_replicated"], "sampler")
  sampler, state, _ = sync.resync(params, shardings, SPARSE)
  steps = _adam_steps(params, 2, lr=1e-6)
  params = next(steps)
  sampler, state, stats = sync.sync_params(params, state, sampler, SPARSE)
  assert stats["committed"] == 1.0 and stats["entries"] > 0
  _assert_equals_dense_reshard(sampler, params)
  saved = jax.tree.map(np.asarray, state)                                # what a checkpoint holds
  train = _shardings(meshes["train"], "train")
  restored = sync.SyncState(jax.device_put(saved.baseline, train), jnp.asarray(saved.version))
  params = next(steps)
  sampler, state, stats = sync.sync_params(params, restored, sampler, SPARSE)
  assert stats["committed"] == 1.0
  _assert_equals_dense_reshard(sampler, params)


def test_single_device_sampler(meshes):
  """A sampler on one device (SingleDeviceSharding, e.g. a colocated engine) is one block of a 1-device mesh."""
  params = {"w": _train_params(meshes["train"])["w"]}
  one = {"w": jax.sharding.SingleDeviceSharding(jax.devices()[6])}
  sampler, state, _ = sync.resync(params, one, SPARSE)
  params = {"w": next(_adam_steps(params, 1, lr=1e-6))["w"]}
  sampler, state, stats = sync.sync_params(params, state, sampler, SPARSE)
  assert stats["committed"] == 1.0 and stats["entries"] > 0 and sampler["w"].sharding == one["w"]
  dense = jax.device_put(sync.export_params(params, "bfloat16"), one)
  np.testing.assert_array_equal(_bits(sampler["w"]), _bits(dense["w"]))


def test_geometry_numbers_replicas_in_mesh_order(meshes):
  train, sampler = meshes["train"], meshes["sampler_replicated"]
  g = shards.geometry(NamedSharding(train, P()), (36,))
  assert list(g.replica) == [0, 1, 2, 3] and g.offsets.tolist() == [[0]] * 4     # one message is sent
  g = shards.geometry(NamedSharding(train, P(None, "fsdp")), (20, 32))
  assert list(g.replica) == [0] * 4 and g.offsets.tolist() == [[0, 0], [0, 8], [0, 16], [0, 24]]
  g = shards.geometry(NamedSharding(sampler, P(None, "tensor")), (64, 36))       # data=2 x tensor=2
  assert list(g.replica) == [0, 0, 1, 1] and g.local_shape == (64, 18)


def test_verify_checks_every_replica(meshes):
  mesh = meshes["sampler_replicated"]
  x = jax.device_put(jnp.arange(8, dtype=jnp.float32).reshape(2, 4), NamedSharding(mesh, P(None, "tensor")))
  expected = int(codec.checksum(jnp.arange(8, dtype=jnp.float32).reshape(2, 4)))
  assert shards.verify(*shards.device_checksums(x), expected)
  # One replica's copy of one block differs: the other replica set still sums right, this one does not.
  blocks = [s.data if s.device != mesh.devices.flat[3] else s.data.at[0, 0].set(-1.0)
            for s in x.addressable_shards]
  bad = jax.make_array_from_single_device_arrays(x.shape, x.sharding, blocks)
  partials, replica = shards.device_checksums(bad)
  assert shards.tensor_checksum(partials, replica) == expected            # replica 0 is intact
  assert not shards.verify(partials, replica, expected)


def test_payload_at_three_percent_change_is_at_most_six_percent_of_dense(meshes):
  """Exactly 3% of a bf16 tensor's elements change: gap-coded u16 indices + bf16 values = 4 bytes per
  change against 2 per element dense, 0.06; int32 indices would need 0.09."""
  shape, spec = (128, 96), P("fsdp", None)
  rng = np.random.default_rng(0)
  base = rng.standard_normal(shape).astype(ml_dtypes.bfloat16)
  new = base.copy().reshape(-1)
  changed = rng.choice(new.size, size=int(0.03 * new.size), replace=False)
  new[changed] = (new[changed].astype(np.float32) + 1.0).astype(ml_dtypes.bfloat16)
  train = NamedSharding(meshes["train"], spec)
  cfg = sync.SyncConfig(kind="sparse_delta", dtype="")                  # the bf16 params are the export
  params = {"w": jax.device_put(base, train)}
  sampler, state, _ = sync.resync(params, {"w": NamedSharding(meshes["sampler"], P(None, "tensor"))}, cfg)
  params = {"w": jax.device_put(new.reshape(shape), train)}
  sampler, state, stats = sync.sync_params(params, state, sampler, cfg)
  assert stats["entries"] == changed.size and stats["dense_fallbacks"] == 0
  assert stats["index_bytes"] == 2 * changed.size                        # no gap reached the escape
  assert stats["payload_ratio"] <= 0.06
  assert (4 + 2) * changed.size / stats["dense_bytes"] > 0.089            # what int32 indices would cost
  np.testing.assert_array_equal(_bits(sampler["w"]), _bits(new.reshape(shape)))


# ---------------------------------------------------------------------------------------------------------
# Codec, registry and config

def test_gap_code_round_trips_with_escapes():
  encode, decode = jax.jit(codec.gap_encode), jax.jit(codec.gap_decode)
  idx = np.array([3, 4, 70_000, 70_001, 70_001 + 65_535, 2**31 - 2, -1, -1], np.int32)
  code = encode(jnp.asarray(idx), 6, -1)
  assert int(code.n_escapes) == 3                                       # gaps 69996, 65535, ~2^31
  assert int(codec.coded_index_bytes(6, code.n_escapes)) == 2 * 6 + 4 * 3
  np.testing.assert_array_equal(np.asarray(decode(code, 6, -1)), idx)
  # A count past the capacity decodes the whole capacity; a start other than -1 shifts the origin; a gap of
  # 65535 is escaped, one of 65534 is not.
  shifted = np.array([100, 101, 65_636, 65_637, 131_171, 131_172, 131_173, 2**31 - 1], np.int32)
  code = encode(jnp.asarray(shifted), 9, 99)
  assert int(code.n_escapes) == 2
  np.testing.assert_array_equal(np.asarray(decode(code, 9, 99)), shifted)


def test_checksum_partials_add_up_and_catch_any_single_change():
  whole_sum = jax.jit(codec.checksum)
  block_sum = jax.jit(lambda x, o: codec.checksum(x, o, (6, 10)))
  x = np.random.default_rng(0).standard_normal((6, 10)).astype(np.float32)
  whole = int(whole_sum(x))
  parts = [int(block_sum(x[r:r + 2, c:c + 5], np.array([r, c]))) for r in (0, 2, 4) for c in (0, 5)]
  assert sum(parts) % 2**32 == whole
  for i, bits in [(0, 0x80000000), (17, 1), (59, 0x00400000)]:           # sign, lowest bit, a NaN-ish bit
    y = x.reshape(-1).view(np.uint32).copy()
    y[i] ^= bits
    assert int(whole_sum(y.view(np.float32).reshape(6, 10))) != whole
  swapped = x.reshape(-1).copy()
  swapped[[3, 4]] = swapped[[4, 3]]
  assert int(whole_sum(swapped.reshape(6, 10))) != whole               # the position term
  zeros = np.zeros(4, ml_dtypes.bfloat16)
  negative_zero = zeros.copy()
  negative_zero[2] = -0.0
  assert int(whole_sum(zeros)) != int(whole_sum(negative_zero))


def test_registry_refuses_unknown_and_duplicate_names():
  with pytest.raises(KeyError, match="Valid sync backend names: sparse_delta, dense"):   # closest first
    sync.SYNC_BACKENDS.get("sparse")
  with pytest.raises(ValueError, match="sync.kind='nccl'.*dense.*sparse_delta"):
    sync.SyncConfig(kind="nccl")
  with pytest.raises(ValueError, match="already registered"):
    sync.SYNC_BACKENDS.add("dense", sync.SYNC_BACKENDS.get("dense"))


def test_config_defaults_and_validation():
  cfg = sync.sync_config(sync.sync_defaults())
  assert cfg == sync.SyncConfig()
  assert cfg.kernel_impl == ("pallas" if jax.default_backend() == "gpu" else "reference")
  assert sync.SyncConfig(impl="pallas").kernel_impl == "pallas"
  for bad, match in [({"kind": "dense", "capacity": 1}, "Unknown sync config keys"),
                     ({"capacity_frac": 0.0}, "capacity_frac"), ({"dtype": "bf17"}, "not a dtype"),
                     ({"impl": "triton"}, "impl")]:
    with pytest.raises(ValueError, match=match):
      sync.sync_config(bad)


def test_sampler_dtype_is_the_configured_one(meshes):
  params = _train_params(meshes["train"])
  shardings = _shardings(meshes["sampler"], "sampler")
  keep = sync.SyncConfig(kind="dense", dtype="")
  sampler, _, _ = sync.resync(params, shardings, keep)
  assert all(x.dtype == jnp.float32 for x in jax.tree.leaves(sampler))   # "" keeps the master's float32
  np.testing.assert_array_equal(np.asarray(sampler["w"]), np.asarray(params["w"]))
  with pytest.raises(ValueError, match=r"Sampler param \['b'\] is float32\[36\].*exports bfloat16\[36\]"):
    sync.prepare(params, sync.SyncState(None, jnp.int32(0)), sampler, sync.SyncConfig(kind="dense"))


@pytest.mark.parametrize("context", ["train", "sampler"])
def test_a_context_mesh_does_not_change_the_sync(meshes, context):
  """Under a context mesh (`jax.set_mesh`: the train mesh, as the trainer runs, or the sampler's), every
  public step works on both meshes and gives the same bits as without one; the context is left as it was."""
  params = _train_params(meshes["train"])
  shardings = _shardings(meshes["sampler"], "sampler")
  step1, step2 = _adam_steps(params, 2, lr=1e-6)
  with jax.set_mesh(meshes[context]):
    sampler, state, _ = sync.resync(params, shardings, SPARSE)
    payload, pending = sync.prepare(step1, state, sampler, SPARSE)
    sampler, acks, _ = sync.receive(payload, sampler, SPARSE)
    state, committed = sync.commit(state, pending, acks)
    sampler, state, stats = sync.sync_params(step2, state, sampler, SPARSE)
    assert jax.sharding.get_abstract_mesh() == meshes[context].abstract_mesh
  params = step2
  assert committed and stats["committed"] == 1.0 and stats["entries"] > 0
  _assert_equals_dense_reshard(sampler, params)
