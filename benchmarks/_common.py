"""Shared pieces of the benchmark scripts: the model sizes, the commit, the CPU (model, instruction set,
cores) every JSON line names, the `--tuned-malloc` option, interleaved median timing and the matmul peak.

Not a benchmark itself; imported by `benchmarks/sampler.py`, `benchmarks/forward.py` and
`benchmarks/rl_step.py` (each script puts the repository root on `sys.path` first).
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import subprocess
import time
from typing import Callable

import jax
import jax.numpy as jnp

from rlkit.models.transformer import TransformerConfig
from rlkit.parallel.host_memory import reexec_with_tuned_malloc
from rlkit.parallel.mesh import usable_cores

SIZES = {
    "S": TransformerConfig(vocab_size=512, hidden_size=128, intermediate_size=384, num_layers=2, num_heads=4,
                           num_kv_heads=2, head_dim=32, rope_theta=10_000.0),
    "M": TransformerConfig(vocab_size=4096, hidden_size=512, intermediate_size=1536, num_layers=8, num_heads=8,
                           num_kv_heads=4, head_dim=64, rope_theta=10_000.0),
}


def commit() -> str:
  try:
    return subprocess.check_output(["git", "rev-parse", "--short", "HEAD"], text=True,
                                   cwd=os.path.dirname(os.path.abspath(__file__))).strip()
  except Exception:  # not a git checkout: the JSON still says so
    return "unknown"


# Flags named beside "avx512" where the CPU has them: the ones this project's bf16 and matmul figures turn on.
_WIDE_EXTRAS = ("avx512_bf16", "amx_bf16", "amx_tile", "amx_int8")


def isa_summary(flags) -> str:
  """The vector instruction set of a CPU with these /proc/cpuinfo flags: "avx512" (then the extras it has in
  parentheses, e.g. "avx512 (avx512_bf16)"), "avx2", "sse" (x86 without AVX2), "sve" or "neon" (Arm's
  "Features"), else "unknown"."""
  flags = set(flags)
  if "avx512f" in flags:
    extras = [f for f in _WIDE_EXTRAS if f in flags]
    return "avx512" + (f" ({', '.join(extras)})" if extras else "")
  if "avx2" in flags:
    return "avx2"
  if flags & {"sse", "sse2"}:
    return "sse"
  if "sve" in flags:
    return "sve"
  if flags & {"asimd", "neon"}:
    return "neon"
  return "unknown"


def cpu_info(cpuinfo: str | None = None) -> dict:
  """The CPU the benchmark ran on, for its JSON line: `cpu` (the model name of /proc/cpuinfo, else
  `platform.processor()`), `cpu_isa` (`isa_summary` of its flags) and `cpu_cores` (the cores this process
  may run on). `cpuinfo`: that file's text (default: read it; absent, e.g. not on Linux, gives no flags)."""
  if cpuinfo is None:
    try:
      with open("/proc/cpuinfo") as f:
        cpuinfo = f.read()
    except OSError:
      cpuinfo = ""
  fields = {}
  for line in cpuinfo.splitlines():
    key, sep, value = line.partition(":")
    if sep:
      fields.setdefault(key.strip(), value.strip())      # the first processor's
  flags = (fields.get("flags") or fields.get("Features") or "").split()
  return {"cpu": fields.get("model name") or platform.processor() or platform.machine() or "unknown",
          "cpu_isa": isa_summary(flags), "cpu_cores": usable_cores()}


def add_tuned_malloc_arg(parser: argparse.ArgumentParser) -> None:
  """`--tuned-malloc`: rerun the script with glibc malloc tuned for large XLA:CPU steps (the JSON lines
  record `tuned_malloc`). Both sides of a comparison run in the one process, so both get it."""
  parser.add_argument("--tuned-malloc", action="store_true",
                      help="rerun with rlkit.parallel.host_memory's glibc settings (Linux with glibc only)")


def apply_tuned_malloc_arg(args: argparse.Namespace) -> None:
  if args.tuned_malloc:
    reexec_with_tuned_malloc()


def interleaved_median_times(fns: dict[str, Callable[[], object]], reps: int) -> dict[str, float]:
  """Median wall seconds of each `fn()` over `reps` rounds, the sides taking turns within each round.

  Each round runs every function twice in a row and times the second call, rotating the order between
  rounds. Taking turns makes all sides see the same spells of a noisy machine (on the shared 2-core CPU
  the same step varies by 30% from minute to minute). The untimed first call absorbs the switch: a JAX
  train step timed right after a PyTorch step ran 10-75% slower than in a run of its own.
  """
  names, times = list(fns), {name: [] for name in fns}
  for r in range(reps):
    for name in names[r % len(names):] + names[:r % len(names)]:
      fns[name]()
      t0 = time.perf_counter()
      fns[name]()
      times[name].append(time.perf_counter() - t0)
  return {name: statistics.median(ts) for name, ts in times.items()}


def matmul_fn(dtype, n: int = 2048) -> tuple[Callable[[], object], float]:
  """A large jitted `n x n` matmul (bf16 inputs accumulate in f32) and its FLOPs: the peak to time beside
  the code under test, so both see the same spell of the machine."""
  a = jax.random.normal(jax.random.key(0), (n, n)).astype(dtype)
  f = jax.jit(lambda x, y: jnp.dot(x, y, preferred_element_type=jnp.float32))
  return (lambda: f(a, a).block_until_ready()), 2.0 * n ** 3


def torch_train_step(model, tokens, bf16: bool, lr: float, weight_decay: float):
  """The torch peer of an update: `run()` does one eager forward with the `labels=` next-token loss, backward
  and a fused AdamW step on `model` (f32 weights; bf16: under `torch.autocast`); `losses` collects each
  step's loss. Shared by rl_step.py and real_size.py so both time the same peer."""
  import contextlib

  import torch
  opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=weight_decay, fused=True)
  ids = torch.tensor(tokens, dtype=torch.long)
  losses = []

  def run():
    with torch.autocast("cpu", dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
      loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    losses.append(loss.detach().item())
  return run, losses
