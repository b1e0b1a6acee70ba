"""The FP4 weight-only matmul kernel against a bf16 `jnp.dot` at decode shapes: one JSON line per shape.

  python benchmarks/fp4_matmul.py [--m 1,4,16,64] [--k 8192] [--n 8192] [--fmt nvfp4] [--repeats 7]
                                  [--bn 64,128] [--split_k 1,4] [--copies 16]

Sides, timed in interleaved rounds (`_common.interleaved_median_times`, medians): `fp4` =
`kernels.fp4_matmul.fp4_matmul` (Pallas: compiled on GPU; elsewhere *interpreted*, which the JSON says in
`pallas_mode`, so its CPU numbers measure the interpreter, not the kernel), `reference` =
`fp4_matmul_reference` (the dequantize-then-dot spec, jnp) and `bf16` = `jnp.dot` of bf16 x and a bf16 W of the
same values (f32 accumulation). Each line checks the kernel against the reference first (a benchmark of a wrong
kernel measures nothing) and reports `max_rel_err`. One timed call multiplies x by `--copies` distinct W (16 on
a GPU: 16 FP4 copies of 8192 x 8192 are ~600 MB, far past the 60 MB L2, and one dispatch carries 16 products);
the times are per product. `--bn` and `--split_k` take lists: one line per tile configuration.

Bytes per call (`*_gbps`, achieved GB/s): W's bytes (FP4 codes K*N/2 plus one scale byte per block; bf16 2*K*N)
plus x and y. At M <= 16 the product is memory-bound, so W's bytes bound the speed: the FP4/bf16 ceiling is
2*K*N / (K*N/2 + K*N/B), about 3.6x for NVFP4 (B = 16) and 3.8x for MXFP4 (B = 32). The issue's target: at
least 3x bf16 at M <= 16 on a GPU. On the CPU the default sizes are small (interpretation is slow).
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks._common import commit, cpu_info, interleaved_median_times  # noqa: E402
import kernels.fp4_matmul as kernel_module  # noqa: E402
from kernels.fp4_matmul import FP4MatmulBlocks, fp4_matmul, fp4_matmul_reference  # noqa: E402
from rlkit.quant import fp4  # noqa: E402


def one_shape(m: int, k: int, n: int, fmt: str, repeats: int, copies: int, blocks: FP4MatmulBlocks,
              interpret: bool) -> dict:
  rng = np.random.default_rng(m)
  x = jnp.asarray(rng.standard_normal((m, k)), jnp.bfloat16)
  quantize = jax.jit(lambda key: fp4.quantize_blocks(0.02 * jax.random.normal(key, (k, n)), fmt))
  qs = [quantize(key) for key in jax.random.split(jax.random.key(m), copies)]
  w16s = [fp4.dequantize_blocks(q, k).astype(jnp.bfloat16) for q in qs]     # the same values as bf16
  # One timed call multiplies by every copy of W (distinct weights, so that no side runs out of the L2
  # cache, and one dispatch for `copies` products, so that launch overhead does not decide the times).
  over = lambda f: jax.jit(lambda a, ws: sum(f(a, w) for w in ws))           # noqa: E731
  one = lambda a, q: fp4_matmul(a, q, blocks=blocks, interpret=interpret)    # noqa: E731
  kernel, reference = over(one), over(fp4_matmul_reference)
  dense = over(lambda a, b: jnp.dot(a, b, preferred_element_type=jnp.float32))
  got, ref = np.asarray(jax.jit(one)(x, qs[0])), np.asarray(jax.jit(fp4_matmul_reference)(x, qs[0]))
  scale = np.abs(np.asarray(x, np.float32)) @ np.abs(np.asarray(w16s[0], np.float32))
  err = float(np.max(np.abs(got - ref) / np.maximum(scale, 1e-30)))
  assert err < 1e-5, f"kernel differs from its reference (max relative error {err})"
  block = jax.block_until_ready
  t = interleaved_median_times({"fp4": lambda: block(kernel(x, qs)), "reference": lambda: block(reference(x, qs)),
                                "bf16": lambda: block(dense(x, w16s))}, repeats)
  t = {side: s / copies for side, s in t.items()}
  q = qs[0]
  io = 2 * m * k + 4 * m * n
  fp4_bytes = q.codes.size + q.scales.size + io
  bf16_bytes = 2 * k * n + io
  return {"benchmark": "fp4_matmul", "backend": jax.default_backend(), "device": jax.devices()[0].device_kind,
          "pallas_mode": "interpret" if interpret else "compiled", "fmt": fmt, "m": m, "k": k, "n": n,
          "blocks": [blocks.bm, blocks.bn, blocks.bk, blocks.split_k, blocks.num_warps], "copies": copies,
          "repeats": repeats,
          "max_rel_err": err,
          "ms": {side: round(1e3 * s, 4) for side, s in t.items()},
          "fp4_over_bf16_speed": round(t["bf16"] / t["fp4"], 3),
          "fp4_gbps": round(fp4_bytes / t["fp4"] / 1e9, 3), "bf16_gbps": round(bf16_bytes / t["bf16"] / 1e9, 3),
          "byte_ceiling": round(bf16_bytes / fp4_bytes, 3), "commit": commit(), "jax": jax.__version__,
          **cpu_info()}


# Stages left out of the kernel (METHOD: time variants that leave one stage out, take differences): the
# E2M1 decode as a plain cast of the 4-bit codes, the block scales as 1. Their products are wrong by design.
STAGE_PATCHES = {
    "full": {},
    "no_scales": {"_expand_scales": lambda scales, block: jnp.float32(1.0)},
    "no_decode": {"_decode_tile": lambda codes: codes.astype(jnp.float32)},
    "dot_only": {"_expand_scales": lambda scales, block: jnp.float32(1.0),
                 "_decode_tile": lambda codes: codes.astype(jnp.float32)},
}


def stage_times(m: int, k: int, n: int, fmt: str, repeats: int, copies: int, blocks: FP4MatmulBlocks,
                interpret: bool) -> dict:
  """ms per product of the compiled kernel with each of STAGE_PATCHES' stages left out: where its time goes."""
  x = jnp.asarray(np.random.default_rng(m).standard_normal((m, k)), jnp.bfloat16)
  quantize = jax.jit(lambda key: fp4.quantize_blocks(0.02 * jax.random.normal(key, (k, n)), fmt))
  qs = [quantize(key) for key in jax.random.split(jax.random.key(m), copies)]
  fns = {}
  for name, patch in STAGE_PATCHES.items():
    saved = {attr: getattr(kernel_module, attr) for attr in patch}
    for attr, fn in patch.items():
      setattr(kernel_module, attr, fn)
    # A fresh jit of the unjitted function, traced now, while this variant's stages are in place.
    f = jax.jit(lambda a, ws: sum(fp4_matmul.__wrapped__(a, w, blocks=blocks, interpret=interpret)
                                       for w in ws))
    compiled = f.lower(x, qs).compile()
    fns[name] = functools.partial(lambda c: jax.block_until_ready(c(x, qs)), compiled)
    for attr, fn in saved.items():
      setattr(kernel_module, attr, fn)
  t = interleaved_median_times(fns, repeats)
  return {"benchmark": "fp4_matmul_stages", "device": jax.devices()[0].device_kind, "fmt": fmt, "m": m, "k": k,
          "n": n, "blocks": [blocks.bm, blocks.bn, blocks.bk, blocks.split_k, blocks.num_warps], "copies": copies,
          "ms": {name: round(1e3 * v / copies, 4) for name, v in t.items()}, "commit": commit(),
          "jax": jax.__version__}


def main(argv=None) -> None:
  gpu = jax.default_backend() == "gpu"
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--m", default="1,4,16,64", help="comma-separated rows of x (tokens per decode step)")
  p.add_argument("--k", type=int, default=8192 if gpu else 1024)
  p.add_argument("--n", type=int, default=8192 if gpu else 1024)
  p.add_argument("--fmt", default="nvfp4", choices=sorted(fp4.BLOCK))
  p.add_argument("--bn", default=str(FP4MatmulBlocks.bn), help="comma-separated tile widths to try")
  p.add_argument("--split_k", default=str(FP4MatmulBlocks.split_k), help="comma-separated K splits to try")
  p.add_argument("--bk", type=int, default=FP4MatmulBlocks.bk)
  p.add_argument("--num_warps", default=str(FP4MatmulBlocks.num_warps), help="comma-separated warps to try")
  p.add_argument("--copies", type=int, default=16 if gpu else 1,
                 help="distinct W per timed call (on a GPU: more bytes than its L2, launches amortized)")
  p.add_argument("--repeats", type=int, default=7, help="interleaved timing rounds (medians)")
  p.add_argument("--stages", action="store_true",
                 help="instead: time the compiled kernel with its decode and scale stages left out (GPU)")
  args = p.parse_args(argv)
  ints = lambda text: [int(v) for v in text.split(",")]   # noqa: E731
  for m in ints(args.m):
    for bn, split_k, warps in itertools.product(ints(args.bn), ints(args.split_k), ints(args.num_warps)):
      blocks = FP4MatmulBlocks(bm=max(16, 1 << (m - 1).bit_length()), bn=bn, bk=args.bk, split_k=split_k,
                               num_warps=warps)
      line = (stage_times(m, args.k, args.n, args.fmt, args.repeats, args.copies, blocks, not gpu) if args.stages else
              one_shape(m, args.k, args.n, args.fmt, args.repeats, args.copies, blocks, interpret=not gpu))
      print(json.dumps(line), flush=True)


if __name__ == "__main__":
  main()
