"""The sampler on an FP4 copy of an MoE's experts against the same sampler on the bf16 copy: one JSON line.

  python benchmarks/fp4_sampler.py [--size tiny|1b] [--fmt nvfp4] [--batch 16] [--new 64] [--reps 5]

Sides, in one process on the same weights, timed in interleaved rounds (`_common.interleaved_median_times`,
medians), each one `rlkit.rollout.sampler.generate` call (prompt 16, `--new` tokens, temperature 1, no EOS):
- `bf16`: the sampler copy of `rl.sync.quantizer=none` (every weight bf16): the baseline;
- `fp4_weights`: `rl.sync.quantizer=<fmt>_experts`: the experts' weights FP4 (codes + block scales), their grouped
  matmuls through `FP4Weight.ragged_matmul` (the Pallas kernel per expert on a GPU at decode sizes);
- `fp4_trace`: that copy with `model.expert_quant=<fmt>` as well: the experts' activations FP4 too, and the
  sampler records TRACE's codes and scales with every token (the rollout of experiments/trace_fp4).

Reported per side: tokens/s (batch x new / median seconds) and the ratio to bf16; the bytes of the experts'
weights in each copy; the device. `--size 1b` is a Qwen3-MoE-shaped model of about 1B parameters (32 experts,
top 4), for a GPU; `tiny` (the default) checks the script on a CPU, where FP4 matmuls dequantize in jnp and the
ratios say nothing about a GPU. The issue's GPU measurement (FP4-expert sampler vs bf16 on a ~1B MoE) runs
`--size 1b` on one.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks._common import commit, cpu_info, interleaved_median_times  # noqa: E402
from rlkit.models.transformer import Transformer, TransformerConfig, init_params, num_params  # noqa: E402
from rlkit.rollout.sampler import SamplingConfig, generate  # noqa: E402
from rlkit.sync import export_params  # noqa: E402

SIZES = {
    "tiny": TransformerConfig(vocab_size=512, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                              num_kv_heads=2, head_dim=16, num_experts=8, num_experts_per_tok=2,
                              moe_intermediate_size=64),
    "1b": TransformerConfig(vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_layers=16,
                            num_heads=16, num_kv_heads=4, head_dim=64, num_experts=32, num_experts_per_tok=4,
                            moe_intermediate_size=512, tie_word_embeddings=True),
}
PROMPT = 16


def expert_bytes(copy) -> int:
  """Bytes of every stacked expert kernel of a sampler copy (codes and scales for an FP4 one)."""
  total = 0
  for path, leaf in jax.tree_util.tree_flatten_with_path(copy)[0]:
    if "moe" in jax.tree_util.keystr(path) and "router" not in jax.tree_util.keystr(path):
      total += leaf.size * leaf.dtype.itemsize
  return int(total)


def side(cfg: TransformerConfig, copy, batch: int, new: int):
  """One generate call of `Transformer(cfg)` on `copy`, compiled and run once here, as a no-argument function."""
  model = Transformer(cfg)
  prompt = jnp.asarray(np.random.default_rng(0).integers(3, cfg.vocab_size, (batch, PROMPT)), jnp.int32)
  mask = jnp.ones_like(prompt, bool)
  sampling = SamplingConfig(max_new_tokens=new, temperature=1.0)

  def run():
    out = generate(model, copy, prompt, mask, jax.random.key(0), sampling)
    out.response.block_until_ready()
    return out
  t0 = time.perf_counter()
  first = run()
  print(f"  compiled and ran one side in {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
  assert bool(jnp.all(jnp.isfinite(first.logprobs))), "non-finite log-probs: the side is broken"
  return run


def main(argv=None) -> dict:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--size", default="tiny", choices=sorted(SIZES))
  p.add_argument("--fmt", default="nvfp4", choices=["nvfp4", "mxfp4"])
  p.add_argument("--batch", type=int, default=16)
  p.add_argument("--new", type=int, default=64)
  p.add_argument("--reps", type=int, default=5)
  args = p.parse_args(argv)
  cfg = SIZES[args.size]
  t0 = time.perf_counter()
  params = init_params(cfg, jax.random.key(0))
  print(f"  init {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
  bf16 = cfg.replace(dtype="bfloat16", param_dtype="bfloat16")
  dense = export_params(params, "bfloat16", "none")
  fp4 = export_params(params, "bfloat16", f"{args.fmt}_experts")
  del params
  print(f"  exported the copies at {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
  fns = {"bf16": side(bf16, dense, args.batch, args.new),
         "fp4_weights": side(bf16, fp4, args.batch, args.new),
         "fp4_trace": side(bf16.replace(expert_quant=args.fmt), fp4, args.batch, args.new)}
  t = interleaved_median_times(fns, args.reps)
  tokens = args.batch * args.new
  line = {"bench": "fp4_sampler", "size": args.size, "params": num_params(dense), "fmt": args.fmt,
          "batch": args.batch, "prompt": PROMPT, "new": args.new, "reps": args.reps,
          **{f"{k}_tokens_s": round(tokens / v, 1) for k, v in t.items()},
          **{f"{k}_vs_bf16": round(t["bf16"] / v, 3) for k, v in t.items() if k != "bf16"},
          "expert_bytes_bf16": expert_bytes(dense), "expert_bytes_fp4": expert_bytes(fp4),
          "device": jax.devices()[0].device_kind, "backend": jax.default_backend(), **cpu_info(),
          "commit": commit()}
  print(json.dumps(line), flush=True)
  return line


if __name__ == "__main__":
  main()
