"""Device meshes and multi-host start-up.

rlkit uses one 3-axis mesh, ``("data", "fsdp", "tensor")``:

  data    pure data parallelism: parameters replicated, the batch split;
  fsdp    fully-sharded data parallelism: the batch split *and* each weight's model dim split (ZeRO-3 style);
  tensor  tensor / expert parallelism: attention heads, MLP hidden units, experts and the vocabulary split.

`tensor` is the last (fastest-varying) axis so that, with `jax.make_mesh`'s device ordering, its devices are
neighbours on the fastest interconnect (same host / NVLink / ICI ring); it carries the most communication.
The axes are `AxisType.Auto` (GSPMD propagation): JAX 0.10's `jax.make_mesh` defaults to `Explicit` axes,
with which `with_sharding_constraint` and implicit resharding fail (see methods/platform.md §2).

Multi-host: `maybe_initialize_distributed()` must run before any other JAX call (even `jax.devices()`).
It calls `jax.distributed.initialize()` when one of these environments is detected, and is a no-op otherwise:

  explicit      JAX_COORDINATOR_ADDRESS (or COORDINATOR_ADDRESS) = "host:port" of process 0, together with
                JAX_NUM_PROCESSES and JAX_PROCESS_ID (both required). JAX itself also reads
                JAX_LOCAL_DEVICE_IDS ("0,1") and JAX_COORDINATOR_BIND_ADDRESS.
  Slurm         SLURM_JOB_ID, SLURM_STEP_NODELIST, SLURM_NTASKS, SLURM_PROCID, SLURM_LOCALID all set
                (i.e. inside `srun`) and SLURM_NTASKS > 1. JAX derives the coordinator from the node list.
  Open MPI      OMPI_MCA_orte_hnp_uri set (launched by mpirun/mpiexec) and OMPI_COMM_WORLD_SIZE > 1; JAX reads
                OMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_LOCAL_RANK.
  TPU on GKE    TPU_WORKER_HOSTNAMES or TPU_PROCESS_ADDRESSES listing more than one host (comma separated),
                or MEGASCALE_COORDINATOR_ADDRESS (multislice); JAX reads TPU_WORKER_ID.
  opt-in        RLKIT_DISTRIBUTED=1 calls `jax.distributed.initialize()` with JAX's full auto-detection;
                use it on GCE TPU VM pods (detected through the metadata server, which we do not query by
                default) and Kubernetes indexed Jobs (KUBERNETES_SERVICE_HOST is set in every pod, even
                single-process ones). RLKIT_DISTRIBUTED=0 disables initialisation even when an environment
                above is detected.

Where JAX derives the coordinator itself (all but `explicit`), JAX_COORDINATOR_PORT overrides its port.
"""
from __future__ import annotations

import logging
import math
import os
from typing import Any, Mapping, Optional, Sequence, Union

import jax
from jax.sharding import AxisType, Mesh

AXES = ("data", "fsdp", "tensor")
BATCH_AXES = ("data", "fsdp")   # mesh axes the batch dimension is split over

MeshShape = Union[Mapping[str, int], Sequence[int]]


def _resolve_shape(shape: MeshShape, num_devices: int) -> tuple[int, ...]:
  if isinstance(shape, Mapping):
    unknown = sorted(set(shape) - set(AXES))
    if unknown:
      raise ValueError(f"Unknown mesh axes {unknown}; valid axes are {list(AXES)}.")
    sizes = [int(shape.get(a, 1)) for a in AXES]   # an omitted axis has size 1
  else:
    sizes = [int(s) for s in shape]
    if len(sizes) != len(AXES):
      raise ValueError(f"Mesh shape {tuple(sizes)} must have {len(AXES)} entries, for axes {AXES}.")
  named = dict(zip(AXES, sizes))
  if sizes.count(-1) > 1:
    raise ValueError(f"Mesh shape {named}: at most one axis may be -1 (all remaining devices).")
  if any(s == 0 or s < -1 for s in sizes):
    raise ValueError(f"Mesh shape {named}: sizes must be positive, or -1 for all remaining devices.")
  if -1 in sizes:
    fixed = math.prod(s for s in sizes if s != -1)
    if num_devices % fixed:
      raise ValueError(f"Mesh shape {named}: the fixed axes use {fixed} devices, which does not divide the "
                       f"{num_devices} available devices; choose sizes whose product divides {num_devices}.")
    sizes[sizes.index(-1)] = num_devices // fixed
  if math.prod(sizes) != num_devices:
    raise ValueError(f"Mesh shape {named} needs {math.prod(sizes)} devices but {num_devices} are available; "
                     f"make the product of the sizes equal {num_devices}, or set one axis to -1 to use all "
                     f"remaining devices.")
  return tuple(sizes)


def make_mesh(shape: MeshShape, devices: Optional[Sequence[Any]] = None) -> Mesh:
  """A `("data", "fsdp", "tensor")` mesh with Auto axes.

  Args:
    shape: sizes as a dict (omitted axes are 1) or a 3-tuple in axis order; one size may be -1,
      meaning "all remaining devices".
    devices: the devices to lay out (default: all of `jax.devices()`, across hosts).
  """
  devices = list(jax.devices() if devices is None else devices)
  sizes = _resolve_shape(shape, len(devices))
  # jax.make_mesh orders devices by physical topology (TPU/GPU); it defaults to Explicit axes, hence Auto.
  return jax.make_mesh(sizes, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def mesh_from_config(cfg: Any, devices: Optional[Sequence[Any]] = None) -> Mesh:
  """Mesh from a config section such as `{data: -1, fsdp: 1, tensor: 1}` (ConfigDict or dict).

  The section's `cpu_devices` entry, if any, is not an axis: `launch.py` applies it with `set_cpu_devices`
  before JAX starts.
  """
  if hasattr(cfg, "to_dict"):
    cfg = cfg.to_dict()
  if not isinstance(cfg, Mapping):
    raise TypeError(f"mesh config must be a dict or ConfigDict like {{'data': -1, 'fsdp': 1, 'tensor': 1}}, "
                    f"got {type(cfg).__name__}.")
  return make_mesh({k: v for k, v in cfg.items() if k != "cpu_devices"}, devices)


def set_cpu_devices(n: int) -> None:
  """Expose this host's CPU as `n` XLA devices (0 keeps JAX's default: one device, or XLA_FLAGS' count).

  Why: one XLA:CPU device runs every op of a small model across all cores and pays a thread hand-off per
  op. With one device per core and the batch split over the `data` axis, each core runs its half of the
  batch on its own. On the 2-core benchmark machine this made the S sampler about 1.8x faster; the M
  sampler gained 0-10% in A/B runs and the M train step did not change (`benchmarks/README.md`).
  Only the CPU backend is affected. Must run before JAX starts its backends (any array, `jax.devices()`).
  """
  if n < 0:
    raise ValueError(f"cpu_devices={n} must be >= 0 (0 keeps JAX's default).")
  if n == 0:
    return
  threads = pool_threads(n, usable_cores(), os.environ)
  if threads is not None:
    os.environ["NPROC"] = threads
  try:
    jax.config.update("jax_num_cpu_devices", n)
  except RuntimeError as e:
    raise RuntimeError(f"cpu_devices={n} must be set before JAX starts its backends (before any array or "
                       f"jax.devices() call); call set_cpu_devices first thing, as launch.py does.") from e


SPARE_POOL_THREADS = 2


def usable_cores() -> int:
  """The cores this process may run on: its CPU affinity where the OS has one (Linux), else the machine's count
  (macOS)."""
  try:
    return len(os.sched_getaffinity(0))
  except (AttributeError, OSError):
    return os.cpu_count() or 1


def pool_threads(devices: int, cores: int, environ: Mapping[str, str]) -> Optional[str]:
  """The NPROC that gives XLA:CPU's thread pools threads beyond `devices` when there are more devices than cores,
  or None to leave the environment alone (NPROC already set, or at least as many cores as devices).

  Why: XLA:CPU runs each device's share of a program as a task on its client pool of max(cores, devices) threads
  (NPROC, where set, stands for the core count). With as many devices as threads, a device running behind holds all
  its in-flight slots (XLA's per-device limit), so its next launch blocks one pool thread while every other device's
  share waits in that program's collective on the others: no thread is left to run the lagging device's queue, and
  XLA aborts the process after 40 s (seen on a 2-core machine with 8 simulated devices: a core dump of the aborted
  process had 7 pool threads in an all-reduce and 1 on the semaphore). One free thread drains the queue; two leave a
  margin. With exactly as many devices as cores the pool has no spare thread either, but each device then has a core
  to keep up on, and no such abort has been recorded there; that layout (the benchmarks' `cpu_devices=2` on 2 cores)
  keeps its measured thread counts."""
  if "NPROC" in environ or cores >= devices:
    return None
  return str(devices + SPARE_POOL_THREADS)


def mesh_axis_size(mesh: Mesh, axes: Union[None, str, Sequence[str]]) -> int:
  """Number of devices a PartitionSpec entry (None, an axis, or a tuple of axes) splits a dim into."""
  if axes is None:
    return 1
  if isinstance(axes, str):
    axes = (axes,)
  return math.prod(mesh.shape[a] for a in axes)


# ---------------------------------------------------------------------------------------------------------
# Multi-host start-up

def _env_int(env: Mapping[str, str], name: str) -> Optional[int]:
  try:
    return int(env[name])
  except (KeyError, ValueError):
    return None


def detect_cluster(environ: Optional[Mapping[str, str]] = None) -> Optional[str]:
  """Which multi-process environment the variables describe: 'explicit', 'slurm', 'ompi', 'tpu', 'opt_in'
  or None (single process). Pure: reads only `environ` (default `os.environ`). See the module docstring."""
  env = os.environ if environ is None else environ
  switch = env.get("RLKIT_DISTRIBUTED", "").strip().lower()
  if switch in ("0", "false", "no", "off"):
    return None
  if env.get("JAX_COORDINATOR_ADDRESS") or env.get("COORDINATOR_ADDRESS"):
    return "explicit"
  slurm = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
  # A single-task allocation (e.g. an interactive salloc) is single-process: nothing to coordinate.
  if all(v in env for v in slurm) and (_env_int(env, "SLURM_NTASKS") or 1) > 1:
    return "slurm"
  if "OMPI_MCA_orte_hnp_uri" in env and (_env_int(env, "OMPI_COMM_WORLD_SIZE") or 1) > 1:
    return "ompi"
  hosts = env.get("TPU_PROCESS_ADDRESSES") or env.get("TPU_WORKER_HOSTNAMES") or ""
  if len([h for h in hosts.split(",") if h.strip()]) > 1 or env.get("MEGASCALE_COORDINATOR_ADDRESS"):
    return "tpu"
  if switch in ("1", "true", "yes", "on"):
    return "opt_in"
  return None


def maybe_initialize_distributed() -> bool:
  """Initialise `jax.distributed` if a multi-process environment is detected (see the module docstring).

  Idempotent: a second call (or a call after the user initialised it) does nothing.
  Returns True when the distributed runtime is up (started by this call or earlier), False otherwise.
  Must run before any other JAX call; JAX raises a RuntimeError otherwise.
  """
  if jax.distributed.is_initialized():
    return True
  kind = detect_cluster()
  if kind is None:
    return False
  kwargs = {}
  if kind == "explicit":
    address = os.environ.get("JAX_COORDINATOR_ADDRESS") or os.environ.get("COORDINATOR_ADDRESS")
    num, pid = _env_int(os.environ, "JAX_NUM_PROCESSES"), _env_int(os.environ, "JAX_PROCESS_ID")
    if num is None or pid is None:
      raise ValueError(f"Coordinator address {address!r} is set, but JAX_NUM_PROCESSES="
                       f"{os.environ.get('JAX_NUM_PROCESSES')!r} and JAX_PROCESS_ID="
                       f"{os.environ.get('JAX_PROCESS_ID')!r}; set both to integers (process ids 0..N-1).")
    kwargs = dict(coordinator_address=address, num_processes=num, process_id=pid)
  logging.info("Initialising jax.distributed (%s environment).", kind)
  jax.distributed.initialize(**kwargs)
  return True
