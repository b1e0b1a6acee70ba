"""Causal/masked softmax attention for XLA:CPU as a C++ kernel (`kernels/cpu/attention.cc`) behind the XLA FFI.

`cpu_attention(q, k, v, allowed, causal)` computes

    o = softmax(mask(q k^T / sqrt(hd))) v      over grouped query heads, float32 scores

with a `jax.custom_vjp` whose backward pass is a second kernel (FlashAttention's: probabilities recomputed
from the saved log-sum-exp, ds = p * (dp - rowsum(do * o))).

Why C++ rather than Pallas: Pallas only interprets on CPU. XLA:CPU itself runs attention's many small batched
products through per-product Eigen calls at 60-130 GFLOP/s (the model's weight matmuls: 290-345), with the
scores written to memory between fusions. The kernel keeps one (batch row, KV head) pair's scores in L2 and
runs its products through one register-blocked micro-kernel at 150-200 GFLOP/s per core. M size, 8 x 256
tokens, one layer's forward plus backward: about 2.5x faster than `attend` (see `benchmarks/README.md`).

Building: the first call compiles the source with the C++ compiler (`$CXX`, default `g++`, flags
`-O3 -march=native`) into `$RLKIT_KERNEL_CACHE` (default `~/.cache/rlkit/kernels`), keyed by a hash of the
source, the flags, jaxlib's version and this CPU's feature flags; the library appears there by an atomic
rename, so concurrent builds cannot leave a half-written file. Without a compiler the call raises, naming
the fix (install g++, or use `model.attention = "xla"`). Nothing falls back silently.

Layouts are the model's own, so that XLA transposes nothing around the call: q [B, T, KV, G, hd], k and v
[B, S, KV, hd], allowed [B, T, S] bool; o [B, T, KV, G, hd] float32. Any float dtype in; the kernel computes in float32 and returns gradients in the
inputs' dtypes. hd must be a multiple of 16. `causal=True` promises query t never attends past slot t
(self-attention over one sequence, S == T) and skips the score blocks above the diagonal. A query row with no
allowed key is uniform over the keys it considers (all S; slots <= t when causal) and passes no gradient to
q or k. Under a multi-device mesh (`jax.set_mesh`) the call runs per device through `jax.shard_map`: the
batch split over ("data", "fsdp") and the KV heads over "tensor", as `rlkit.parallel.rules` lays them out.

`cpu_attention_reference` is the spec (plain jnp, the same maths as `rlkit.models.attention.attend` with one
block); tests compare the two.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import math
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from jax.sharding import PartitionSpec as P

from rlkit.parallel.mesh import BATCH_AXES

Array = jax.Array

SOURCE = Path(__file__).parent / "cpu" / "attention.cc"
FLAGS = ("-O3", "-march=native", "-std=c++17", "-shared", "-fPIC")
_FWD, _BWD = "rlkit_cpu_attention_fwd", "rlkit_cpu_attention_bwd"


def _cpu_flags() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next((line for line in f if line.startswith("flags")), "")
  except OSError:
    return ""


def library_path() -> Path:
  """The compiled kernel library, built on first use (see the module docstring)."""
  cxx = os.environ.get("CXX", "g++")
  source = SOURCE.read_bytes()
  key = hashlib.sha256(b"\0".join([source, cxx.encode(), " ".join(FLAGS).encode(),
                                   jaxlib.__version__.encode(), _cpu_flags().encode()])).hexdigest()[:16]
  cache = Path(os.environ.get("RLKIT_KERNEL_CACHE", Path.home() / ".cache" / "rlkit" / "kernels"))
  lib = cache / f"attention-{key}.so"
  if lib.exists():
    return lib
  if shutil.which(cxx) is None:
    raise RuntimeError(f"model.attention='cpu_kernel' builds {SOURCE} with a C++ compiler, and {cxx!r} was "
                       f"not found. Install g++ (or set $CXX), or use model.attention='xla'.")
  cache.mkdir(parents=True, exist_ok=True)
  with tempfile.TemporaryDirectory(dir=cache) as tmp:
    out = Path(tmp) / lib.name
    cmd = [cxx, *FLAGS, "-isystem", jax.ffi.include_dir(), str(SOURCE), "-o", str(out)]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode:
      raise RuntimeError(f"Building the CPU attention kernel failed ({' '.join(cmd)}):\n{done.stderr[-4000:]}\n"
                         f"Use model.attention='xla' to run without it.")
    os.replace(out, lib)                 # atomic: readers see the whole library or none
  return lib


@functools.cache
def _register() -> None:
  lib = ctypes.cdll.LoadLibrary(str(library_path()))
  jax.ffi.register_ffi_target(_FWD, jax.ffi.pycapsule(lib.RlkitAttentionForward), platform="cpu")
  jax.ffi.register_ffi_target(_BWD, jax.ffi.pycapsule(lib.RlkitAttentionBackward), platform="cpu")


def _check(q: Array, k: Array, v: Array, allowed: Array, causal: bool) -> None:
  b, t, kvh, _, hd = q.shape
  s = k.shape[1]
  if k.shape != (b, s, kvh, hd) or v.shape != k.shape or allowed.shape != (b, t, s):
    raise ValueError(f"cpu_attention: q {q.shape}, k {k.shape}, v {v.shape} and allowed {allowed.shape} do not "
                     f"fit q [B, T, KV, G, hd], k, v [B, S, KV, hd], allowed [B, T, S].")
  if hd % 16:
    raise ValueError(f"cpu_attention: head_dim {hd} is not a multiple of 16; use model.attention='xla'.")
  if causal and s != t:
    raise ValueError(f"cpu_attention: causal=True needs S == T (self-attention), got S={s}, T={t}.")


def _per_device(fn, n_in: int, n_out: int, kv_heads: int, batch: int):
  """fn on one device; under a multi-device mesh, fn on each device's shard (`jax.shard_map`): the batch
  (axis 0 of every operand) over the batch axes and the KV heads (axis 2) over "tensor", each only where
  the mesh has the axis and its size divides. The mask (the last input) has no head axis."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return fn
  names = dict(zip(mesh.axis_names, mesh.axis_sizes))
  rows = tuple(a for a in BATCH_AXES if names.get(a, 1) > 1)
  rows = rows if rows and batch % math.prod(names[a] for a in rows) == 0 else None
  heads = "tensor" if names.get("tensor", 1) > 1 and kv_heads % names["tensor"] == 0 else None
  split = P(rows, None, heads)
  return jax.shard_map(fn, in_specs=(split,) * (n_in - 1) + (P(rows),), out_specs=(split,) * n_out)


def _forward(q, k, v, allowed, causal):
  _register()

  def call(q, k, v, allowed):
    b, t, kvh, g, _ = q.shape
    return jax.ffi.ffi_call(_FWD, (jax.ShapeDtypeStruct(q.shape, jnp.float32),
                                   jax.ShapeDtypeStruct((b, kvh, g, t), jnp.float32)))(
        q, k, v, allowed, causal=np.int32(causal))

  # lse [B, KV, G, T] has its heads on axis 1: moved to axis 2 for the shard_map specs and back.
  def call_split(q, k, v, allowed):
    o, lse = call(q, k, v, allowed)
    return o, lse.transpose(0, 2, 1, 3)

  f = _per_device(call_split, 4, 2, q.shape[2], q.shape[0])
  f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
  o, lse = f(f32(q), f32(k), f32(v), allowed.astype(jnp.uint8))
  return o, lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def cpu_attention(q: Array, k: Array, v: Array, allowed: Array, causal: bool = False) -> Array:
  """Masked softmax attention output [B, T, KV, G, hd] (float32); see the module docstring."""
  _check(q, k, v, allowed, causal)
  return _forward(q, k, v, allowed, causal)[0]


def _fwd(q, k, v, allowed, causal):
  _check(q, k, v, allowed, causal)
  o, lse = _forward(q, k, v, allowed, causal)
  return o, (q, k, v, allowed, o, lse)


def _bwd(causal, res, do):
  q, k, v, allowed, o, lse = res

  def call(q, k, v, o, lse, do, allowed):
    shapes = tuple(jax.ShapeDtypeStruct(x.shape, jnp.float32) for x in (q, k, v))
    return jax.ffi.ffi_call(_BWD, shapes)(q, k, v, allowed, o, lse.transpose(0, 2, 1, 3), do,
                                          causal=np.int32(causal))

  f = _per_device(call, 7, 3, q.shape[2], q.shape[0])
  f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
  dq, dk, dv = f(f32(q), f32(k), f32(v), o, lse, f32(do), allowed.astype(jnp.uint8))
  return dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), None


cpu_attention.defvjp(_fwd, _bwd)


def cpu_attention_reference(q: Array, k: Array, v: Array, allowed: Array) -> Array:
  """The spec: float32 softmax of q k^T / sqrt(hd) with float32's minimum on disallowed slots (a row with
  none allowed is uniform over all S), times v. Same layouts as `cpu_attention`."""
  f32 = lambda x: x.astype(jnp.float32)  # noqa: E731
  scores = jnp.einsum("btkgh,bskh->bkgts", f32(q), f32(k)) / math.sqrt(q.shape[-1])
  scores = jnp.where(allowed[:, None, None], scores, jnp.finfo(jnp.float32).min)
  return jnp.einsum("bkgts,bskh->btkgh", jax.nn.softmax(scores, axis=-1), f32(v))
