"""Qwen3 self-attention for XLA:CPU as a C++ kernel (`kernels/cpu/attention.cc`) behind the XLA FFI.

`cpu_attention(qkv, allowed, cos, sin, norm_scales, eps, causal)` takes the fused q/k/v projection as the
model's matmul writes it, [B, T, KV, G + 2, hd] (G query heads, then the key and the value of each KV head),
and computes, in float32,

    q, k = rope(norm(q)), rope(norm(k))         norm: per-head RMSNorm times its scale (Qwen3; skipped when
                                                norm_scales is None, as in Qwen2/Llama); rope: rotate-half
    o = softmax(mask(q k^T / sqrt(hd))) v       [B, T, KV, G, hd]

with a `jax.custom_vjp` whose backward pass is a second kernel (FlashAttention's: probabilities recomputed from
the saved log-sum-exp, ds = p * (dp - rowsum(do * o))), returning the gradients of qkv and of the norm scales.
`cpu_attention_reference` is the spec in plain jnp (the maths of `rlkit.models.transformer.Attention`'s XLA
path); tests compare the two.

Why C++ rather than Pallas: Pallas only interprets on CPU. XLA:CPU itself runs attention's many small batched
products through per-product calls at 60-130 GFLOP/s (the model's weight matmuls: 290-345), with the scores
written to memory between fusions, and it spends separate passes over q and k on the slices, the norm and the
rope (about 60 ms of the M train step's forward). The kernel takes one (batch row, KV head) pair at a time:
it normalises and rotates that pair's rows into L1-sized scratch, keeps its scores in L2, and runs its
products through one register-blocked micro-kernel, its vector width chosen when it is compiled: 16 floats
and a 6 x 64 block with AVX-512, 8 floats and a 6 x 16 block with AVX2 only (`vector_lanes()`). M train step
(8 x 256 tokens, f32, `--tuned-malloc`) against the XLA path: 1.08x-1.10x on a 2-core Intel Xeon with AVX-512,
150-200 GFLOP/s per core in the products (`benchmarks/README.md`); 1.08x (bf16 compute: 1.16x) on a 2-core
AMD EPYC with AVX2 only (`benchmarks/rl_step.py --tuned-malloc`), where the attention's forward + backward
alone ran 3.4x faster than XLA's. (Before the AVX2 shapes, the AVX-512 ones compiled for AVX2 spilled their
48 ymm accumulators: 0.78x the XLA path on that EPYC, bf16 0.89x.)

Building: the first call compiles the source with the C++ compiler (`$CXX`, default `g++`, flags
`-O3 -march=native`) into `$RLKIT_KERNEL_CACHE` (default `~/.cache/rlkit/kernels`), keyed by a hash of the
source, the flags, jaxlib's version and this CPU's feature flags; the library appears there by an atomic
rename, so concurrent builds cannot leave a half-written file. Without a compiler the call raises, naming
the fix (install g++, or use `model.attention = "xla"`). Nothing falls back silently.

Inputs of any float dtype are computed in float32; the gradients come back in the inputs' dtypes. hd must be
a multiple of 32. `allowed` [B, T, T] bool says which key slot each query may attend to; `causal=True`
promises that query t never attends past slot t, and the products skip the score blocks above the
diagonal. A query with no allowed key is uniform over the keys it considers (all T; slots <= t when causal)
and passes no gradient to q or k. Under a multi-device mesh (`jax.set_mesh`) the call runs per device through
`jax.shard_map`: the batch split over ("data", "fsdp") and the KV heads over "tensor", as
`rlkit.parallel.rules` lays them out.
"""
from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Optional

import jax
import jax.numpy as jnp
import jaxlib
import numpy as np
from jax.sharding import PartitionSpec as P

from rlkit.parallel.mesh import BATCH_AXES
from rlkit.parallel.rules import fit_spec

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


def compiler() -> str:
  """The C++ compiler the kernel builds with: `$CXX`, default `g++`."""
  return os.environ.get("CXX", "g++")


def find_compiler() -> Optional[str]:
  """The path of `compiler()` (looked up on `$PATH` unless it is a path), or None where there is none.

  Tests and CI use it to skip, or to install g++, where the toolchain is absent."""
  return shutil.which(compiler())


def library_path() -> Path:
  """The compiled kernel library, built on first use (see the module docstring)."""
  cxx = compiler()
  source = SOURCE.read_bytes()
  key = hashlib.sha256(b"\0".join([source, cxx.encode(), " ".join(FLAGS).encode(),
                                   jaxlib.__version__.encode(), _cpu_flags().encode()])).hexdigest()[:16]
  cache = Path(os.environ.get("RLKIT_KERNEL_CACHE", Path.home() / ".cache" / "rlkit" / "kernels"))
  lib = cache / f"attention-{key}.so"
  if lib.exists():
    return lib
  if find_compiler() is None:
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


def vector_lanes() -> int:
  """Floats per vector in the kernel as built for this CPU (building it if needed): 16 where the compiler
  targets AVX-512 (`-march=native` defines `__AVX512F__`), else 8."""
  return int(ctypes.cdll.LoadLibrary(str(library_path())).RlkitAttentionLanes())


@functools.cache
def _register() -> None:
  lib = ctypes.cdll.LoadLibrary(str(library_path()))
  jax.ffi.register_ffi_target(_FWD, jax.ffi.pycapsule(lib.RlkitAttentionForward), platform="cpu")
  jax.ffi.register_ffi_target(_BWD, jax.ffi.pycapsule(lib.RlkitAttentionBackward), platform="cpu")


def _check(qkv: Array, allowed: Array, cos: Array, sin: Array, norm_scales) -> None:
  if jax.default_backend() != "cpu":
    raise ValueError(f"cpu_attention (model.attention='cpu_kernel') is a kernel for XLA:CPU, and this JAX runs "
                     f"on {jax.default_backend()}; use model.attention='xla'.")
  if qkv.ndim != 5 or qkv.shape[3] < 3:
    raise ValueError(f"cpu_attention: qkv {qkv.shape} is not [B, T, KV, G + 2, hd] (G >= 1 query heads, then "
                     f"the key and the value of each KV head).")
  b, t, _, _, hd = qkv.shape
  if hd % 32:
    raise ValueError(f"cpu_attention: head_dim {hd} is not a multiple of 32; use model.attention='xla'.")
  if allowed.shape != (b, t, t) or cos.shape != (b, t, hd) or sin.shape != cos.shape:
    raise ValueError(f"cpu_attention: allowed {allowed.shape}, cos {cos.shape} and sin {sin.shape} do not fit "
                     f"qkv {qkv.shape}: expected allowed [B, T, T] and rope tables [B, T, hd].")
  if norm_scales is not None and any(x.shape != (hd,) for x in norm_scales):
    raise ValueError(f"cpu_attention: norm scales {[x.shape for x in norm_scales]} are not [hd] = [{hd}].")


def _per_device(fn, specs_in, specs_out):
  """fn on one device; under a multi-device mesh, fn on each device's shard (`jax.shard_map`). The specs
  are functions of (rows, heads): the batch axes' names, or None, and "tensor", or None."""
  mesh = jax.sharding.get_abstract_mesh()
  if mesh.empty or mesh.size == 1:
    return fn
  return lambda *a: _sharded(fn, specs_in, specs_out, mesh, a)


def _sharded(fn, specs_in, specs_out, mesh, args):
  """qkv's layout under the default partition rules decides: the batch (axis 0) over the batch axes and the
  KV heads (axis 2) over "tensor", each only where the mesh can split it evenly (`fit_spec`)."""
  rows, _, heads = fit_spec(P(BATCH_AXES, None, "tensor"), args[0].shape[:3], mesh, "cpu_attention qkv")
  return jax.shard_map(fn, in_specs=tuple(f(rows, heads) for f in specs_in),
                       out_specs=tuple(f(rows, heads) for f in specs_out))(*args)


# shard_map specs, as functions of (rows, heads), of the kernels' operands.
_HEADS = lambda r, h: P(r, None, h)       # noqa: E731  qkv, o, do, dqkv: [B, T, KV, ...]
_ROWS = lambda r, h: P(r)                 # noqa: E731  allowed, cos, sin: [B, T, ...]
_PAIRS = lambda r, h: P(r, h)             # noqa: E731  lse [B, KV, G, T], scale parts [B, KV, hd]
_SAME = lambda r, h: P()                  # noqa: E731  norm scales [hd]


def _operands(qkv, allowed, cos, sin, norm_scales):
  hd = qkv.shape[-1]
  f32 = lambda x: jnp.asarray(x, jnp.float32)  # noqa: E731
  scales = norm_scales if norm_scales is not None else (jnp.ones(hd), jnp.ones(hd))
  return (f32(qkv), f32(scales[0]), f32(scales[1]), f32(cos), f32(sin), allowed.astype(jnp.uint8))


def _attrs(causal, norm_scales, eps):
  return dict(causal=np.int32(causal), qk_norm=np.int32(norm_scales is not None), eps=np.float32(eps))


def _forward(qkv, allowed, cos, sin, norm_scales, eps, causal):
  _register()
  t, g2, hd = qkv.shape[1], qkv.shape[3], qkv.shape[4]

  def call(*operands):
    shapes = (jax.ShapeDtypeStruct(operands[0].shape[:3] + (g2 - 2, hd), jnp.float32),
              jax.ShapeDtypeStruct((operands[0].shape[0], operands[0].shape[2], g2 - 2, t), jnp.float32))
    return jax.ffi.ffi_call(_FWD, shapes)(*operands, **_attrs(causal, norm_scales, eps))

  f = _per_device(call, (_HEADS, _SAME, _SAME, _ROWS, _ROWS, _ROWS), (_HEADS, _PAIRS))
  return f(*_operands(qkv, allowed, cos, sin, norm_scales))


@functools.partial(jax.custom_vjp, nondiff_argnums=(5, 6))
def cpu_attention(qkv: Array, allowed: Array, cos: Array, sin: Array, norm_scales, eps: float = 1e-6,
                  causal: bool = False) -> Array:
  """Attention output [B, T, KV, G, hd] (float32) of the fused projection qkv; see the module docstring.

  norm_scales: (q_scale, k_scale), each [hd], for Qwen3's per-head RMSNorm; None: no norm (Qwen2/Llama).
  """
  _check(qkv, allowed, cos, sin, norm_scales)
  return _forward(qkv, allowed, cos, sin, norm_scales, eps, causal)[0]


def _fwd(qkv, allowed, cos, sin, norm_scales, eps, causal):
  _check(qkv, allowed, cos, sin, norm_scales)
  o, lse = _forward(qkv, allowed, cos, sin, norm_scales, eps, causal)
  return o, (qkv, allowed, cos, sin, norm_scales, o, lse)


def _bwd(eps, causal, res, do):
  qkv, allowed, cos, sin, norm_scales, o, lse = res

  def call(*operands):
    q = operands[0]
    pairs = jax.ShapeDtypeStruct((q.shape[0], q.shape[2], q.shape[-1]), jnp.float32)
    shapes = (jax.ShapeDtypeStruct(q.shape, jnp.float32), pairs, pairs)
    return jax.ffi.ffi_call(_BWD, shapes)(*operands, **_attrs(causal, norm_scales, eps))

  specs_in = (_HEADS, _SAME, _SAME, _ROWS, _ROWS, _ROWS, _HEADS, _PAIRS, _HEADS)
  f = _per_device(call, specs_in, (_HEADS, _PAIRS, _PAIRS))
  dqkv, dq_scale, dk_scale = f(*_operands(qkv, allowed, cos, sin, norm_scales), o, lse,
                               do.astype(jnp.float32))
  d_scales = None
  if norm_scales is not None:
    d_scales = tuple(d.sum((0, 1)).astype(x.dtype) for d, x in zip((dq_scale, dk_scale), norm_scales))
  return dqkv.astype(qkv.dtype), None, None, None, d_scales


cpu_attention.defvjp(_fwd, _bwd)


def cpu_attention_reference(qkv: Array, allowed: Array, cos: Array, sin: Array, norm_scales,
                            eps: float = 1e-6) -> Array:
  """The spec, in float32, from the model's own pieces: q, k = rope(norm(q)), rope(norm(k)) (norm: RMSNorm
  times its scale, skipped when norm_scales is None; `transformer.rope`), then `attention.masked_probs`
  (float32's minimum on disallowed slots: a row with none allowed is uniform over all T) times v."""
  from rlkit.models.attention import masked_probs
  from rlkit.models.layers import rope
  qkv = qkv.astype(jnp.float32)
  b, t, kvh, g2, hd = qkv.shape
  g = g2 - 2
  cos, sin = cos.astype(jnp.float32), sin.astype(jnp.float32)

  def prep(x, scale):
    if norm_scales is not None:
      x = x * jax.lax.rsqrt(jnp.mean(x * x, axis=-1, keepdims=True) + eps) * scale.astype(jnp.float32)
    return rope(x, cos, sin)

  scales = norm_scales if norm_scales is not None else (None, None)
  q, k, v = prep(qkv[:, :, :, :g], scales[0]), prep(qkv[:, :, :, g], scales[1]), qkv[:, :, :, g + 1]
  scores = jnp.einsum("btkgh,bskh->bktgs", q, k).reshape(b, kvh, t * g, t)     # rows (t, g)
  probs = masked_probs(scores, allowed, g, hd).reshape(b, kvh, t, g, t)
  return jnp.einsum("bktgs,bskh->btkgh", probs, v)
