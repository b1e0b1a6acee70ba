"""A real-sized model: rlkit against `transformers` on a random model with the shape of Qwen3-0.6B.

The checkpoint is built by `transformers` (`Qwen3Config` + `Qwen3ForCausalLM`, torch seed 0: vocabulary
151,936, hidden 1024, 28 layers, 16 heads / 8 KV heads of 128, MLP 3072, tied embeddings, rope_theta 1e6, as
Qwen3-0.6B) and saved as a HF folder (config.json + model.safetensors, float32) in a temp dir; both sides load
those weights. For each compute dtype of `--dtypes` (default float32,bfloat16) prints one JSON line per part:

(a) `"part": "load"` — `rlkit.models.hf.load(folder)` vs `AutoModelForCausalLM.from_pretrained(folder)`
    (parameters in that dtype), median of `--load-reps` interleaved rounds.
(b) `"part": "sample"` — batch 16, prompt 64, 64 new tokens, top-p 0.95 at temperature 0.7, no stop token
    (every row generates all 64): `rlkit.rollout.sampler.generate` vs `model.generate(do_sample=True,
    top_p=0.95, temperature=0.7, top_k=0)` on the same prompts, parameters in that dtype. Timed after a
    warm-up; `compile_s` = rlkit's first call minus its median. `decode_step_ms` = (64-token run - 1-token run)
    / 63, both timed in the same rounds. Target: `speedup_vs_peer` >= 1.5.
(c) `"part": "top_p"` — the nucleus step alone on [16, 151936] float32 logits (jitted): the sort-based
    nucleus `processed_logits` used before (`rlkit.rollout.sampler.nucleus_reference`) vs `nucleus_threshold`'s bisection, beside
    one decode step (from (b)), with the rest of the decode step's sampling (exp, the inverse-CDF draw, the
    token's log-prob) and the LM-head matmul [16, 1024] x [1024, 151936] timed alike: the split of a decode
    step. Target: `top_p_share_of_decode` (new / decode step) <= 0.25.
(d) `"part": "update"` — one RL update on 8 x 192 tokens (prompt 64 + response 128): rlkit's `make_rl_step`
    (the default RL loss, ppo_clip + token-mean, scored under the sampler's T=0.7 / top-p 0.95 processing,
    optax.adamw, state donated) vs a `transformers` eager forward + `labels=` loss + backward +
    `torch.optim.AdamW(fused=True)` step (as benchmarks/rl_step.py), f32 master weights on both sides, bf16 as
    `TransformerConfig(dtype="bfloat16")` vs `torch.autocast`. Each side runs in a fresh subprocess (this
    script with `--part update --side jax|torch`) so that `peak_rss_gb` (ru_maxrss, process-wide) is that
    side's own peak; one warm-up step, then the median of `--update-reps` steps. The losses differ (RL loss
    vs next-token cross-entropy). On a CPU without bf16 instructions torch's bf16 side is skipped (its
    backward matmuls take a naive path, ~60x slower than f32) unless `--torch-bf16-update`.

  python benchmarks/real_size.py [--dtypes float32,bfloat16] [--parts load,sample,top_p,update] [--small]

`--small` (a smoke test): 4 layers, vocabulary 32,000 (top-p timed at that vocabulary). Both sides use 2
threads (the machine's 2 cores). The full run takes ~30 minutes on 2 cores, most of it the bf16 sides: on an
AVX2 CPU without bf16 instructions both libraries emulate bf16 matmuls.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from benchmarks._common import (add_tuned_malloc_arg, apply_tuned_malloc_arg, commit, cpu_info,
                               interleaved_median_times, torch_train_step)  # noqa: E402
from rlkit.core.types import TrainBatch  # noqa: E402
from rlkit.models import hf  # noqa: E402
from rlkit.models.transformer import num_params  # noqa: E402
from rlkit.parallel.host_memory import tuned_malloc_active  # noqa: E402
from rlkit.rollout.sampler import (SamplingConfig, generate, nucleus_reference, nucleus_threshold,  # noqa: E402
                                   sample_categorical)
from rlkit.train.rl_config import rl_defaults  # noqa: E402
from rlkit.train.steps import default_step_inputs, init_train_state, make_rl_step  # noqa: E402

# Qwen3-0.6B's shape (its config.json), and the --small one.
QWEN3_06B = dict(vocab_size=151_936, hidden_size=1024, intermediate_size=3072, num_hidden_layers=28,
                 num_attention_heads=16, num_key_value_heads=8, head_dim=128, rope_theta=1_000_000.0,
                 tie_word_embeddings=True, max_position_embeddings=40_960, rms_norm_eps=1e-6)
SMALL = dict(QWEN3_06B, vocab_size=32_000, num_hidden_layers=4)
BATCH, PROMPT, NEW = 16, 64, 64
TEMPERATURE, TOP_P = 0.7, 0.95
UPDATE_ROWS, UPDATE_PROMPT, UPDATE_RESPONSE = 8, 64, 128
LR, WEIGHT_DECAY = 1e-4, 0.01
THREADS = 2


def torch_dtype(dtype: str):
  import torch
  return {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]


def quiet_transformers():
  import transformers
  transformers.utils.logging.disable_progress_bar()     # "Loading weights" bars on stderr
  transformers.utils.logging.set_verbosity_error()


def build_checkpoint(folder: str, shape: dict) -> None:
  """A random Qwen3ForCausalLM (torch seed 0) of `shape`, saved as float32 safetensors in `folder`."""
  import torch
  import transformers
  torch.manual_seed(0)
  model = transformers.Qwen3ForCausalLM(transformers.Qwen3Config(**shape)).to(torch.float32)
  model.save_pretrained(folder, safe_serialization=True)
  del model


def prompts(vocab: int) -> np.ndarray:
  return np.random.default_rng(0).integers(3, vocab, (BATCH, PROMPT))


def base_fields(args, shape: dict, dtype: str, part: str) -> dict:
  return {"benchmark": "real_size", "part": part, "model": "small" if args.small else "qwen3-0.6b-shape",
          "vocab": shape["vocab_size"], "layers": shape["num_hidden_layers"], "dtype": dtype,
          "commit": commit(), "jax": jax.__version__, **cpu_info(), "tuned_malloc": tuned_malloc_active()}


# ------------------------------------------------------------------------------------------ (a) load time

def bench_load(args, folder: str, shape: dict, dtype: str) -> dict:
  import torch
  import transformers
  torch.set_num_threads(THREADS)

  def ours():
    _, params = hf.load(folder, param_dtype=dtype)
    jax.block_until_ready(params)

  def peer():
    transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype(dtype))

  t = interleaved_median_times({"ours": ours, "peer": peer}, args.load_reps)
  return {**base_fields(args, shape, dtype, "load"), "reps": args.load_reps,
          "file_dtype": "float32", "load_s": round(t["ours"], 3), "peer_load_s": round(t["peer"], 3),
          "speedup_vs_peer": round(t["peer"] / t["ours"], 3)}


# ------------------------------------------------------------------------------------------- (b) sampling

def bench_sample(args, folder: str, shape: dict, dtype: str) -> dict:
  import torch
  import transformers
  torch.set_num_threads(THREADS)
  ids = prompts(shape["vocab_size"])
  peer_model = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=torch_dtype(dtype)).eval()
  tids = torch.tensor(ids)
  tmask = torch.ones_like(tids)

  def peer():
    with torch.inference_mode():
      out = peer_model.generate(tids, attention_mask=tmask, do_sample=True, temperature=TEMPERATURE, top_p=TOP_P,
                                top_k=0, max_new_tokens=NEW, min_new_tokens=NEW, eos_token_id=None,
                                pad_token_id=0)
    assert out.shape == (BATCH, PROMPT + NEW), out.shape

  model, params = hf.load(folder, param_dtype=dtype)
  prompt, mask = jnp.asarray(ids, jnp.int32), jnp.ones((BATCH, PROMPT), bool)
  key = jax.random.key(0)
  first = {}

  def ours_fn(new: int):
    sc = SamplingConfig(max_new_tokens=new, temperature=TEMPERATURE, top_p=TOP_P)

    def run():
      out = generate(model, params, prompt, mask, key, sc)
      out.response.block_until_ready()
      return out
    t0 = time.perf_counter()
    out = run()
    first[new] = time.perf_counter() - t0
    assert int(out.lengths.min()) == new
    return run

  fns = {"ours": ours_fn(NEW), "ours_1": ours_fn(1), "peer": peer}
  t = interleaved_median_times(fns, args.reps)
  tokens = BATCH * NEW
  decode_step = (t["ours"] - t["ours_1"]) / (NEW - 1)
  return {**base_fields(args, shape, dtype, "sample"), "params": num_params(params), "batch": BATCH,
          "prompt": PROMPT, "new_tokens": NEW, "temperature": TEMPERATURE, "top_p": TOP_P, "reps": args.reps,
          "tokens_per_s": round(tokens / t["ours"], 2), "peer_tokens_per_s": round(tokens / t["peer"], 2),
          "speedup_vs_peer": round(t["peer"] / t["ours"], 3), "target_speedup": 1.5,
          "target_met": bool(t["peer"] / t["ours"] >= 1.5),
          "generate_s": round(t["ours"], 3), "peer_generate_s": round(t["peer"], 3),
          "compile_s": round(first[NEW] - t["ours"], 2), "compile_1_token_s": round(first[1] - t["ours_1"], 2),
          "prefill_plus_first_token_s": round(t["ours_1"], 3), "decode_step_ms": round(1e3 * decode_step, 2)}


# --------------------------------------------------------------------------------- (c) the top-p step alone

def bisect_nucleus(x, top_p: float):
  return jnp.where(x < nucleus_threshold(x, top_p), -jnp.inf, x)


def measure_decode_step(folder: str, dtype: str) -> float:
  """Seconds of one decode step of rlkit's sampler ((9-token run - 1-token run) / 8), when (b) did not run."""
  model, params = hf.load(folder, param_dtype=dtype)
  cfg = model.cfg
  prompt = jnp.asarray(prompts(cfg.vocab_size), jnp.int32)
  mask = jnp.ones_like(prompt, bool)

  def fn(new):
    sc = SamplingConfig(max_new_tokens=new, temperature=TEMPERATURE, top_p=TOP_P)
    def run():
      generate(model, params, prompt, mask, jax.random.key(0), sc).response.block_until_ready()
    run()
    return run
  t = interleaved_median_times({"9": fn(9), "1": fn(1)}, 1)
  return (t["9"] - t["1"]) / 8


def bench_top_p(args, folder: str, shape: dict, dtype: str, decode_step_s) -> dict:
  v, d = shape["vocab_size"], shape["hidden_size"]
  k1, k2, k3 = jax.random.split(jax.random.key(0), 3)
  # Model-like logits (not the random checkpoint's, which are nearly flat): N(0, 2^2), in the decode dtype,
  # at the temperature, float32 as `processed_logits` hands them to the nucleus.
  logits = (2.0 * jax.random.normal(k1, (BATCH, v))).astype(dtype)
  x = logits.astype(jnp.float32) / TEMPERATURE
  old = jax.jit(lambda x: nucleus_reference(x, TOP_P))
  new = jax.jit(lambda x: bisect_nucleus(x, TOP_P))
  # Both are float32: on a row whose boundary prefix mass is within ~1e-7 of top_p (float32 rounding of the
  # sums, and of top_p itself) they may keep one token more or less (tests/rollout/test_nucleus.py).
  kept_new, kept_old = np.isfinite(np.asarray(new(x))), np.isfinite(np.asarray(old(x)))
  u = jax.random.uniform(k2, (BATCH,))

  @jax.jit
  def draw(x, u):     # the rest of the sampler's draw (sampler._generate.draw) after processed_logits
    x_max = jnp.max(x, axis=-1)
    w = jnp.exp(x - x_max[:, None])
    tok = sample_categorical(u, w)
    return tok, jnp.take_along_axis(x, tok[:, None], -1)[:, 0] - x_max - jnp.log(jnp.sum(w, -1))

  h = jax.random.normal(k3, (BATCH, d)).astype(dtype)
  emb = (0.02 * jax.random.normal(k3, (v, d))).astype(dtype)
  head = jax.jit(lambda h, e: jnp.einsum("bd,vd->bv", h, e, preferred_element_type=jnp.float32))
  xp = new(x)
  fns = {"old": lambda: old(x).block_until_ready(), "new": lambda: new(x).block_until_ready(),
         "draw": lambda: jax.block_until_ready(draw(xp, u)), "head": lambda: head(h, emb).block_until_ready()}
  t = interleaved_median_times(fns, args.top_p_reps)
  if decode_step_s is None:
    decode_step_s = measure_decode_step(folder, dtype)
  share = t["new"] / decode_step_s
  return {**base_fields(args, shape, dtype, "top_p"), "rows": BATCH, "top_p": TOP_P,
          "temperature": TEMPERATURE, "reps": args.top_p_reps, "logits": "N(0, 2^2) random",
          "rows_same_kept_set": int((kept_new == kept_old).all(1).sum()),
          "max_tokens_differing": int((kept_new != kept_old).sum(1).max()),
          "kept_tokens_mean": round(float(kept_new.sum(1).mean()), 1),
          "top_p_sort_ms": round(1e3 * t["old"], 2), "top_p_bisect_ms": round(1e3 * t["new"], 2),
          "bisect_speedup_vs_sort": round(t["old"] / t["new"], 1),
          "draw_rest_ms": round(1e3 * t["draw"], 2), "lm_head_matmul_ms": round(1e3 * t["head"], 2),
          "decode_step_ms": round(1e3 * decode_step_s, 2),
          "top_p_share_of_decode": round(share, 4),
          "sort_top_p_share_of_decode": round(t["old"] / decode_step_s, 4),
          "target_share": 0.25, "target_met": bool(share <= 0.25)}


# ------------------------------------------------------------------------------------------ (d) RL update

def update_tokens(vocab: int) -> np.ndarray:
  return np.random.default_rng(1).integers(3, vocab, (UPDATE_ROWS, UPDATE_PROMPT + UPDATE_RESPONSE))


def jax_update(folder: str, dtype: str) -> tuple:
  """make_rl_step on f32 master weights with `dtype` compute: (one-step function, its losses, description)."""
  model, params = hf.load(folder, dtype=dtype, param_dtype="float32")
  cfg = rl_defaults()
  cfg.max_new_tokens, cfg.temperature, cfg.top_p = UPDATE_RESPONSE, TEMPERATURE, TOP_P
  sampling = SamplingConfig(max_new_tokens=UPDATE_RESPONSE, temperature=TEMPERATURE, top_p=TOP_P)
  tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
  step = make_rl_step(model, tx, cfg, sampling)
  rng = np.random.default_rng(2)
  n, r = UPDATE_ROWS, UPDATE_RESPONSE
  old_logp = jnp.asarray(-rng.uniform(0.5, 3.0, (n, r)), jnp.float32)
  batch = TrainBatch(
      tokens=jnp.asarray(update_tokens(model.cfg.vocab_size), jnp.int32),
      attention_mask=jnp.ones((n, UPDATE_PROMPT + r), bool), loss_mask=jnp.ones((n, r), bool),
      old_logp=old_logp, rollout_logp=old_logp,
      advantages=jnp.asarray(np.repeat(rng.normal(size=(n, 1)), r, 1), jnp.float32),
      token_weights=jnp.ones((n, r), jnp.float32), group_ids=jnp.arange(n, dtype=jnp.int32) // 4,
      row_source=jnp.zeros(n, jnp.int32))
  inputs = default_step_inputs(cfg)
  box = {"state": init_train_state(params, tx)}    # the step donates it
  del params
  losses = []

  def run():
    box["state"], metrics = step(box["state"], batch, inputs)
    losses.append(float(metrics["loss"].value))
    jax.block_until_ready(box["state"])
  what = f"make_rl_step({cfg.policy_loss}, {cfg.aggregation}, T={TEMPERATURE}, top_p={TOP_P})+optax.adamw"
  return run, losses, what


def torch_update(folder: str, dtype: str) -> tuple:
  """An eager Qwen3ForCausalLM fwd + labels loss + bwd + fused AdamW step (f32 weights; bf16: autocast)."""
  import torch
  import transformers
  torch.set_num_threads(THREADS)
  quiet_transformers()
  model = transformers.Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
  run, losses = torch_train_step(model, update_tokens(model.config.vocab_size), dtype == "bfloat16", LR,
                                 WEIGHT_DECAY)
  return run, losses, "transformers Qwen3ForCausalLM eager+labels loss+torch AdamW(fused)"


def update_side(args) -> dict:
  """Runs in the subprocess: one side's warm-up step, then `--update-reps` timed steps; its own peak RSS."""
  rss_before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  run, losses, what = (jax_update if args.side == "jax" else torch_update)(args.folder, args.dtype)
  rss_loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
  t0 = time.perf_counter()
  run()
  first = time.perf_counter() - t0
  times = []
  for _ in range(args.update_reps):
    t0 = time.perf_counter()
    run()
    times.append(time.perf_counter() - t0)
  return {"side": args.side, "what": what, "step_s": statistics.median(times), "first_step_s": first,
          "loss": losses[0], "peak_rss_kb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
          "rss_before_load_kb": rss_before, "rss_after_load_kb": rss_loaded}


def run_side(args, folder: str, side: str, dtype: str) -> dict:
  """One side of (d) in a fresh process; {"error": ...} if it fails or runs past `--update-timeout`."""
  cmd = [sys.executable, os.path.abspath(__file__), "--part", "update", "--side", side, "--dtypes", dtype,
         "--folder", folder, "--update-reps", str(args.update_reps)] + (["--small"] if args.small else [])
  try:
    out = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, check=True, timeout=args.update_timeout).stdout
  except subprocess.TimeoutExpired:
    return {"error": f"timed out after {args.update_timeout} s"}
  except subprocess.CalledProcessError as e:
    return {"error": f"exit status {e.returncode}"}
  return json.loads(out.strip().splitlines()[-1])


# Without bf16 instructions torch's CPU bf16 matmuls of the backward pass (transposed operands) take a naive
# path: on the AVX2 EPYC one layer's autocast backward of 8 x 192 tokens took 300-360 s (f32: 5.6 s), 99% of
# it in aten::mm, so a 28-layer step would run for hours. Such CPUs skip that side unless asked.
BF16_ISA = ("avx512_bf16", "amx_bf16")


def bench_update(args, folder: str, shape: dict, dtype: str) -> dict:
  ours = run_side(args, folder, "jax", dtype)
  isa = cpu_info()["cpu_isa"]
  if dtype == "bfloat16" and not any(f in isa for f in BF16_ISA) and not args.torch_bf16_update:
    peer = {"error": f"skipped: torch CPU bf16 backward matmuls are ~60x slower than f32 without "
                     f"{'/'.join(BF16_ISA)} (this CPU: {isa}); --torch-bf16-update runs it"}
  else:
    peer = run_side(args, folder, "torch", dtype)
  n = UPDATE_ROWS * (UPDATE_PROMPT + UPDATE_RESPONSE)
  gb = lambda kb: round(kb / 2 ** 20, 2)  # noqa: E731   ru_maxrss is in KiB on Linux
  result = {**base_fields(args, shape, dtype, "update"), "rows": UPDATE_ROWS,
            "seq": UPDATE_PROMPT + UPDATE_RESPONSE, "response": UPDATE_RESPONSE, "reps": args.update_reps,
            "master_weights": "float32"}
  for prefix, side in (("", ours), ("peer_", peer)):
    if "error" in side:
      result[f"{prefix}error"] = side["error"]
      continue
    result.update({f"{prefix}what": side["what"], f"{prefix}update_s": round(side["step_s"], 3),
                   f"{prefix}update_tokens_per_s": round(n / side["step_s"], 1),
                   f"{prefix}first_step_s": round(side["first_step_s"], 2),
                   f"{prefix}peak_rss_gb": gb(side["peak_rss_kb"]),
                   f"{prefix}rss_after_load_gb": gb(side["rss_after_load_kb"]),
                   f"{prefix}loss": round(side["loss"], 4)})
  if "error" not in ours and "error" not in peer:
    result["update_speedup_vs_torch"] = round(peer["step_s"] / ours["step_s"], 3)
  return result


# ----------------------------------------------------------------------------------------------------- main

PARTS = ("load", "sample", "top_p", "update")


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--dtypes", default="float32,bfloat16", help="compute dtypes, comma-separated")
  parser.add_argument("--parts", default=",".join(PARTS), help=f"which of {','.join(PARTS)} to run")
  parser.add_argument("--small", action="store_true", help="smoke test: 4 layers, vocabulary 32,000")
  parser.add_argument("--reps", type=int, default=None, help="rounds of (b) (default 1; --small 3)")
  parser.add_argument("--load-reps", type=int, default=3, help="rounds of (a)")
  parser.add_argument("--top-p-reps", type=int, default=10, help="rounds of (c)")
  parser.add_argument("--update-reps", type=int, default=1, help="timed steps of (d) after the warm-up")
  parser.add_argument("--update-timeout", type=int, default=1800, help="seconds allowed to each side of (d)")
  parser.add_argument("--torch-bf16-update", action="store_true",
                      help="run torch's bf16 side of (d) even on a CPU without bf16 instructions (hours)")
  parser.add_argument("--part", choices=("update",), help=argparse.SUPPRESS)     # the (d) subprocess
  parser.add_argument("--side", choices=("jax", "torch"), help=argparse.SUPPRESS)
  parser.add_argument("--folder", help=argparse.SUPPRESS)
  add_tuned_malloc_arg(parser)
  args = parser.parse_args()
  apply_tuned_malloc_arg(args)
  if args.part == "update":
    args.dtype = args.dtypes
    print(json.dumps(update_side(args)), flush=True)
    return
  quiet_transformers()
  args.reps = args.reps or (3 if args.small else 1)
  parts = args.parts.split(",")
  unknown = set(parts) - set(PARTS)
  if unknown:
    parser.error(f"unknown parts {sorted(unknown)}; choose from {PARTS}")
  shape = SMALL if args.small else QWEN3_06B
  with tempfile.TemporaryDirectory() as tmp:
    folder = os.path.join(tmp, "model")
    build_checkpoint(folder, shape)
    for dtype in args.dtypes.split(","):
      decode_step = None
      if "load" in parts:
        print(json.dumps(bench_load(args, folder, shape, dtype)), flush=True)
      if "sample" in parts:
        result = bench_sample(args, folder, shape, dtype)
        decode_step = result["decode_step_ms"] / 1e3
        print(json.dumps(result), flush=True)
      if "top_p" in parts:
        print(json.dumps(bench_top_p(args, folder, shape, dtype, decode_step)), flush=True)
      if "update" in parts:
        print(json.dumps(bench_update(args, folder, shape, dtype)), flush=True)


if __name__ == "__main__":
  main()
