"""RL step cost: where one GRPO iteration's wall time goes, and our update step against a PyTorch step.

Prints two JSON lines:

(a) `"part": "iteration"` — one RL iteration of `configs/grpo_arith.py` (preset cpu), built the way
    `rlkit/train/run.py` builds it (its `build_*` functions, data in a temp dir) and timed phase by phase,
    calling the phases of `rlkit/train/rl_stage.py` on its default path (filter none, no augmenter, no
    overlong penalty, no KL reference): data (next prompt batch), generate (`phases.collect`: the KV-cache
    sampler with the config's sampling settings), reward (`phases.reward`: decode + the verifier in its
    time-limited worker), score (filter rows, group advantages, `phases.score`: trainer re-score of old
    log-probs and the mismatch), update (`phases.update.ppo_updates` of `make_rl_step`, ppo_epochs x
    minibatches). Reports generation tokens/s (generated
    tokens / generate time), update tokens/s (real sequence tokens x epochs / update time), and each phase's
    share of the iteration (median phase time / median iteration time). Params are the config's random
    init (no SFT stage first), so rewards are ~0 and most rows run the full response budget.
(b) `"part": "update_vs_torch"` — the update on the M model (benchmarks/sampler.py sizes), batch 8 x 256
    random tokens: rlkit's `make_sft_step` (next-token cross-entropy, optax.adamw, one jitted step with the
    state donated; the RL policy loss adds only elementwise work to the same matmuls) against
    `transformers.Qwen3ForCausalLM` with the same weights (via `hf.save` + `from_pretrained`), eager
    forward + `labels=` loss + backward + `torch.optim.AdamW(fused=True)`, 2 threads. In f32, and in bf16
    compute with f32 master weights on both sides (`TransformerConfig(dtype="bfloat16")` vs
    `torch.autocast("cpu", torch.bfloat16)`). `update_speedup_vs_torch` = torch step time / ours. Our step
    runs twice: with `attention="xla"` (unprefixed keys) and with `attention="cpu_kernel"` (`kernel_` keys;
    the C++ attention kernel of `kernels/cpu_attention.py`).
    The first (warm-up) step's loss of each side is reported: same weights and tokens give the same loss.

  python benchmarks/rl_step.py [--reps 10] [--update-reps 5] [--quick]

Timings are medians over the reps after one warm-up. In (b) the six steps (ours twice and torch, f32 and bf16)
take turns, two steps each per round with the second one timed (`_common.interleaved_median_times`), so
all six see the same spells of a noisy machine. `--quick` (a smoke test): 3 iteration reps, 1 update
rep, and batch 2 x 128 in (b).
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Callable

os.environ.setdefault("HF_HUB_OFFLINE", "1")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from absl import logging  # noqa: E402

from benchmarks._common import (SIZES, add_tuned_malloc_arg, apply_tuned_malloc_arg, commit, cpu_info,
                               interleaved_median_times, torch_train_step)  # noqa: E402
from rlkit.data.pipeline import make_iterator  # noqa: E402
from rlkit.models import hf  # noqa: E402
from rlkit.models.transformer import Transformer, init_params, num_params  # noqa: E402
from rlkit.optim.optimizers import make_optimizer  # noqa: E402
from rlkit.parallel.host_memory import tuned_malloc_active  # noqa: E402
from rlkit.parallel.mesh import mesh_from_config  # noqa: E402
from rlkit.parallel.rules import shard_batch  # noqa: E402
from rlkit.rewards import REWARDS, VerifierExecutor  # noqa: E402
from rlkit.rollout.scoring import make_scorer  # noqa: E402
from rlkit.train.models import build_model, tokenizer_from_spec  # noqa: E402
from rlkit.train.phases.advantages import token_advantages  # noqa: E402
from rlkit.train.phases.collect import collect  # noqa: E402
from rlkit.train.phases.filter import FILTERS, select_rows  # noqa: E402
from rlkit.train.phases.reward import compute_rewards  # noqa: E402
from rlkit.train.phases.score import score, train_batch  # noqa: E402
from rlkit.train.rl_metrics import mismatch  # noqa: E402
from rlkit.train.phases.update import ppo_updates  # noqa: E402
from rlkit.train.phases.collect import sampling_config  # noqa: E402
from rlkit.train.run import build_data, build_task  # noqa: E402
from rlkit.train.steps import default_step_inputs, init_train_state, make_rl_step, make_sft_step  # noqa: E402

PHASES = ("data", "generate", "reward", "score", "update")
LR, WEIGHT_DECAY = 1e-4, 0.01


def load_config(preset: str):
  spec = importlib.util.spec_from_file_location("grpo_arith", os.path.join(ROOT, "configs", "grpo_arith.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module.get_config(preset)


# ------------------------------------------------------------------------------------ (a) one RL iteration

def bench_iteration(reps: int) -> dict:
  config = load_config("cpu")
  cfg = config.rl
  key = jax.random.key(config.seed)
  mesh = mesh_from_config(config.mesh)
  tok, task = tokenizer_from_spec(config.tokenizer), build_task(config)
  with tempfile.TemporaryDirectory() as tmp, jax.set_mesh(mesh), VerifierExecutor(cfg.reward.timeout_s) as ex:
    sources = build_data(config, tmp)
    model, params = build_model(config.model, tok, jax.random.fold_in(key, 1), mesh)
    put_batch = lambda b: shard_batch(b, mesh)  # noqa: E731
    tx = make_optimizer(cfg.optimizer, cfg.steps * cfg.ppo_epochs * cfg.minibatches)
    sampling = sampling_config(cfg, tok)
    step_fn = make_rl_step(model, tx, cfg, sampling, cfg.micro_batches)
    scorer = make_scorer(model, sampling)
    reward_fn = REWARDS.get(cfg.reward.name)(task, ex, **dict(cfg.reward.kwargs))
    it = make_iterator(sources["train"], cfg.prompts_per_step, config.seed + 1000 * config.stages.index("rl"), tok,
                       config.data.max_prompt_len)
    n_rows = cfg.prompts_per_step * cfg.group_size
    stage_key = jax.random.fold_in(key, 2)
    train = init_train_state(params, tx)

    def iteration(step: int):
      nonlocal train
      k = jax.random.fold_in(stage_key, step)
      t = {"start": time.perf_counter()}
      batch = next(it)
      t["data"] = time.perf_counter()
      samples = collect(model, train.params, batch, jax.random.fold_in(k, 0), sampling, cfg.group_size, put_batch)
      jax.block_until_ready(samples.rollout)
      rollout = samples.rollout
      t["generate"] = time.perf_counter()
      rewards = compute_rewards(reward_fn, samples, tok, cfg)
      t["reward"] = time.perf_counter()
      selection = FILTERS.get(cfg.filter)(rewards.rewards, cfg.group_size, cfg.prompts_per_step)
      samples = samples.take(select_rows(selection, len(samples), cfg.group_size, cfg.prompts_per_step))
      adv = token_advantages(cfg.advantage, rewards.rewards, cfg.group_size, cfg.max_new_tokens, cfg.adv_eps)
      data = score(train_batch(samples, adv, put_batch), {"policy": (scorer, train.params)})
      mismatch(data)
      t["score"] = time.perf_counter()
      train, _, _ = ppo_updates(step_fn, train, data, k, cfg.ppo_epochs, cfg.minibatches,
                                default_step_inputs(cfg))
      t["update"] = time.perf_counter()
      times = {p: t[p] - t[prev] for prev, p in zip(("start",) + PHASES, PHASES)}
      times["total"] = t["update"] - t["start"]
      return times, int(np.asarray(rollout.lengths).sum()), int(np.asarray(rollout.attention_mask).sum())

    iteration(0)   # warm-up: compiles generate, score and the step
    runs = [iteration(step) for step in range(1, reps + 1)]
  med = {p: statistics.median(r[0][p] for r in runs) for p in PHASES + ("total",)}
  gen_tokens = statistics.median(r[1] for r in runs)
  return {
      "benchmark": "rl_step", "part": "iteration", "config": "configs/grpo_arith.py:cpu",
      "params": num_params(params), "rows": n_rows, "prompt_len": config.data.max_prompt_len,
      "max_new_tokens": cfg.max_new_tokens, "reps": reps, "commit": commit(), "jax": jax.__version__,
      **cpu_info(), "tuned_malloc": tuned_malloc_active(),
      "iteration_ms": round(1e3 * med["total"], 1),
      "gen_tokens_per_s": round(statistics.median(r[1] / r[0]["generate"] for r in runs), 1),
      "update_tokens_per_s": round(statistics.median(cfg.ppo_epochs * r[2] / r[0]["update"] for r in runs), 1),
      "mean_response_len": round(gen_tokens / n_rows, 2),
      **{f"{p}_ms": round(1e3 * med[p], 1) for p in PHASES},
      **{f"{p}_share": round(med[p] / med["total"], 3) for p in PHASES},
  }


# --------------------------------------------------------------------------- (b) update vs a PyTorch step

def ours_update(cfg, params, tokens: np.ndarray) -> tuple[Callable[[], None], list]:
  """One step of make_sft_step with optax.adamw, and the list its losses go to."""
  tx = optax.adamw(LR, weight_decay=WEIGHT_DECAY)
  step = make_sft_step(Transformer(cfg), tx)
  t = jnp.asarray(tokens, jnp.int32)
  ones = jnp.ones(t.shape, bool)
  batch = {"tokens": t, "attention_mask": ones, "loss_mask": ones}
  box = {"state": init_train_state(jax.tree.map(jnp.copy, params), tx)}   # the step donates
  losses = []

  def run():
    box["state"], metrics = step(box["state"], batch)
    losses.append(float(metrics["loss"].value))   # also waits for the step
    jax.block_until_ready(box["state"])
  return run, losses


def torch_update(folder: str, tokens: np.ndarray, bf16: bool) -> tuple[Callable[[], None], list]:
  """One eager Qwen3ForCausalLM fwd + bwd + fused AdamW step (f32 weights), and the list of its losses."""
  import torch
  import transformers
  torch.set_num_threads(2)
  model = transformers.Qwen3ForCausalLM.from_pretrained(folder, dtype=torch.float32).train()
  return torch_train_step(model, tokens, bf16, LR, WEIGHT_DECAY)


def bench_update(reps: int, batch: int, seq: int) -> dict:
  cfg = SIZES["M"]
  params = init_params(cfg, jax.random.key(0))
  tokens = np.random.default_rng(0).integers(3, cfg.vocab_size, (batch, seq))
  with tempfile.TemporaryDirectory() as tmp:
    folder = os.path.join(tmp, "model")
    hf.save(folder, cfg, params, model_type="qwen3")
    sides = {"peer": torch_update(folder, tokens, bf16=False),
             "peer_bf16": torch_update(folder, tokens, bf16=True)}
  for att, prefix in (("xla", ""), ("cpu_kernel", "kernel_")):
    sides[f"{prefix}ours"] = ours_update(cfg.replace(attention=att), params, tokens)
    sides[f"{prefix}ours_bf16"] = ours_update(cfg.replace(dtype="bfloat16", attention=att), params, tokens)
  times = interleaved_median_times({name: run for name, (run, _) in sides.items()}, reps)
  loss = {name: losses[0] for name, (_, losses) in sides.items()}     # each side's warm-up loss
  n = batch * seq
  result = {
      "benchmark": "rl_step", "part": "update_vs_torch", "size": "M", "params": num_params(params),
      "batch": batch, "seq": seq, "reps": reps, "commit": commit(), "jax": jax.__version__,
      **cpu_info(), "tuned_malloc": tuned_malloc_active(),
      "ours": "make_sft_step+optax.adamw", "peer": "transformers Qwen3ForCausalLM eager+torch AdamW(fused)",
      "peer_tokens_per_s": round(n / times["peer"], 1),
      "peer_bf16_tokens_per_s": round(n / times["peer_bf16"], 1),
  }
  # Unprefixed: model.attention="xla"; kernel_: "cpu_kernel" (kernels/cpu_attention.py).
  for prefix in ("", "kernel_"):
    for suffix, key in (("", prefix), ("_bf16", f"{prefix}bf16_")):
      ours, peer = times[f"{prefix}ours{suffix}"], times[f"peer{suffix}"]
      result[f"{key}update_tokens_per_s"] = round(n / ours, 1)
      result[f"{key}update_speedup_vs_torch"] = round(peer / ours, 3)
      result[f"{key}loss"] = round(loss[f"{prefix}ours{suffix}"], 4)
  result.update(peer_loss=round(loss["peer"], 4), peer_bf16_loss=round(loss["peer_bf16"], 4))
  return result


def main():
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--reps", type=int, default=10, help="RL iterations timed in (a)")
  parser.add_argument("--update-reps", type=int, default=5, help="rounds in (b): steps timed per side")
  add_tuned_malloc_arg(parser)
  parser.add_argument("--quick", action="store_true", help="smoke test: 3 / 1 reps, batch 2 x 128 in (b)")
  args = parser.parse_args()
  apply_tuned_malloc_arg(args)
  logging.set_verbosity(logging.ERROR)   # tfds announces the dataset it prepares
  import tensorflow_datasets as tfds
  tfds.disable_progress_bar()
  if args.quick:
    print(json.dumps(bench_iteration(3)), flush=True)
    print(json.dumps(bench_update(1, 2, 128)), flush=True)
  else:
    print(json.dumps(bench_iteration(args.reps)), flush=True)
    print(json.dumps(bench_update(args.update_reps, 8, 256)), flush=True)


if __name__ == "__main__":
  main()
