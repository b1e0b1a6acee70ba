"""Where a decode step's time goes in the decoder layers at the Qwen3-0.6B shape (float32): one JSON line.

  python benchmarks/decode_layer.py [--layers 4] [--batch 16] [--reps 15]

`real_size.py` measures the whole sampler against `generate`; this script splits its decoder layers. Per
layer, medians of interleaved rounds (`_common.interleaved_median_times`):
- `step_ms_S<S>`: rlkit's decode forward of one token per row (`Transformer.forward` with a KV cache of S
  slots, 65 of them filled, the cache donated so its update is in place as in the sampler's loop), for the
  cache lengths of `real_size.py`'s run (128: 64 prompt + 64 new tokens) and a shorter one (72);
- `nk_step_ms_S<S>`: the same with the sampler's decode layout (`decode_layout.decode_params`: features-major
  weight copies, what `generate` uses on CPU);
- the four weight matmuls of a layer on [batch, in] activations, rlkit's XLA (`jnp.dot`) on [in, out] weights
  (`jax_`, the parameters' layout) and on [out, in] copies (`jax_nk_`, the decode layout) beside torch's
  (`x @ w`, the peer's kernels), each over `--layers` distinct weights so no weight stays in cache:
  `*_matmul_ms` (their sum) and per projection.
What is not a matmul (norms, rope, the cache write, attention over the cache) is `step_ms_S<S> - jax_matmul_ms`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402

from benchmarks._common import commit, cpu_info, interleaved_median_times  # noqa: E402
from rlkit.models.decode_layout import decode_params  # noqa: E402
from rlkit.models.transformer import Transformer, TransformerConfig, init_cache, rope_tables  # noqa: E402

HIDDEN, INTER, HEADS, KV, HEAD_DIM = 1024, 3072, 16, 8, 128        # Qwen3-0.6B
PROJECTIONS = {"qkv": (HIDDEN, KV * (HEADS // KV + 2) * HEAD_DIM), "o": (HEADS * HEAD_DIM, HIDDEN),
               "gate_up": (HIDDEN, 2 * INTER), "down": (INTER, HIDDEN)}


def decode_step(layers: int, batch: int, slots: int, nk: bool = False):
  cfg = TransformerConfig(vocab_size=1024, hidden_size=HIDDEN, intermediate_size=INTER, num_layers=layers,
                          num_heads=HEADS, num_kv_heads=KV, head_dim=HEAD_DIM, tie_word_embeddings=True)
  model = Transformer(cfg)
  tok = jnp.zeros((batch, 1), jnp.int32)
  params = jax.jit(lambda k: model.init(k, tok)["params"])(jax.random.key(0))
  if nk:
    params = jax.jit(lambda p: decode_params(p, cfg))(params)
  cache = init_cache(cfg, batch, slots)
  cache = cache.replace(index=jnp.int32(64), slot_mask=cache.slot_mask.at[:, :65].set(True))
  pos = jnp.full((batch, 1), 64, jnp.int32)
  rope_cs = rope_tables(pos, HEAD_DIM, cfg.rope_theta, jnp.float32)

  def step(params, cache):
    out = model.apply({"params": params}, tok, pos, jnp.ones((batch, 1), bool), cache, rope_cs=rope_cs,
                      method=Transformer.forward)
    return out.hidden, out.cache.replace(index=cache.index)        # the same slot every call

  step = jax.jit(step, donate_argnums=(1,))
  state = {"cache": cache}

  def run():
    hidden, state["cache"] = step(params, state["cache"])
    hidden.block_until_ready()
  return run


def matmuls(layers: int, batch: int):
  import torch
  torch.set_num_threads(os.cpu_count() or 1)
  sides = {}
  for name, (k, n) in PROJECTIONS.items():
    x = jnp.ones((batch, k), jnp.float32)
    ws = [jax.random.normal(jax.random.key(i), (k, n)) for i in range(layers)]
    f = jax.jit(lambda x, ws: [x @ w for w in ws])
    sides[f"jax_{name}"] = lambda f=f, x=x, ws=ws: jax.block_until_ready(f(x, ws))
    wn = [jnp.asarray(w.T) for w in ws]         # materialised [out, in] copies
    g = jax.jit(lambda x, ws: [jnp.einsum("bk,nk->bn", x, w) for w in ws])
    sides[f"jax_nk_{name}"] = lambda g=g, x=x, ws=wn: jax.block_until_ready(g(x, ws))
    xt, wt = torch.ones(batch, k), [torch.randn(k, n) for _ in range(layers)]

    def peer(xt=xt, wt=wt):
      with torch.no_grad():
        for w in wt:
          xt @ w
    sides[f"torch_{name}"] = peer
  return sides


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--layers", type=int, default=4)
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--reps", type=int, default=15)
  args = p.parse_args(argv)
  fns = {f"step_S{s}": decode_step(args.layers, args.batch, s) for s in (128, 72)}
  fns.update({f"nk_step_S{s}": decode_step(args.layers, args.batch, s, nk=True) for s in (128, 72)})
  fns.update(matmuls(args.layers, args.batch))
  t = {k: v * 1e3 / args.layers for k, v in interleaved_median_times(fns, args.reps).items()}   # ms per layer
  out = {"benchmark": "decode_layer", "shape": "qwen3-0.6b", "dtype": "float32", "batch": args.batch,
         "layers": args.layers, "reps": args.reps, "commit": commit(), "jax": jax.__version__, **cpu_info()}
  for side in ("jax", "jax_nk", "torch"):
    out[f"{side}_matmul_ms"] = round(sum(t[f"{side}_{n}"] for n in PROJECTIONS), 3)
    out[f"{side}_ms"] = {n: round(t[f"{side}_{n}"], 3) for n in PROJECTIONS}
  for s in (128, 72):
    out[f"step_ms_S{s}"] = round(t[f"step_S{s}"], 3)
    out[f"nk_step_ms_S{s}"] = round(t[f"nk_step_S{s}"], 3)
    out[f"not_matmul_ms_S{s}"] = round(t[f"step_S{s}"] - out["jax_matmul_ms"], 3)
  out["matmul_vs_torch"] = round(out["torch_matmul_ms"] / out["jax_matmul_ms"], 3)
  out["nk_matmul_vs_torch"] = round(out["torch_matmul_ms"] / out["jax_nk_matmul_ms"], 3)
  print(json.dumps(out))


if __name__ == "__main__":
  main()
