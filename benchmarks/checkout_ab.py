"""rlkit's sampler in two checkouts of this repository, A/B: did a code change make `generate` slower?

  python benchmarks/checkout_ab.py --before DIR [--after DIR] [--size M] [--cpu-devices 2] [--mesh tensor]

`sampler.py` compares rlkit with `transformers` in one process; across commits its ratio moves with the
peer's own noise (this shared machine drifts by 30% within minutes). Here the peer is the other checkout
(e.g. `git worktree add /tmp/before <commit>`): each round runs one child process per checkout, alternating
which goes first, and each child builds the same model from the same seed, compiles `generate`, and times
`--reps` calls (median). One JSON line: both sides' tokens/s per round and the median of the per-round ratios
after / before (1.0: no change; the spread of the rounds shows the noise).

Both sides: batch 64, prompt 16, 64 new tokens, temperature 1 (as `sampler.py`), `--dtype` compute, on
`--cpu-devices` XLA devices with the batch (`--mesh data`) or the parameters (`--mesh tensor`) split.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BATCH, PROMPT, NEW = 64, 16, 64


def child(args) -> None:
  """Times `generate` of the checkout at args.checkout (first on sys.path); prints {seconds, commit}."""
  sys.path.insert(0, args.checkout)
  from rlkit.parallel import set_cpu_devices
  if args.cpu_devices > 1:
    set_cpu_devices(args.cpu_devices)
  import time

  import jax
  import jax.numpy as jnp
  import numpy as np

  from benchmarks._common import SIZES, commit
  from rlkit.models.transformer import Transformer, init_params
  from rlkit.parallel import make_mesh, shard_batch, shard_params
  from rlkit.rollout.sampler import SamplingConfig, generate

  cfg = SIZES[args.size].replace(dtype=args.dtype, param_dtype=args.dtype)
  params = jax.tree.map(lambda x: x.astype(jnp.dtype(args.dtype)), init_params(SIZES[args.size], jax.random.key(0)))
  prompt = jnp.asarray(np.random.default_rng(0).integers(3, cfg.vocab_size, (BATCH, PROMPT)), jnp.int32)
  mask = jnp.ones_like(prompt, bool)
  mesh = make_mesh({args.mesh: -1})
  params, (prompt, mask) = shard_params(params, mesh), shard_batch((prompt, mask), mesh)
  model, sc, key = Transformer(cfg), SamplingConfig(max_new_tokens=NEW, temperature=1.0), jax.random.key(0)
  times = []
  with jax.set_mesh(mesh):
    for _ in range(args.reps + 1):                     # the first call compiles
      t0 = time.perf_counter()
      generate(model, params, prompt, mask, key, sc).response.block_until_ready()
      times.append(time.perf_counter() - t0)
  print(json.dumps({"seconds": statistics.median(times[1:]), "commit": commit()}))


def run_side(args, checkout: str) -> dict:
  cmd = [sys.executable, os.path.abspath(__file__), "--child", "--checkout", checkout, "--size", args.size,
         "--cpu-devices", str(args.cpu_devices), "--mesh", args.mesh, "--reps", str(args.reps),
         "--dtype", args.dtype]
  out = subprocess.run(cmd, cwd=checkout, capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONPATH=checkout))
  return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--before", help="the checkout to compare against (a worktree of the older commit)")
  p.add_argument("--after", default=ROOT, help="the checkout under test (default: this one)")
  p.add_argument("--size", default="M")
  p.add_argument("--cpu-devices", type=int, default=2)
  p.add_argument("--mesh", choices=("data", "tensor"), default="tensor")
  p.add_argument("--dtype", default="float32")
  p.add_argument("--rounds", type=int, default=3)
  p.add_argument("--reps", type=int, default=3, help="timed generate calls per child (median)")
  p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
  p.add_argument("--checkout", help=argparse.SUPPRESS)
  args = p.parse_args()
  if args.child:
    return child(args)
  if not args.before:
    p.error("--before DIR is required (e.g. git worktree add /tmp/before <commit>)")
  sides = {"before": os.path.abspath(args.before), "after": os.path.abspath(args.after)}
  rounds = []
  for r in range(args.rounds):
    order = ("before", "after") if r % 2 == 0 else ("after", "before")
    rounds.append({side: run_side(args, sides[side]) for side in order})
  tokens = BATCH * NEW
  sys.path.insert(0, ROOT)
  from benchmarks._common import cpu_info
  import jax
  print(json.dumps({
      "benchmark": "checkout_ab", "size": args.size, "cpu_devices": args.cpu_devices, "mesh": args.mesh,
      "dtype": args.dtype, "batch": BATCH, "prompt": PROMPT, "new_tokens": NEW, "rounds": args.rounds,
      "reps": args.reps, "before": rounds[0]["before"]["commit"], "after": rounds[0]["after"]["commit"],
      "jax": jax.__version__, **cpu_info(),
      "before_tokens_per_s": [round(tokens / x["before"]["seconds"], 1) for x in rounds],
      "after_tokens_per_s": [round(tokens / x["after"]["seconds"], 1) for x in rounds],
      "after_vs_before": round(statistics.median(x["before"]["seconds"] / x["after"]["seconds"] for x in rounds),
                               3)}))


if __name__ == "__main__":
  main()
