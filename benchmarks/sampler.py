"""Sampler throughput: rlkit's KV-cache sampler against `transformers` `generate` on the same weights.

For each size (S, M) prints one JSON line with tokens/s of both sides (f32, and bf16 compute), the ratio
`speedup_vs_peer`, the decode MFU of the M model against the matmul peak measured in this same process,
and decode tokens/s at prompt 16 vs prompt 512 (their ratio shows the per-token cost stays flat).

  python benchmarks/sampler.py [--sizes S,M] [--reps N] [--cpu-devices N]

Both sides: batch 64, prompt 16, 64 new tokens, sampling at temperature 1 (no top-k/top-p, no EOS so every
row generates all 64 tokens), 2 threads. Timings are medians over `--reps` rounds (default 10 for S, whose
runs take tens of milliseconds and are the most exposed to noise, 3 for M). Within a round the peer's and
rlkit's calls and the matmul peak take turns (`_common.interleaved_median_times`), so every ratio, and the
MFU, compares measurements from the same minutes of this noisy machine.

`--cpu-devices N` (N > 1) runs rlkit's side the way `--config.mesh.cpu_devices=N` runs a job: the CPU is
split into N XLA devices (`rlkit.parallel.set_cpu_devices`) and generation runs on a mesh of them, under
`jax.set_mesh` as in a job. `--mesh data` (default) splits the batch over them with the parameters
replicated; `--mesh tensor` splits the parameters by the default partition rules (attention heads, MLP
columns/rows, vocabulary) and keeps every row on every device, with two all-reduces per layer. Tensor
parallelism suits the M model: each core streams half the weights, at 64 rows instead of 32, and runs half
of each row's attention. The peer is unchanged (one process, 2 intra-op threads). Each JSON line records
`cpu_devices` and `mesh`.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import sys
import tempfile

os.environ.setdefault("HF_HUB_OFFLINE", "1")
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks._common import SIZES, commit, cpu_info, interleaved_median_times, matmul_fn  # noqa: E402
from rlkit.models import hf  # noqa: E402
from rlkit.parallel import make_mesh, set_cpu_devices, shard_batch, shard_params  # noqa: E402
from rlkit.models.transformer import Transformer, TransformerConfig, init_params, num_params  # noqa: E402
from rlkit.rollout.sampler import SamplingConfig, generate  # noqa: E402

BATCH, PROMPT, NEW = 64, 16, 64


def decode_flops_per_token(cfg: TransformerConfig, context: float) -> float:
  """Matmul FLOPs of one decode token: 2 x (weights touched) + attention over `context` cached keys."""
  d, hd = cfg.hidden_size, cfg.head_dim
  attn_w = d * (cfg.num_heads + 2 * cfg.num_kv_heads) * hd + cfg.num_heads * hd * d
  mlp_w = 3 * d * cfg.intermediate_size
  per_layer = 2 * (attn_w + mlp_w) + 4 * cfg.num_heads * hd * context
  return cfg.num_layers * per_layer + 2 * d * cfg.vocab_size


def rlkit_fn(cfg, params, prompt_len: int, new: int, dtype: str, mesh_axis: str = "data"):
  """One `generate` call of rlkit's sampler (compiled and run once here), as a no-argument function; with
  several devices, on a mesh of them along `mesh_axis` ("data" or "tensor")."""
  mcfg = cfg.replace(dtype=dtype, param_dtype=dtype)
  model = Transformer(mcfg)
  p = jax.tree.map(lambda x: x.astype(jnp.dtype(dtype)), params)
  rng = np.random.default_rng(0)
  prompt = jnp.asarray(rng.integers(3, cfg.vocab_size, (BATCH, prompt_len)), jnp.int32)
  mask = jnp.ones_like(prompt, bool)
  mesh = None
  if len(jax.devices()) > 1:   # --cpu-devices: a `mesh_axis` mesh of the devices
    mesh = make_mesh({mesh_axis: -1})
    p, (prompt, mask) = shard_params(p, mesh), shard_batch((prompt, mask), mesh)
  sc = SamplingConfig(max_new_tokens=new, temperature=1.0)
  key = jax.random.key(0)

  def run():
    with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
      generate(model, p, prompt, mask, key, sc).response.block_until_ready()
  run()
  return run


def torch_fn(folder: str, prompt_len: int, new: int, dtype: str, vocab: int):
  """One `transformers` `generate` call on the checkpoint in `folder`, as a no-argument function."""
  import torch
  import transformers
  torch.set_num_threads(2)
  tdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
  model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=tdtype).eval()
  rng = np.random.default_rng(0)
  ids = torch.tensor(rng.integers(3, vocab, (BATCH, prompt_len)))
  mask = torch.ones_like(ids)

  def run():
    with torch.inference_mode():
      model.generate(ids, attention_mask=mask, do_sample=True, temperature=1.0, top_k=None, top_p=None,
                     max_new_tokens=new, min_new_tokens=new, eos_token_id=None, pad_token_id=0)
  run()
  return run


def bench_size(name: str, reps: int, mesh_axis: str = "data") -> dict:
  """Times every side of one size in the same rounds (`interleaved_median_times`): the peer's and rlkit's
  generate calls, and the matmul peaks that the decode MFU divides by."""
  cfg = SIZES[name]
  params = init_params(cfg, jax.random.key(0))
  tokens = BATCH * NEW
  with tempfile.TemporaryDirectory() as tmp:
    folder = os.path.join(tmp, "model")
    hf.save(folder, cfg, params, model_type="qwen3")
    fns = {"peer": torch_fn(folder, PROMPT, NEW, "float32", cfg.vocab_size),
           "peer_bf16": torch_fn(folder, PROMPT, NEW, "bfloat16", cfg.vocab_size)}
  ours = functools.partial(rlkit_fn, cfg, params, mesh_axis=mesh_axis)
  fns["ours"] = ours(PROMPT, NEW, "float32")
  fns["ours_bf16"] = ours(PROMPT, NEW, "bfloat16")
  # Decode-only throughput: subtract the prefill + first step (a 1-token run) from the full run.
  fns["ours_1"] = ours(PROMPT, 1, "float32")
  fns["peak"], peak_flops = matmul_fn(jnp.float32)
  fns["peak_bf16"], _ = matmul_fn(jnp.bfloat16)
  t = interleaved_median_times(fns, reps)
  # Prompt 512 against prompt 16 is rlkit's own ratio, so its (slow, prefill-heavy) calls take turns
  # only with each other.
  t.update(interleaved_median_times({"long_1": ours(512, 1, "float32"), "long": ours(512, NEW, "float32")},
                                    reps))
  decode_short = BATCH * (NEW - 1) / (t["ours"] - t["ours_1"])
  decode_long = BATCH * (NEW - 1) / (t["long"] - t["long_1"])
  flops = decode_flops_per_token(cfg, PROMPT + NEW / 2) * decode_short
  peak_f32, peak_bf16 = peak_flops / t["peak"], peak_flops / t["peak_bf16"]
  return {
      "benchmark": "sampler", "size": name, "cpu_devices": len(jax.devices()),
      "mesh": mesh_axis if len(jax.devices()) > 1 else None, "params": num_params(params), "batch": BATCH,
      "prompt": PROMPT, "new_tokens": NEW, "reps": reps, "commit": commit(), "jax": jax.__version__,
      **cpu_info(),
      "tokens_per_s": round(tokens / t["ours"], 1), "peer_tokens_per_s": round(tokens / t["peer"], 1),
      "speedup_vs_peer": round(t["peer"] / t["ours"], 3),
      "bf16_tokens_per_s": round(tokens / t["ours_bf16"], 1),
      "peer_bf16_tokens_per_s": round(tokens / t["peer_bf16"], 1),
      "bf16_speedup_vs_peer": round(t["peer_bf16"] / t["ours_bf16"], 3),
      "decode_tokens_per_s_prompt16": round(decode_short, 1),
      "decode_tokens_per_s_prompt512": round(decode_long, 1),
      "decode_ratio_512_vs_16": round(decode_long / decode_short, 3),
      "decode_gflops": round(flops / 1e9, 2), "peak_gflops_f32": round(peak_f32 / 1e9, 1),
      "peak_gflops_bf16": round(peak_bf16 / 1e9, 1), "decode_mfu": round(flops / peak_f32, 3),
  }


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--sizes", default="S,M")
  parser.add_argument("--reps", type=int, default=None, help="timed runs per measurement (default S 10, M 3)")
  parser.add_argument("--cpu-devices", type=int, default=1,
                      help="split the CPU into N XLA devices (default 1: one device)")
  parser.add_argument("--mesh", choices=("data", "tensor"), default="data",
                      help="with --cpu-devices: split the batch (data) or the parameters (tensor) over them")
  args = parser.parse_args()
  if args.mesh == "tensor" and args.cpu_devices < 2:
    parser.error("--mesh tensor splits the parameters over XLA devices; add --cpu-devices 2 (or more).")
  if args.cpu_devices > 1:
    set_cpu_devices(args.cpu_devices)
  for name in args.sizes.split(","):
    reps = args.reps or {"S": 10}.get(name, 3)
    print(json.dumps(bench_size(name, reps, args.mesh)), flush=True)


if __name__ == "__main__":
  main()
