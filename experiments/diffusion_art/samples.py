"""The final samples of one experiments/diffusion_art run, written to --out (ROOT/samples_<name>.json, archived
beside the runs): SAMPLES Euler samples
per prompt from fixed noise (the same noise for every run of a seed), their training reward and true reward, and
their squared MMD to the exact KL-regularised optimum (rlkit/diffusion/gen_rewards.py's toy2d optimum).

  python experiments/diffusion_art/samples.py --workdir=/tmp/diffusion_art/art_s0 --seed=0 \
      --out=/tmp/diffusion_art/samples_art_s0.json

The driver runs it after each run (and after each pretrain run: the reference). The summary's grids plot these
samples; the workdirs' checkpoints stay out of the archive.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def measured(x, reward, **fields) -> dict:
  """The record of samples x [C, n, 2] under a toy2d GenReward: `fields`, their mean reward and true reward, and
  the samples themselves (3 decimals)."""
  import jax.numpy as jnp
  import numpy as np
  flat, rows = jnp.asarray(x.reshape(-1, x.shape[-1])), jnp.repeat(jnp.arange(x.shape[0]), x.shape[1])
  return {**fields, "reward": float(jnp.mean(reward.score(flat, rows))),
          "true_reward": float(jnp.mean(reward.reports["true_reward"](flat, rows))),
          "samples": np.round(np.asarray(x), 3).tolist()}


def write(out: str, record: dict) -> None:
  """`record` to `out` (atomically), and its numbers to stdout."""
  with open(out + ".tmp", "w") as f:
    json.dump(record, f)
  os.replace(out + ".tmp", out)
  print(json.dumps({k: v for k, v in record.items() if k != "samples"}), flush=True)


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", required=True)
  p.add_argument("--out", required=True)
  p.add_argument("--seed", type=int, required=True)
  args = p.parse_args(argv)
  import jax

  from configs.diffusion_art import SAMPLES, get_config
  from rlkit.diffusion.gen_pretrain_stage import condition_samples, dataset, flow_config
  from rlkit.diffusion.gen_rewards import GEN_REWARDS
  from rlkit.diffusion.sample_distance import mean_mmd2
  from rlkit.embodied.expert_source import saved_expert
  from rlkit.models.flow import init_flow

  c = get_config("art")                         # the rl section: reward and shapes (the same for every preset)
  section = c.rl
  data = dataset(section)
  fc = flow_config(section, data)
  params = saved_expert(args.workdir, init_flow(fc, data.conditions, jax.random.key(0)))
  x = condition_samples(params, fc, data.conditions, SAMPLES, jax.random.key(1000 + args.seed), section.sample_steps)
  reward = GEN_REWARDS.get(section.reward.name).build(section.reward, section)
  write(args.out, measured(x, reward, workdir=os.path.basename(os.path.abspath(args.workdir)), seed=args.seed,
                           opt_mmd=mean_mmd2(x, reward.optimum), data_mmd=data.quality(x, args.seed).get("mmd")))


if __name__ == "__main__":
  main()
