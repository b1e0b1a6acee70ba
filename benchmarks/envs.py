"""Environment steps per second: rlkit's MJX reacher (rlkit/envs/reacher.py) against C MuJoCo stepping the same
model, for 1 and 256 environments: one JSON line per batch size.

  python benchmarks/envs.py [--batch 1,256] [--steps 100] [--reps 5]

Sides, timed in interleaved rounds (`_common.interleaved_median_times`, medians), each `--steps` control steps
(of `SUBSTEPS` MuJoCo steps) of `batch` arms under the same open-loop controls:
- `mjx_env`: the whole `env.step` (MJX physics, reward, hold count, auto-reset) in a jitted `lax.scan`, vmapped
  over the batch: what an embodied stage runs beside its policy;
- `mjx_physics`: only the MJX steps (`reacher.mjx_steps`) in the same scan: the physics' share;
- `c_mujoco`: `mujoco.rollout.rollout` (C, one MjData per core: multi-threaded over the batch) of the same model
  and controls: the peer.
Reported: steps/s of each side (batch x steps / seconds), `mjx_env_vs_c` and `mjx_physics_vs_c`, and the jit
seconds of the MJX env (its first call), the CPU. MJX targets accelerators: on a CPU the C engine is expected
to be faster per environment, and what the ratio at 256 shows is how much vmapping recovers.
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
from rlkit.envs import make_env  # noqa: E402
from rlkit.envs import reacher  # noqa: E402
from rlkit.parallel.mesh import usable_cores  # noqa: E402


def mjx_fns(batch: int, controls: np.ndarray):
  """(the env side, the physics side, the env side's jit seconds): no-argument functions over `controls`
  [batch, steps, 2]."""
  env, params = make_env("reacher", max_steps=10 ** 6)
  keys = jax.random.split(jax.random.key(0), batch)
  ctrl = jnp.asarray(controls, jnp.float32)

  def env_run(key, u):
    _, state = env.reset(key, params)

    def one(state, a):
      _, state, reward, _, _ = env.step(key, state, a, params)
      return state, reward
    return jax.lax.scan(one, state, u)[1]

  def physics_run(key, u):
    _, state = env.reset(key, params)

    def one(carry, a):
      qpos, qvel = reacher.mjx_steps(*carry, a)
      return (qpos, qvel), qpos[0]
    return jax.lax.scan(one, (state.qpos, state.qvel), u)[1]

  env_fn, physics_fn = (jax.jit(jax.vmap(f)) for f in (env_run, physics_run))
  t0 = time.perf_counter()
  jax.block_until_ready(env_fn(keys, ctrl))
  jit_s = time.perf_counter() - t0
  jax.block_until_ready(physics_fn(keys, ctrl))
  return (lambda: jax.block_until_ready(env_fn(keys, ctrl)),
          lambda: jax.block_until_ready(physics_fn(keys, ctrl)), jit_s)


def c_fn(batch: int, controls: np.ndarray, threads: int):
  """`mujoco.rollout.rollout` of the same model from random starts, each control held for SUBSTEPS steps."""
  import mujoco
  from mujoco import rollout
  mj = reacher.models()[0]
  datas = [mujoco.MjData(mj) for _ in range(threads)]
  spec = mujoco.mjtState.mjSTATE_FULLPHYSICS
  start = np.zeros((batch, mujoco.mj_stateSize(mj, spec)))
  start[:, 1:3] = np.random.default_rng(0).uniform(-2, 2, (batch, 2))    # time, then qpos (2), qvel (2), ...
  u = np.repeat(controls.astype(np.float64), reacher.SUBSTEPS, axis=1)
  return lambda: rollout.rollout(mj, datas, start, u)


def main(argv=None) -> list:
  p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  p.add_argument("--batch", default="1,256")
  p.add_argument("--steps", type=int, default=100)
  p.add_argument("--reps", type=int, default=5)
  args = p.parse_args(argv)
  threads = usable_cores()
  lines = []
  for batch in (int(b) for b in args.batch.split(",")):
    controls = np.random.default_rng(batch).uniform(-1, 1, (batch, args.steps, 2))
    env_side, physics_side, jit_s = mjx_fns(batch, controls)
    t = interleaved_median_times({"mjx_env": env_side, "mjx_physics": physics_side,
                                  "c_mujoco": c_fn(batch, controls, min(threads, batch))}, args.reps)
    n = batch * args.steps
    line = {"bench": "envs", "env": "reacher", "batch": batch, "steps": args.steps, "reps": args.reps,
            **{f"{k}_steps_s": round(n / v, 1) for k, v in t.items()},
            "mjx_env_vs_c": round(t["c_mujoco"] / t["mjx_env"], 3),
            "mjx_physics_vs_c": round(t["c_mujoco"] / t["mjx_physics"], 3), "mjx_jit_s": round(jit_s, 2),
            "c_threads": min(threads, batch), "backend": jax.default_backend(), **cpu_info(), "commit": commit()}
    print(json.dumps(line), flush=True)
    lines.append(line)
  return lines


if __name__ == "__main__":
  main()
