"""NeMo-DCR's sparse delta sync on a real RL run (methods/systems.md §2; the pre-registration is README.md).

  python experiments/sparse_sync/run.py --root=/tmp/sparse_sync --lock=/tmp/cpu.lock          # everything
  python experiments/sparse_sync/run.py --root=/tmp/sparse_sync --part=sft|rl|faults [--seeds=0] [--arms=main]
  python experiments/sparse_sync/summarize.py --root=/tmp/sparse_sync                        # results + plot

Parts (each skips what is already finished, so a part can be rerun):
  sft     the SFT stage of configs/grpo_arith.py (preset cpu) alone, one per seed, into ROOT/sft_s<seed>
          (one device, as the main job);
  rl      per arm and seed, the main job's RL stage from that checkpoint into ROOT/<arm>_s<seed>, with the
          trainer's float32 master on a train mesh data 2 x fsdp 4 and the sampler's bf16 copy on a mesh
          tensor 2 (8 simulated CPU devices), synced by sparse_delta after every update phase, verify_dense on:
          every iteration logs sync/* (rlkit/train/weight_sync.py). Arms (`ARMS`): `main` is the main job's RL
          stage (AdamW lr 1e-4) for 300 iterations; `lr1e-6` the same at lr 1e-6 (the spec's measurement plan:
          Adam at 1e-6..1e-5) for 100;
  faults  fault injection with rlkit.sync's API on the real parameters of each arm's first-seed run: its
          checkpoints at its last two steps (the trainer's master before and after one real update) on
          the same two meshes; a dropped message and a corrupted value, each must be detected (an ack is
          False), leave the baseline uncommitted, and a resync must restore bit-exactness; a clean sync after.
          Writes ROOT/faults.json.
"""
import argparse
import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
from experiments import driver  # noqa: E402

DEVICES = 8                                  # simulated CPU devices of the RL runs and the fault pass

CONFIG = "configs/grpo_arith.py"
# arm -> (RL iterations, its changes to the main job's RL stage); README: why not the main job's 900 iterations
ARMS = {"main": (300, []), "lr1e-6": (100, ["--config.rl.optimizer.lr=1e-6"])}
TRAIN_MESH = {"data": 2, "fsdp": 4, "tensor": 1}
SAMPLER_MESH = {"tensor": 2}
RL_ARGS = ["--config.stages=('rl',)", "--config.wandb.mode=disabled", "--config.progress=False",
           "--config.eval.batch_size=256",          # divides over the 8 devices (500 does not; chunks are padded)
           *[f"--config.mesh.{k}={v}" for k, v in TRAIN_MESH.items()],
           "--config.rl.sync.kind=sparse_delta", "--config.rl.sync.dtype=bfloat16",
           "--config.rl.sync.verify_dense=True",
           *[f"--config.rl.sync.mesh.{k}={v}" for k, v in SAMPLER_MESH.items()]]


def part_sft(args) -> list:
  failed = []
  for seed in args.seeds:
    path = os.path.join(args.root, f"sft_s{seed}")
    if driver.launch(args.root, path, CONFIG, ["--config.stages=('sft',)", f"--config.seed={seed}",
                                               "--config.wandb.mode=disabled", "--config.progress=False"],
                     args.lock, args.dry_run, "sparse_sync", name="sft", seed=seed):
      failed.append(path)
  return failed


def _simulate_devices() -> None:
  """XLA_FLAGS for DEVICES CPU devices, for this process's JAX (before it starts) and its launches."""
  os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") +
                             f" --xla_force_host_platform_device_count={DEVICES}").strip()


def part_rl(args) -> list:
  _simulate_devices()
  failed = []
  for seed in args.seeds:
    sft = os.path.join(args.root, f"sft_s{seed}")
    for arm in args.arms:
      path = os.path.join(args.root, f"{arm}_s{seed}")
      steps, changes = ARMS[arm]
      extra = [f"--config.seed={seed}", f"--config.model.path={sft}", f"--config.data.dir={sft}/data",
               f"--config.rl.steps={steps}", f"--config.checkpoint.every={steps - 1}",   # keeps steps-1, steps
               *changes]
      if driver.launch(args.root, path, CONFIG, RL_ARGS + extra, args.lock, args.dry_run, "sparse_sync",
                       name=arm, seed=seed):
        failed.append(path)
  return failed


# ---------------------------------------------------------------------------------------------------------
# Fault injection (in this process, under the lock)

def _faults(run_dir: str) -> dict:
  import jax
  import numpy as np

  from kernels.sparse_delta import bits_view
  from rlkit import sync
  from rlkit.parallel.mesh import make_mesh
  from rlkit.parallel.rules import param_shardings
  from rlkit.sync.sparse_delta import SparseLeaf
  from rlkit.train.models import load_model

  train_mesh = make_mesh(TRAIN_MESH)
  sampler_mesh = make_mesh(SAMPLER_MESH, jax.devices()[:2])
  load = lambda step: load_model(os.path.join(run_dir, "checkpoints", str(step)), mesh=train_mesh)[1]  # noqa
  steps = json.load(open(os.path.join(run_dir, "config.json")))["rl"]["steps"]
  before, after = load(steps - 1), load(steps)
  cfg = sync.SyncConfig(kind="sparse_delta", dtype="bfloat16")      # the run's sync (capacity 0.05, auto)
  shardings = param_shardings(jax.eval_shape(lambda p: sync.export_params(p, "bfloat16"), before), sampler_mesh)

  def exact(sampler, params) -> bool:
    dense = jax.tree.map(jax.device_put, sync.export_params(params, "bfloat16"), shardings)
    same = [(bits_view(a) == bits_view(b)).all() for a, b in zip(jax.tree.leaves(sampler), jax.tree.leaves(dense))]
    return bool(all(jax.device_get(same)))

  def drop(leaf, row):
    return leaf._replace(counts=leaf.counts.at[row, 0].set(0))                    # row's message never arrives

  def corrupt(leaf, row):
    return leaf._replace(values=leaf.values.at[row, 0].set(leaf.values[row, 0] ^ 1))   # one flipped bit

  out = {"run": run_dir, "steps": [steps - 1, steps]}
  for name, fault in (("drop", drop), ("corrupt", corrupt)):
    sampler, state, _ = sync.resync(before, shardings, cfg)
    payload, pending = sync.prepare(after, state, sampler, cfg)
    targets = [(i, leaf, int(np.flatnonzero(leaf.sent & (np.asarray(leaf.counts)[:, 0] > 0))[0]))
               for i, leaf in enumerate(payload.leaves)
               if isinstance(leaf, SparseLeaf) and (np.asarray(leaf.counts)[leaf.sent, 0] > 0).any()]
    if not targets:
      out[name] = {"skipped": "no tensor of this update was sent sparsely (none changed, or every changed one "
                              "overflowed to dense)", "change_rate": payload.stats["change_rate"]}
      continue
    i, leaf, row = targets[0]
    leaves = list(payload.leaves)
    leaves[i] = fault(leaf, row)
    received, acks, stats = sync.receive(payload._replace(leaves=tuple(leaves)), sampler, cfg)
    new_state, committed = sync.commit(state, pending, acks)
    kept = bool(new_state is state and all(
        bool((bits_view(a) == bits_view(b)).all()) for a, b in
        zip(jax.tree.leaves(new_state.baseline), jax.tree.leaves(sync.export_params(before, "bfloat16")))))
    exact_after_fault = exact(received, after)
    resynced, state2, _ = sync.resync(after, shardings, cfg, new_state)
    t0 = time.perf_counter()
    follow, state3, follow_stats = sync.sync_params(after, state2, resynced, cfg)   # unchanged: sends nothing
    out[name] = {"tensor": jax.tree_util.keystr(jax.tree_util.tree_flatten_with_path(before)[0][i][0]),
                 "message_row": row, "failed_acks": int(sum(not a for a in acks)), "detected": not acks[i],
                 "verified": stats["verified"], "committed": bool(committed), "baseline_kept": kept,
                 "bit_exact_after_fault": exact_after_fault, "bit_exact_after_resync": exact(resynced, after),
                 "version_before": int(state.version), "version_after_resync": int(state2.version),
                 "next_sync_committed": follow_stats["committed"], "next_sync_entries": follow_stats["entries"],
                 "next_sync_bit_exact": exact(follow, after), "next_sync_s": time.perf_counter() - t0,
                 "change_rate": payload.stats["change_rate"], "sparse_tensors": len(targets),
                 "dense_fallbacks": payload.stats["dense_fallbacks"]}
  return out


def part_faults(args) -> list:
  out_path = os.path.join(args.root, "faults.json")
  run_dirs = {arm: os.path.join(args.root, f"{arm}_s{args.seeds[0]}") for arm in args.arms}
  if args.dry_run:
    print(f"[sparse_sync] faults on {', '.join(run_dirs.values())} -> {out_path}")
    return []
  if args.lock and not os.environ.get("SPARSE_SYNC_LOCKED"):
    import subprocess
    cmd = ["flock", args.lock, sys.executable, os.path.abspath(__file__), f"--root={args.root}", "--part=faults",
           f"--seeds={args.seeds[0]}", f"--arms={','.join(args.arms)}"]
    rc = subprocess.call(cmd, cwd=ROOT, env=dict(os.environ, SPARSE_SYNC_LOCKED="1"))
    return [out_path] if rc else []
  _simulate_devices()
  result = {arm: _faults(path) for arm, path in run_dirs.items()}
  with open(out_path, "w") as f:
    json.dump(result, f, indent=1)
  print(json.dumps(result, indent=1))
  return []


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/sparse_sync")
  p.add_argument("--seeds", default="0,1,2")
  p.add_argument("--arms", default=",".join(ARMS))
  p.add_argument("--part", default="all", choices=("all", "sft", "rl", "faults"))
  p.add_argument("--lock", default="", help="run every heavy step under `flock LOCK`")
  p.add_argument("--dry_run", action="store_true")
  args = p.parse_args(argv)
  args.seeds = [int(s) for s in args.seeds.split(",")]
  args.arms = [a for a in args.arms.split(",") if a]
  bad = [a for a in args.arms if a not in ARMS]
  if bad:
    p.error(f"unknown arms {bad}; known: {', '.join(ARMS)}")
  os.makedirs(args.root, exist_ok=True)
  failed = []
  for part, fn in (("sft", part_sft), ("rl", part_rl), ("faults", part_faults)):
    if args.part in ("all", part):
      failed += fn(args)
  return driver.report("sparse_sync", failed)


if __name__ == "__main__":
  sys.exit(main())
