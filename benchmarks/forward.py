"""Training throughput of the decoder: tokens/s and MFU of loss+grad and of a full AdamW train step.

For each size (S, M; the shapes of benchmarks/sampler.py) prints one JSON line with tokens/s of
(a) the jitted next-token cross-entropy value_and_grad (`fwd_bwd_tokens_per_s`, and its bf16 twin) and
(b) a full train step, `rlkit.train.steps.make_sft_step` with `optax.adamw` (value_and_grad + update in one
jitted function, train state donated), in f32 (`tokens_per_s`) and bf16 compute with f32 master params
(`bf16_tokens_per_s`). The peer is the machine itself: the f32 and bf16-input/f32-accumulate 2048^3 matmul
peak measured in the same process, taking turns with the training calls in every round
(`_common.interleaved_median_times`); `mfu` = train-step FLOP/s (`train_flops_per_token`) / that peak.

  python benchmarks/forward.py [--sizes S,M] [--reps 5] [--quick]

Batch 8 x 256 tokens of random ids, no padding. Timings are medians over `--reps` rounds;
`--quick` (a smoke test) runs S only with 2 reps.
"""
from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks._common import (SIZES, add_tuned_malloc_arg, apply_tuned_malloc_arg, commit, cpu_info,
                               interleaved_median_times, matmul_fn)  # noqa: E402
from rlkit.models.transformer import Transformer, TransformerConfig, init_params, num_params  # noqa: E402
from rlkit.parallel.host_memory import tuned_malloc_active  # noqa: E402
from rlkit.train.steps import init_train_state, make_sft_step  # noqa: E402

BATCH, SEQ = 8, 256


def matmul_params(cfg: TransformerConfig) -> int:
  """Weights that take part in a matmul per token: q/k/v/o, SwiGLU gate/up/down, LM head (no embedding
  lookup, no norms). Dense models only."""
  d, hd = cfg.hidden_size, cfg.head_dim
  attn = d * (cfg.num_heads + 2 * cfg.num_kv_heads) * hd + cfg.num_heads * hd * d
  mlp = 3 * d * cfg.intermediate_size
  return cfg.num_layers * (attn + mlp) + d * cfg.vocab_size


def train_flops_per_token(cfg: TransformerConfig, seq: int) -> float:
  """Matmul FLOPs of one training token (forward + backward) at sequence length `seq`.

  forward  = 2 * matmul_params + L * 4 * H * hd * seq
             (q k^T and probs v: 2 * H * hd * seq each per query token; the full seq x seq score matrix is
             computed and then masked, so causality saves nothing and is not discounted)
  training = 3 * forward  (the backward pass costs two forward matmuls: grads w.r.t. inputs and weights)
           = 6 * matmul_params + 12 * L * H * hd * seq
  """
  forward = 2 * matmul_params(cfg) + cfg.num_layers * 4 * cfg.num_heads * cfg.head_dim * seq
  return 3 * forward


def next_token_loss(model: Transformer, params, tokens):
  """Mean next-token cross-entropy of `tokens` [B, T] (every position is a target)."""
  logits = model.apply({"params": params}, tokens)
  logp = jax.nn.log_softmax(logits[:, :-1].astype(jnp.float32), axis=-1)
  return -jnp.mean(jnp.take_along_axis(logp, tokens[:, 1:, None], axis=-1))


def fwd_bwd_fn(cfg: TransformerConfig, params, tokens):
  """One jitted loss value_and_grad call, as a no-argument function."""
  model = Transformer(cfg)
  grad_fn = jax.jit(jax.value_and_grad(lambda p, t: next_token_loss(model, p, t)))
  return lambda: jax.block_until_ready(grad_fn(params, tokens))


def train_step_fn(cfg: TransformerConfig, params, tokens):
  """One `make_sft_step` call (adamw, donated state) on a full-mask batch of `tokens`, as a no-argument
  function."""
  tx = optax.adamw(1e-4, weight_decay=0.01)
  step = make_sft_step(Transformer(cfg), tx)
  ones = jnp.ones(tokens.shape, bool)
  batch = {"tokens": tokens, "attention_mask": ones, "loss_mask": ones}
  box = [init_train_state(jax.tree.map(jnp.copy, params), tx)]   # a copy: the step donates it

  def run():
    box[0], metrics = step(box[0], batch)
    jax.block_until_ready((box[0], metrics))
  return run


def bench_size(name: str, reps: int) -> dict:
  """Times the four training calls and the matmul peaks in the same rounds (`interleaved_median_times`)."""
  cfg = SIZES[name]
  bf16 = cfg.replace(dtype="bfloat16")            # bf16 compute, f32 master params
  params = init_params(cfg, jax.random.key(0))
  tokens = jnp.asarray(np.random.default_rng(0).integers(3, cfg.vocab_size, (BATCH, SEQ)), jnp.int32)
  n = BATCH * SEQ
  fns = {"fb": fwd_bwd_fn(cfg, params, tokens), "fb_bf16": fwd_bwd_fn(bf16, params, tokens),
         "step": train_step_fn(cfg, params, tokens), "step_bf16": train_step_fn(bf16, params, tokens)}
  fns["peak"], peak_flops = matmul_fn(jnp.float32)
  fns["peak_bf16"], _ = matmul_fn(jnp.bfloat16)
  t = interleaved_median_times(fns, reps)
  t_fb, t_fb_bf16, t_step, t_step_bf16 = t["fb"], t["fb_bf16"], t["step"], t["step_bf16"]
  peak_f32, peak_bf16 = peak_flops / t["peak"], peak_flops / t["peak_bf16"]
  flops_tok = train_flops_per_token(cfg, SEQ)
  return {
      "benchmark": "forward", "size": name, "params": num_params(params), "batch": BATCH, "seq": SEQ,
      "reps": reps, "commit": commit(), "jax": jax.__version__, **cpu_info(),
      "tuned_malloc": tuned_malloc_active(),
      "tokens_per_s": round(n / t_step, 1), "bf16_tokens_per_s": round(n / t_step_bf16, 1),
      "fwd_bwd_tokens_per_s": round(n / t_fb, 1), "bf16_fwd_bwd_tokens_per_s": round(n / t_fb_bf16, 1),
      "train_gflops_per_token": round(flops_tok / 1e9, 5),
      "peak_gflops_f32": round(peak_f32 / 1e9, 1), "peak_gflops_bf16": round(peak_bf16 / 1e9, 1),
      "mfu": round(flops_tok * n / t_step / peak_f32, 3),
      "bf16_mfu": round(flops_tok * n / t_step_bf16 / peak_bf16, 3),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="S,M")
  parser.add_argument("--reps", type=int, default=5)
  add_tuned_malloc_arg(parser)
  parser.add_argument("--quick", action="store_true", help="smoke test: S only, 2 reps")
  args = parser.parse_args()
  apply_tuned_malloc_arg(args)
  sizes, reps = (["S"], 2) if args.quick else (args.sizes.split(","), args.reps)
  for name in sizes:
    print(json.dumps(bench_size(name, reps)), flush=True)


if __name__ == "__main__":
  main()
