"""Throughput of the sparse weight-sync kernels against a dense copy, on one synthetic bf16 tensor: one JSON line.

  python benchmarks/sync.py [--size 262144] [--change_rate 0.03] [--repeats 7]

A float32 "master" of `--size` elements is exported to bf16 (the baseline); a copy with exactly
round(change_rate x size) elements moved up by one bf16 ulp is the new export. Sides, timed in interleaved
rounds (`_common.interleaved_median_times`: medians, each timed call after an untimed warm-up one):
- encode: `compact_changes` (Pallas: compiled on GPU; on CPU it runs *interpreted*, which the JSON says in
  `pallas_mode`, so its CPU numbers measure the interpreter, not the kernel), `compact_changes_reference`
  (jnp), and the dense path's encode, the export itself (`astype` float32 -> bf16);
- apply: `scatter_apply` (Pallas), `scatter_apply_reference` (jnp), and the dense path's transfer,
  `jax.device_put(..., may_alias=False)` of the bf16 tensor to another device (a copy on the same device
  where there is only one: without `may_alias=False` that put is free and measures nothing).
Throughput is GB/s of *dense* bytes (2 x size) covered per second: how fast each side turns a whole tensor
into the sampler's copy, whatever it moves. `payload_ratio` is the sparse payload (u16 gaps + bf16 values)
over the dense bytes. A CPU "transfer" is a memcpy, so the dense side's times understate a real link.

Interpreted, the compaction kernel's time grows faster than the size (each grid step carries the whole
capacity-sized output through a scatter): 66 ms at 2^18 elements, 31 s at 2^22 on the 2-core CPU. Keep
`--size` small on CPU; the default is sized for it. On a GPU, pass a model-sized shard (e.g. 2^30).
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks._common import commit, cpu_info, interleaved_median_times  # noqa: E402
from kernels import sparse_delta as sd  # noqa: E402


def synthetic(size: int, change_rate: float, seed: int = 0):
  """(f32 master, bf16 baseline export, bf16 new export with exactly round(change_rate x size) changes)."""
  rng = np.random.default_rng(seed)
  master = jnp.asarray((0.05 * rng.standard_normal(size)).astype(np.float32))
  base = master.astype(jnp.bfloat16)
  changed = rng.choice(size, size=int(round(change_rate * size)), replace=False)
  bits = np.asarray(base).view(np.uint16).copy()
  bits[changed] += 1                                    # the next bf16 value up (the same sign)
  return master, base, jnp.asarray(bits.view(jnp.bfloat16)), np.sort(changed)


def payload_bytes(changed: np.ndarray) -> int:
  """Gap-coded indices (u16, a u32 escape per gap >= 65535; `rlkit.sync.codec`) plus bf16 values."""
  gaps = np.diff(changed, prepend=-1)
  return 2 * changed.size + 4 * int((gaps >= 0xFFFF).sum()) + 2 * changed.size


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--size", type=int, default=2 ** 18, help="elements of the synthetic bf16 tensor")
  p.add_argument("--change_rate", type=float, default=0.03, help="fraction of its elements that change")
  p.add_argument("--repeats", type=int, default=7, help="interleaved timing rounds (medians)")
  args = p.parse_args(argv)
  interpret = jax.default_backend() != "gpu"
  master, base, new, changed = synthetic(args.size, args.change_rate)
  n_changed = changed.size
  capacity = min(args.size, max(1, math.ceil(1.25 * n_changed)))       # headroom, as capacity_frac gives
  blocks = sd.SparseDeltaBlocks()

  encode_pallas = jax.jit(lambda a, b: sd.compact_changes(a, b, capacity=capacity, blocks=blocks,
                                                          interpret=interpret))
  encode_ref = jax.jit(lambda a, b: sd.compact_changes_reference(a, b, capacity=capacity))
  export = jax.jit(lambda m: m.astype(jnp.bfloat16))
  idx, val, count = encode_ref(new, base)
  assert int(count) == n_changed
  apply_pallas = jax.jit(lambda d, i, v: sd.scatter_apply(d, i, v, blocks=blocks, interpret=interpret))
  apply_ref = jax.jit(sd.scatter_apply_reference)
  other = jax.devices()[1] if len(jax.devices()) > 1 else jax.devices()[0]
  # Every side must give the same answer (a benchmark of a wrong kernel measures nothing).
  assert all(np.array_equal(np.asarray(g), np.asarray(w)) for g, w in zip(encode_pallas(new, base),
                                                                         (idx, val, count)))
  for got in (apply_pallas(base, idx, val), apply_ref(base, idx, val)):
    assert np.array_equal(np.asarray(got).view(np.uint16), np.asarray(new).view(np.uint16))

  block = jax.block_until_ready
  fns = {"encode_pallas": lambda: block(encode_pallas(new, base)),
         "encode_reference": lambda: block(encode_ref(new, base)),
         "encode_dense": lambda: block(export(master)),
         "apply_pallas": lambda: block(apply_pallas(base, idx, val)),
         "apply_reference": lambda: block(apply_ref(base, idx, val)),
         "apply_dense": lambda: block(jax.device_put(new, other, may_alias=False))}
  t = interleaved_median_times(fns, args.repeats)
  dense_gb = 2 * args.size / 1e9
  out = {"benchmark": "sync", "backend": jax.default_backend(),
         "pallas_mode": "interpret" if interpret else "compiled", "size": args.size,
         "change_rate": args.change_rate, "changed": n_changed, "capacity": capacity, "repeats": args.repeats,
         "payload_ratio": round(payload_bytes(changed) / (2 * args.size), 4), "commit": commit(),
         "jax": jax.__version__, **cpu_info()}
  for phase in ("encode", "apply"):
    out[f"{phase}_gbps"] = {side: round(dense_gb / t[f"{phase}_{side}"], 3)
                            for side in ("pallas", "reference", "dense")}
    out[f"{phase}_ms"] = {side: round(1e3 * t[f"{phase}_{side}"], 3) for side in ("pallas", "reference", "dense")}
  print(json.dumps(out))


if __name__ == "__main__":
  main()
