"""Test-wide setup: 8 simulated CPU devices (for mesh tests), float32 matmuls at full precision, one
persistent compilation cache for the whole run, and XLA's optimisation passes off (but where a test turns them
on, `tests.fast_compile.optimized()`)."""
import atexit
import os
import shutil
import tempfile

# Must be set before jax initialises its backend; harmless for single-device tests.
os.environ.setdefault("XLA_FLAGS", "--xla_force_host_platform_device_count=8")
os.environ.setdefault("WANDB_MODE", "disabled")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

# Many tests compile the same programs: every `launch.py` subprocess of the test preset compiles the main
# job's steps afresh (a 32 s run took 19 s with the cache warm), and in-process tests rebuild identical
# models. JAX's persistent cache keys an entry by the program and its compile options, so a hit is the
# executable a fresh compile would give (the resume test compares runs compiled and loaded either way). The
# folder is made once per test run (pytest-xdist's workers and every subprocess inherit the variable) and
# removed by the process that made it. A size limit turns on the cache's file lock, which the concurrent
# workers need (without it a reader can see a half-written entry).
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

jax.config.update("jax_default_matmul_precision", "highest")
