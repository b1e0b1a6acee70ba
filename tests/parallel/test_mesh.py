"""Tests for rlkit.parallel.mesh: mesh shapes, config sections, and multi-host environment detection."""
import os
import subprocess
import sys

import jax
import ml_collections
import pytest
from jax.sharding import AxisType

from rlkit.parallel import mesh as mesh_lib
from rlkit.parallel import (detect_cluster, make_mesh, maybe_initialize_distributed, mesh_from_config,
                            set_cpu_devices)
from rlkit.parallel.mesh import pool_threads


@pytest.mark.parametrize("shape, expected", [
    ((8, 1, 1), (8, 1, 1)),
    ((2, 2, 2), (2, 2, 2)),
    ((-1, 2, 1), (4, 2, 1)),
    ({"tensor": 2, "data": -1}, (4, 1, 2)),   # omitted axes are 1
    ({"fsdp": 8}, (1, 8, 1)),
])
def test_make_mesh_shapes(shape, expected):
  mesh = make_mesh(shape)
  assert mesh.axis_names == ("data", "fsdp", "tensor")
  assert tuple(mesh.shape.values()) == expected
  # Explicit axes (JAX 0.10's make_mesh default) would break with_sharding_constraint.
  assert all(t == AxisType.Auto for t in mesh.axis_types)
  assert sorted(d.id for d in mesh.devices.flat) == sorted(d.id for d in jax.devices())


def test_make_mesh_on_a_subset_of_devices():
  mesh = make_mesh({"data": -1}, devices=jax.devices()[:4])
  assert tuple(mesh.shape.values()) == (4, 1, 1)


@pytest.mark.parametrize("shape, words", [
    ((3, 1, 1), ["needs 3 devices", "8 are available", "-1"]),
    ((2, 2, 4), ["needs 16 devices", "8 are available"]),
    ((3, -1, 1), ["3 devices", "does not divide", "8"]),
    ((-1, -1, 1), ["at most one axis"]),
    ((0, 8, 1), ["positive"]),
    ((8, 1), ["3 entries"]),
    ({"model": 8}, ["Unknown mesh axes ['model']", "data"]),
])
def test_make_mesh_bad_shape_errors_clearly(shape, words):
  with pytest.raises(ValueError) as e:
    make_mesh(shape)
  for w in words:
    assert w in str(e.value)


def test_mesh_from_config_dict_and_configdict():
  cfg = ml_collections.ConfigDict({"data": -1, "fsdp": 2, "tensor": 2})
  assert tuple(mesh_from_config(cfg).shape.values()) == (2, 2, 2)
  assert tuple(mesh_from_config({"data": 1, "fsdp": -1, "tensor": 1}).shape.values()) == (1, 8, 1)
  with pytest.raises(TypeError, match="mesh config"):
    mesh_from_config((8, 1, 1))


def test_mesh_from_config_ignores_cpu_devices():
  assert tuple(mesh_from_config({"data": -1, "fsdp": 1, "tensor": 1, "cpu_devices": 2}).shape.values()) == (8, 1, 1)


def test_set_cpu_devices_splits_the_host_before_jax_starts():
  # A fresh interpreter: this one's backends are already up (with the 8 simulated devices of conftest.py).
  code = ("import jax; from rlkit.parallel.mesh import set_cpu_devices; set_cpu_devices(3); "
          "print(len(jax.devices('cpu')))")
  env = {k: v for k, v in os.environ.items() if k != "XLA_FLAGS"}
  out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert out.stdout.strip() == "3"


def test_more_devices_than_cores_get_spare_pool_threads():
  assert pool_threads(8, 2, {}) == "10"                  # XLA's pool would be exactly 8: two spare threads
  assert pool_threads(2, 2, {}) is None and pool_threads(4, 16, {}) is None   # a core per device already
  assert pool_threads(8, 2, {"NPROC": "3"}) is None      # the user's own setting stays


def test_set_cpu_devices_after_jax_started_errors_clearly():
  jax.devices()
  with pytest.raises(RuntimeError, match="before JAX starts its backends"):
    set_cpu_devices(2)
  with pytest.raises(ValueError, match="must be >= 0"):
    set_cpu_devices(-1)
  set_cpu_devices(0)   # the default: nothing to do, fine at any time


_SLURM = {"SLURM_JOB_ID": "7", "SLURM_STEP_NODELIST": "node[1-2]", "SLURM_PROCID": "0", "SLURM_LOCALID": "0"}


@pytest.mark.parametrize("env, kind", [
    ({}, None),
    ({"JAX_COORDINATOR_ADDRESS": "10.0.0.1:1234"}, "explicit"),
    ({"COORDINATOR_ADDRESS": "10.0.0.1:1234"}, "explicit"),
    ({**_SLURM, "SLURM_NTASKS": "4"}, "slurm"),
    ({**_SLURM, "SLURM_NTASKS": "1"}, None),            # one task: nothing to coordinate
    ({"SLURM_JOB_ID": "7", "SLURM_NTASKS": "4"}, None),  # salloc without srun: no step variables
    ({"OMPI_MCA_orte_hnp_uri": "x", "OMPI_COMM_WORLD_SIZE": "2"}, "ompi"),
    ({"OMPI_MCA_orte_hnp_uri": "x", "OMPI_COMM_WORLD_SIZE": "1"}, None),
    ({"TPU_WORKER_HOSTNAMES": "h0,h1", "TPU_WORKER_ID": "1"}, "tpu"),
    ({"TPU_WORKER_HOSTNAMES": "h0"}, None),
    ({"MEGASCALE_COORDINATOR_ADDRESS": "h0"}, "tpu"),
    ({"KUBERNETES_SERVICE_HOST": "k"}, None),           # every pod has it: opt-in only
    ({"RLKIT_DISTRIBUTED": "1"}, "opt_in"),
    ({"RLKIT_DISTRIBUTED": "0", **_SLURM, "SLURM_NTASKS": "4"}, None),
])
def test_detect_cluster(env, kind):
  assert detect_cluster(env) == kind


_ALL_VARS = ["JAX_COORDINATOR_ADDRESS", "COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
             "RLKIT_DISTRIBUTED", "OMPI_MCA_orte_hnp_uri", "TPU_WORKER_HOSTNAMES", "TPU_PROCESS_ADDRESSES",
             "MEGASCALE_COORDINATOR_ADDRESS", *_SLURM, "SLURM_NTASKS"]


@pytest.fixture
def fake_initialize(monkeypatch):
  """Records jax.distributed.initialize calls (the real one needs peers and an uninitialised backend)."""
  for v in _ALL_VARS:
    monkeypatch.delenv(v, raising=False)
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: calls.append(kw))
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: bool(calls))
  return calls


def test_maybe_initialize_distributed_is_a_noop_without_env(fake_initialize):
  assert maybe_initialize_distributed() is False
  assert fake_initialize == []


def test_maybe_initialize_distributed_explicit_and_idempotent(fake_initialize, monkeypatch):
  monkeypatch.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  monkeypatch.setenv("JAX_PROCESS_ID", "1")
  assert maybe_initialize_distributed() is True
  assert maybe_initialize_distributed() is True
  assert fake_initialize == [dict(coordinator_address="10.0.0.1:1234", num_processes=2, process_id=1)]


def test_maybe_initialize_distributed_cluster_uses_jax_autodetection(fake_initialize, monkeypatch):
  for k, v in {**_SLURM, "SLURM_NTASKS": "2"}.items():
    monkeypatch.setenv(k, v)
  assert maybe_initialize_distributed() is True
  assert fake_initialize == [{}]


def test_maybe_initialize_distributed_explicit_needs_counts(fake_initialize, monkeypatch):
  monkeypatch.setenv("COORDINATOR_ADDRESS", "10.0.0.1:1234")
  monkeypatch.setenv("JAX_NUM_PROCESSES", "2")
  with pytest.raises(ValueError, match="JAX_PROCESS_ID"):
    maybe_initialize_distributed()
  assert fake_initialize == []


def test_maybe_initialize_distributed_real_call_without_env(monkeypatch):
  for v in _ALL_VARS:
    monkeypatch.delenv(v, raising=False)
  assert mesh_lib.maybe_initialize_distributed() is False
