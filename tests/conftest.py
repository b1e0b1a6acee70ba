"""Test-wide setup: 8 simulated CPU devices (for mesh tests), float32 matmuls at full precision, one
persistent compilation cache for the run's subprocesses, XLA's faster-compiling CPU emitters
(tests/xla_flags.py), and its optimisation passes off (but where a test turns them on,
`tests.fast_compile.optimized()`)."""
import atexit
import gc
import os
import shutil
import tempfile

from tests.xla_flags import FAST_COMPILE  # (no jax import: jax must start after the settings below)

# Must be set before jax initialises its backend; harmless for single-device tests.
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count=8 {FAST_COMPILE}")
# XLA:CPU runs each device's share of a program on the client's thread pool, whose size is max(cores, devices):
# 8 threads for the 8 devices on a 2-core machine. A device that runs behind holds all its in-flight slots, so
# its next launch blocks one pool thread while the other 7 devices' shares wait in that program's all-reduce on
# the other 7: every pool thread waits, nothing drains the queue, and after 40 s XLA aborts the worker (a core
# dump of a crashed worker showed exactly this: 7 threads in InProcessCommunicator::AllReduce, 1 in
# Semaphore::Acquire, the rest of the process idle). XLA sizes its pools from NPROC where it is set; 12 leaves 4
# threads to drain the queue (launch.py's `mesh.cpu_devices` does the same for users: mesh.pool_threads).
os.environ.setdefault("NPROC", "12")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Many tests run `launch.py` subprocesses, and each compiles the main job's steps afresh (a 32 s run took 19 s
# with the cache warm); the pytest workers themselves don't use the cache (below). JAX's persistent cache keys an
# entry by the program and its compile options, so a hit is the executable a fresh compile would give (the resume
# test compares runs compiled and loaded either way). The folder is made once per test run (every subprocess
# inherits the variable) and removed by the process that made it. A size limit turns on the cache's file lock,
# which concurrent subprocesses need (without it a reader can see a half-written entry).
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache = os.environ["JAX_COMPILATION_CACHE_DIR"] = tempfile.mkdtemp(prefix="rlkit-test-jax-cache-")
  atexit.register(shutil.rmtree, _cache, ignore_errors=True)
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.3")
os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(4 << 30))

# Most of XLA's optimisation passes off for the whole run (and its subprocesses): nearly every test compiles
# small programs, and the passes are about half of each compile. A comparison between two programs compiles
# both alike either way. Tests about the optimised program itself (its memory analysis) compile under
# `tests.fast_compile.optimized()`.
os.environ.setdefault("JAX_DISABLE_MOST_OPTIMIZATIONS", "1")

import jax  # noqa: E402
import pytest  # noqa: E402

jax.config.update("jax_default_matmul_precision", "highest")
# The persistent cache serves the subprocesses (launch.py runs) only, not the long-lived pytest-xdist workers: a
# worker that had loaded thousands of executables (many written by the other worker) segfaulted in libgcc's
# unwinder on a C++ exception (gdb on the core: _Unwind_Find_FDE under __cxa_throw, there thrown by a failed
# `executable.serialize()` on a cache write; three full runs of three crashed, at different tests, 93-97% of the
# way). jaxlib throws C++ exceptions routinely (nanobind's stop_iteration ends every DeviceList iteration), so
# what matters is the unwinder's stale state, which loading or keeping many executables makes likelier: an
# in-memory memo of compiled executables (no serialization) crashed the same way at 53% of a run. A worker's
# own programs repeat through JAX's in-memory caches only.
jax.config.update("jax_enable_compilation_cache", False)


# pytest-xdist hands each worker whole files (--dist loadfile), in collection order (--no-loadscope-reorder in
# pytest.ini: its default reorder sends files with the most tests first, which left the one-test files that take a
# minute, the main job and multi-host, to run alone at the end). The longest files go first, the rest keep their
# order, so what remains at the end is short. The order is that of each file's measured total in a default run
# (2-core Xeon, 4 Dec 2026, the workers without the persistent cache; `--junitxml` gives the times); a file
# missing from the list only loses its place.
LONGEST_FIRST = (
    "tests/train/test_launch.py", "tests/train/test_stages.py", "tests/train/test_main_job.py",
    "tests/train/test_steps.py", "tests/embodied/test_bc_stage.py", "tests/diffusion/test_gen_stages.py",
    "tests/embodied/test_acob_stage.py", "tests/train/test_multihost.py", "tests/train/test_early_stop.py",
    "tests/optim/test_frozen.py", "tests/quant/test_quantizers.py", "tests/train/test_real_paths.py",
    "tests/train/test_weight_sync.py", "tests/embodied/test_accrue_stage.py", "tests/train/test_async_collect.py",
    "tests/optim/test_logra_training.py", "tests/diffusion/test_art.py", "tests/embodied/test_expert_source.py",
    "tests/diffusion/test_gen_methods.py", "tests/rollout/test_resumable_sampler.py",
    "tests/parallel/test_rules.py", "tests/test_adding_a_method.py", "tests/kernels/test_cpu_attention.py",
    "tests/envs/test_control_envs.py", "tests/models/test_transformer.py", "tests/rollout/test_sampler.py",
    "tests/experiments/test_base_build.py", "tests/objectives/test_correction.py",
    "tests/train/test_stage_switches.py", "tests/train/test_multi_turn_stage.py",
)


def pytest_collection_modifyitems(config, items):
  rank = {path: i for i, path in enumerate(LONGEST_FIRST)}
  items.sort(key=lambda item: rank.get(item.location[0], len(rank)))    # stable: the rest keep their order
  for item in items:   # pytest.ini's per-test timeout guards the default run; experiment-sized runs take longer
    if item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
      item.add_marker(pytest.mark.timeout(0))


@pytest.fixture(autouse=True, scope="module")
def _free_compiled_programs():
  """Drops JAX's compiled programs and traces after each test file. A worker otherwise keeps every executable of
  every file it ran: in a default run (2-core EPYC) a worker grew to 6.4 GB and the machine to 13.0 GB in use;
  with this, 2.2 GB and 4.6 GB, in the same time (609 s vs 600-613 s): files share few programs."""
  yield
  jax.clear_caches()
  gc.collect()
