"""Opt-in glibc malloc settings for large XLA:CPU steps: freed memory is kept, on transparent huge pages.

Why: XLA:CPU allocates an executable's temporary buffer at every call (1.35 GB for the M-size train step of
the benchmarks, batch 8 x 256), and glibc serves allocations that large with mmap and unmaps them on free.
Every step then faults all of those pages in again: about 400k page faults and 0.7 s of kernel time per M
train step on the 2-core benchmark machine. With `TUNABLES` glibc serves every allocation from one heap (one
arena, no mmap), never trims it, and backs it with transparent huge pages. After the first step there are no
page faults, and the big matmuls miss the TLB less. Measured (benchmarks/README.md): the M train step about
1.15x faster. The main job's RL iteration, whose model is small, did not gain: its generation ran about 15%
slower and its update about 12% faster. So this is off by default: `launch.py --tuned_malloc` and the
benchmarks' `--tuned-malloc` turn it on.

glibc reads GLIBC_TUNABLES only when a process starts, hence `reexec_with_tuned_malloc`: it runs the same
command again with the variable set, before any work is done. The cost: the process keeps its peak memory.
Needs Linux with glibc (huge pages from glibc 2.35; older versions ignore that setting).
"""
from __future__ import annotations

import os
import platform
import sys

TUNABLES = ("glibc.malloc.hugetlb=1:glibc.malloc.mmap_max=0:glibc.malloc.trim_threshold=4000000000:"
            "glibc.malloc.arena_max=1")


def tuned_malloc_active() -> bool:
  """Whether this process started with `TUNABLES`."""
  return os.environ.get("GLIBC_TUNABLES") == TUNABLES


def reexec_with_tuned_malloc() -> None:
  """Runs this same command again with GLIBC_TUNABLES=`TUNABLES`; returns at once if it already has them.

  Call it first thing: the process is replaced (same pid, arguments and environment plus the variable), so
  nothing done before the call survives except what the command does again.
  """
  current = os.environ.get("GLIBC_TUNABLES")
  if current == TUNABLES:
    return
  if current:
    raise RuntimeError(f"GLIBC_TUNABLES={current!r} is already set, so the tuned malloc would override it. "
                       "Unset it, or drop --tuned_malloc and keep your own settings.")
  libc = platform.libc_ver()[0]
  if sys.platform != "linux" or libc != "glibc":
    raise RuntimeError(f"--tuned_malloc needs Linux with glibc (this is {sys.platform}, libc "
                       f"{libc or 'unknown'}); run without it.")
  sys.stdout.flush()
  sys.stderr.flush()
  os.execve(sys.executable, [sys.executable] + sys.orig_argv[1:], dict(os.environ, GLIBC_TUNABLES=TUNABLES))
