"""Sizing the pretrained base (issue: a capable base model): pretraining tokens/s of candidate Qwen3-shaped
models on this machine, and what a 3 CPU-hour budget buys each.

  python experiments/base/throughput.py [--reps 5] [--sizes 3m,7m,13m,23m,29m]

One JSON line per size: parameters (total and without the embedding), the median time of one full AdamW
train step (`rlkit.train.steps.make_sft_step`, as benchmarks/forward.py times it) on a batch of 8 x 256 token
ids from a 4096-entry vocabulary (the byte-level BPE the base will ship), tokens/s, and tokens per parameter
after 3 hours at that rate. XLA's default optimisation passes; one XLA device (the host's 2 cores).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks._common import commit, cpu_info  # noqa: E402
from benchmarks.forward import train_step_fn  # noqa: E402
from rlkit.models.transformer import TransformerConfig, init_params, num_params  # noqa: E402

BATCH, SEQ, VOCAB, BUDGET_S = 8, 256, 4096, 3 * 3600


def _cfg(hidden: int, layers: int, heads: int, kv_heads: int, mlp: int) -> TransformerConfig:
  return TransformerConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=mlp, num_layers=layers,
                           num_heads=heads, num_kv_heads=kv_heads, head_dim=64, rope_theta=10_000.0)


CANDIDATES = {                           # named by their parameter count (embedding tied, included)
    "3m": _cfg(192, 4, 3, 1, 512),
    "7m": _cfg(256, 6, 4, 2, 768),
    "13m": _cfg(384, 6, 6, 2, 1024),
    "23m": _cfg(512, 6, 8, 4, 1536),
    "29m": _cfg(512, 8, 8, 4, 1536),     # benchmarks' M
}


def measure(name: str, reps: int) -> dict:
  cfg = CANDIDATES[name]
  params = init_params(cfg, jax.random.key(0))
  tokens = jnp.asarray(np.random.default_rng(0).integers(3, VOCAB, (BATCH, SEQ)), jnp.int32)
  run = train_step_fn(cfg, params, tokens)
  t0 = time.perf_counter()
  run()                                              # compiles
  compile_s = time.perf_counter() - t0
  times = []
  for _ in range(reps):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
  step_s = statistics.median(times)
  total = num_params(params)
  rate = BATCH * SEQ / step_s
  return {"benchmark": "base_throughput", "size": name, "params": total,
          "params_without_embedding": total - VOCAB * cfg.hidden_size, "hidden": cfg.hidden_size,
          "layers": cfg.num_layers, "batch": BATCH, "seq": SEQ, "vocab": VOCAB, "reps": reps,
          "compile_s": round(compile_s, 2), "step_s": round(step_s, 4), "tokens_per_s": round(rate, 1),
          "tokens_in_3h": int(rate * BUDGET_S), "tokens_per_param_3h": round(rate * BUDGET_S / total, 1),
          "commit": commit(), "jax": jax.__version__, **cpu_info()}


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--reps", type=int, default=5)
  p.add_argument("--sizes", default=",".join(CANDIDATES))
  args = p.parse_args()
  for name in args.sizes.split(","):
    print(json.dumps(measure(name, args.reps)), flush=True)


if __name__ == "__main__":
  main()
