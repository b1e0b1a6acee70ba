"""Training-step memory of LoGRA and LoRA against AdamW: the compiled update step's `memory_analysis()`.

For one model size, prints one JSON line per configuration (issue 20's "LoGRA / LoRA / AdamW table"). Each
configuration is the trainer's own switches (`optimizer.name=logra` + `logra_rank`, `model.lora.rank`,
`optimizer.kl_target`), built as the RL stage builds them (`make_optimizer`, `gradient_path`,
`lora.add_adapters`, `init_train_state`, `make_rl_step` with the train state donated; `--step=sft`:
`make_sft_step`), and only compiled, `step.lower(...).compile()`, on abstract shapes: nothing is allocated
or run, so a 100M-parameter step fits the 2-core CPU.

  adamw          AdamW on every parameter (the peer: the `*_vs_adamw` ratios divide by its line)
  lora_r16/r64   LoRA of that rank on qkv, o, gate_up, down (alpha 16), the base frozen, AdamW on the adapters
  logra_r16/r64  LoGRA sketches of that rank on the four projections (RowAdam), AdamW on the rest
  logra_full     the full-rank control: logra_rank = the model width D, the largest rank every projection admits
                 (the trainer does not expose the `identity` projection, and a rank must be <= each kernel's
                 output width): full for o and down ([.., D] outputs), D of the (H+2KV)·hd outputs of qkv and of
                 the 2F of gate_up
  logra_r16_kl   logra_r16 with predicted-KL control (`optimizer.kl_target`; the probe's JVP is in the step)

Sizes (`--size`):
  default  configs/grpo_arith.py preset cpu (character tokenizer, vocabulary 92), the RL stage's own update
           batch: 32 prompts x 8 samples = 256 rows of 8 prompt + 5 response tokens
  100m     a Qwen3-style decoder of 100.1M parameters: vocabulary 32,000 (a Llama/Mistral-sized tokenizer; the
           tied embedding is 24.6M of them, which LoGRA does not sketch), D 768, 12 layers, 12 query / 4 KV
           heads of 64, MLP 2048, tied embeddings; batch 8 x 128 tokens (64 prompt + 64 response)

Fields of a line: `*_bytes` from `memory_analysis()` (argument, output, temp, generated code, alias: the output
bytes that reuse a donated argument's buffer; `peak_memory_bytes` is what XLA reports, on XLA:CPU about the
argument bytes, not a peak). `total_bytes` = arguments + temporaries + outputs, the sum issue 20 names, with
aliased outputs NOT subtracted (the definition of tests/optim/test_logra_training.py); `live_bytes` =
`total_bytes` - `alias_bytes`, the bytes the step holds when the donated state's buffers are reused. Both
ratios to AdamW are given (`total_vs_adamw`, `live_vs_adamw`); the target (>= 45.7% lower than AdamW, LoGRA's
paper at 7B) is judged on `total_bytes` (`target_met`, logra lines only). `opt_state_bytes`: the sum of the
optimizer state's leaves; `grad_bytes`: the differentiated tree (dense gradients, LoRA adapters, LoGRA
sketches plus the unsketched leaves' gradients). Unless `--no-breakdown`, the forward + backward alone
(`value_and_grad` of the same loss w.r.t. the same tree, no optimizer; the gradient is its output) is compiled
too: `fwd_bwd_temp_bytes`, the activations kept for the backward pass and its workspace, and
`step_minus_fwd_bwd_temp_bytes`, what the step's temporaries hold beyond them: the gradient and the
optimizer's buffers (Adam's, LoGRA's dense D·Pᵀ), net of the activations' space they reuse once freed.
`lower_s` / `compile_s`: wall seconds to trace and to compile the step. `--step=sft` compiles the SFT step
(`make_sft_step`) on the same batch shape (all tokens in the loss).

  python benchmarks/memory.py [--size default|100m] [--step rl|sft] [--batch N] [--seq T] [--prompt P]
                              [--configs adamw,lora_r16,...] [--no-breakdown]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from benchmarks._common import commit, cpu_info  # noqa: E402
from rlkit.core.types import TrainBatch  # noqa: E402
from rlkit.models import lora  # noqa: E402
from rlkit.models.transformer import Transformer, TransformerConfig  # noqa: E402
from rlkit.optim.optimizers import gradient_path, make_optimizer  # noqa: E402
from rlkit.rollout.sampler import SamplingConfig  # noqa: E402
from rlkit.train.models import tokenizer_from_spec, transformer_config  # noqa: E402
from rlkit.train.steps import (default_step_inputs, init_train_state, make_rl_loss, make_rl_step,  # noqa: E402
                               make_sft_step, rl_counts)

# name -> (optimizer.name, logra_rank ("width": the model's D), model.lora.rank, optimizer.kl_target)
CONFIGS = {
    "adamw": ("adamw", 0, 0, 0.0),
    "lora_r16": ("adamw", 0, 16, 0.0),
    "lora_r64": ("adamw", 0, 64, 0.0),
    "logra_r16": ("logra", 16, 0, 0.0),
    "logra_r64": ("logra", 64, 0, 0.0),
    "logra_full": ("logra", "width", 0, 0.0),
    "logra_r16_kl": ("logra", 16, 0, 1e-3),
}
MODEL_100M = TransformerConfig(vocab_size=32_000, hidden_size=768, intermediate_size=2048, num_layers=12,
                               num_heads=12, num_kv_heads=4, head_dim=64, rope_theta=1_000_000.0,
                               tie_word_embeddings=True)
TARGET_REDUCTION = 0.457      # LoGRA (arXiv 2610.06647): up to 45.7% less training memory than dense Adam


def grpo_arith_cpu():
  spec = importlib.util.spec_from_file_location("grpo_arith", os.path.join(ROOT, "configs", "grpo_arith.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config("cpu")


def size_setup(size: str, batch, seq, prompt):
  """(TransformerConfig, tokenizer description, rows, prompt tokens, response tokens, RL section)."""
  config = grpo_arith_cpu()
  rl = config.rl
  if size == "default":
    tok = tokenizer_from_spec(config.tokenizer)
    cfg = transformer_config(config.model, tok.vocab_size)
    rows = batch or rl.prompts_per_step * rl.group_size // (rl.minibatches or 1)
    p = prompt or config.data.max_prompt_len
    t = seq or p + rl.max_new_tokens
    return cfg, f"char ({tok.vocab_size})", rows, p, t - p, rl
  cfg = MODEL_100M
  rows, t = batch or 8, seq or 128
  p = prompt or t // 2
  return cfg, f"32k-sized ({cfg.vocab_size}, random ids)", rows, p, t - p, rl


def abstract_batch(rows: int, prompt: int, response: int, step: str):
  s = jax.ShapeDtypeStruct
  if step == "sft":
    return {"tokens": s((rows, prompt + response), jnp.int32), "attention_mask": s((rows, prompt + response), bool),
            "loss_mask": s((rows, prompt + response), bool)}
  f = lambda: s((rows, response), jnp.float32)  # noqa: E731
  return TrainBatch(tokens=s((rows, prompt + response), jnp.int32), attention_mask=s((rows, prompt + response), bool),
                    loss_mask=s((rows, response), bool), old_logp=f(), rollout_logp=f(), advantages=f(),
                    token_weights=f(), group_ids=s((rows,), jnp.int32), row_source=s((rows,), jnp.int32))


def nbytes(tree) -> int:
  return int(sum(np.prod(x.shape) * np.dtype(x.dtype).itemsize for x in jax.tree.leaves(tree)))


def count(tree) -> int:
  return int(sum(np.prod(x.shape) for x in jax.tree.leaves(tree)))


def measure(name: str, cfg: TransformerConfig, rl, rows: int, prompt: int, response: int, step: str,
            breakdown: bool) -> dict:
  """One configuration's compiled step: its memory_analysis and the state's sizes (abstract shapes only)."""
  opt_name, logra_rank, lora_rank, kl_target = CONFIGS[name]
  rl = rl.copy_and_resolve_references()
  rl.max_new_tokens = response
  section = rl.optimizer
  section.name, section.kl_target = opt_name, kl_target
  if opt_name == "logra":
    section.logra_rank = cfg.hidden_size if logra_rank == "width" else logra_rank
  lora_section = lora.lora_defaults()
  lora_section.rank = lora_rank
  model = Transformer(cfg)
  tx, path = make_optimizer(section, rl.steps), gradient_path(section)

  def init(key):
    params = model.init(key, jnp.zeros((1, 1), jnp.int32))["params"]
    return init_train_state(lora.add_adapters(params, lora_section, jax.random.fold_in(key, 1)), tx, path)

  state = jax.eval_shape(init, jax.random.key(0))
  batch = abstract_batch(rows, prompt, response, step)
  sampling = SamplingConfig(max_new_tokens=response, temperature=rl.temperature, top_k=rl.top_k, top_p=rl.top_p)
  if step == "sft":
    fn, inputs = make_sft_step(model, tx, 1, path), {}
  else:
    fn, inputs = make_rl_step(model, tx, rl, sampling, 1, path=path), default_step_inputs(rl)
  t0 = time.perf_counter()
  lowered = fn.lower(state, batch, inputs)
  t1 = time.perf_counter()
  m = lowered.compile().memory_analysis()
  t2 = time.perf_counter()
  grads = jax.eval_shape(path.grad_args, path.trainable(state.params), state.opt_state)
  params = state.params
  projections = sum(count({k: v for k, v in params[f"layers_{i}"][mod].items() if k in lora.TARGETS})
                    for i in range(cfg.num_layers) for mod in ("attn", "mlp"))
  adapters = sum(int(np.prod(x.shape)) for kp, x in jax.tree_util.tree_flatten_with_path(params)[0]
                 if str(kp[-1].key).endswith(lora.SUFFIXES))
  total = m.argument_size_in_bytes + m.temp_size_in_bytes + m.output_size_in_bytes
  out = {
      "benchmark": "memory", "config": name, "step": step, "optimizer": opt_name,
      "logra_rank": section.logra_rank if opt_name == "logra" else 0, "lora_rank": lora_rank, "kl_target": kl_target,
      "model": {"vocab": cfg.vocab_size, "hidden": cfg.hidden_size, "layers": cfg.num_layers,
                "heads": cfg.num_heads, "kv_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim,
                "mlp": cfg.intermediate_size, "tied_embeddings": cfg.tie_word_embeddings},
      "batch": rows, "seq": prompt + response, "prompt": prompt, "response": response,
      "params": count(params) - adapters, "params_embedding": count(params["embedding"]),
      "params_projections": projections, "params_adapters": adapters,
      "param_bytes": nbytes(params), "opt_state_bytes": nbytes(state.opt_state), "grad_bytes": nbytes(grads),
      "argument_bytes": m.argument_size_in_bytes, "output_bytes": m.output_size_in_bytes,
      "temp_bytes": m.temp_size_in_bytes, "generated_code_bytes": m.generated_code_size_in_bytes,
      "alias_bytes": m.alias_size_in_bytes, "peak_memory_bytes": getattr(m, "peak_memory_in_bytes", 0),
      "total_bytes": total, "live_bytes": total - m.alias_size_in_bytes,
      "lower_s": round(t1 - t0, 2), "compile_s": round(t2 - t1, 2),
  }
  if breakdown:
    out.update(fwd_bwd(model, rl, sampling, path, state, batch, inputs, step, out))
  return out


def fwd_bwd(model, rl, sampling, path, state, batch, inputs, step: str, out: dict) -> dict:
  """The forward + backward of the step alone (same loss, same differentiated tree, no optimizer), compiled."""
  if step == "sft":
    from rlkit.objectives import aggregate, token_logprobs

    def loss_fn(params, mb, step_inputs):      # make_sft_step's loss (rlkit/train/steps.py)
      logits = model.apply({"params": params}, mb["tokens"], attention_mask=mb["attention_mask"])
      targets = jnp.roll(mb["tokens"], -1, axis=1)
      mask = jnp.pad(mb["loss_mask"][:, 1:], ((0, 0), (0, 1)))
      return aggregate(-token_logprobs(logits, targets), mask, "token-mean",
                       num_tokens_global=jnp.maximum(jnp.sum(mask), 1)), {}
    counts = lambda b: {}  # noqa: E731
  else:
    loss_fn, counts = make_rl_loss(model, rl, sampling), rl_counts

  def grad(params, opt_state, b, step_inputs):
    args = path.grad_args(path.trainable(params), opt_state)
    step_inputs = dict(step_inputs, **counts(b))
    return jax.value_and_grad(lambda a: loss_fn(path.model_params(a, params, opt_state), b, step_inputs),
                              has_aux=True)(args)

  t0 = time.perf_counter()
  m = jax.jit(grad).lower(state.params, state.opt_state, batch, inputs).compile().memory_analysis()
  return {"fwd_bwd_temp_bytes": m.temp_size_in_bytes, "fwd_bwd_output_bytes": m.output_size_in_bytes,
          "step_minus_fwd_bwd_temp_bytes": out["temp_bytes"] - m.temp_size_in_bytes,
          "fwd_bwd_compile_s": round(time.perf_counter() - t0, 2)}


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--size", default="default", choices=("default", "100m"))
  parser.add_argument("--step", default="rl", choices=("rl", "sft"), help="the update step compiled")
  parser.add_argument("--batch", type=int, default=0, help="rows (0: the size's default)")
  parser.add_argument("--seq", type=int, default=0, help="tokens per row, prompt + response (0: the size's default)")
  parser.add_argument("--prompt", type=int, default=0, help="prompt tokens of a row (0: the size's default)")
  parser.add_argument("--configs", default=",".join(CONFIGS), help="comma-separated names of " + ", ".join(CONFIGS))
  parser.add_argument("--no-breakdown", dest="breakdown", action="store_false",
                      help="skip compiling the forward + backward alone (halves the compile time)")
  args = parser.parse_args()
  names = [n for n in args.configs.split(",") if n]
  bad = [n for n in names if n not in CONFIGS]
  if bad:
    parser.error(f"unknown configs {bad}; known: {', '.join(CONFIGS)}")
  if "adamw" not in names:
    names.insert(0, "adamw")       # the peer of every ratio, measured in the same process
  names.sort(key=lambda n: n != "adamw")
  cfg, tokenizer, rows, prompt, response, rl = size_setup(args.size, args.batch, args.seq, args.prompt)
  env = {"size": args.size, "tokenizer": tokenizer, "commit": commit(), "jax": jax.__version__, **cpu_info()}
  adamw = None
  for name in names:
    r = measure(name, cfg, rl, rows, prompt, response, args.step, args.breakdown)
    adamw = adamw or r
    r["total_vs_adamw"] = round(r["total_bytes"] / adamw["total_bytes"], 4)
    r["live_vs_adamw"] = round(r["live_bytes"] / adamw["live_bytes"], 4)
    r["temp_vs_adamw"] = round(r["temp_bytes"] / adamw["temp_bytes"], 4)
    r["opt_state_vs_adamw"] = round(r["opt_state_bytes"] / adamw["opt_state_bytes"], 4)
    if r["optimizer"] == "logra":
      r.update(target_reduction=TARGET_REDUCTION, reduction_vs_adamw=round(1 - r["total_vs_adamw"], 4),
               target_met=bool(1 - r["total_vs_adamw"] >= TARGET_REDUCTION))
    print(json.dumps({**{k: r[k] for k in ("benchmark", "config")}, **env, **r}), flush=True)


if __name__ == "__main__":
  main()
