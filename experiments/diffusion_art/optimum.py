"""The exact KL-regularised optimum of experiments/diffusion_art's task, written to --out: its draws per prompt
(rlkit/diffusion/gen_rewards.py's toy2d optimum, p* ∝ p exp(r_true / beta), fixed numpy seed), their training
and true rewards: what the summary's grids draw and gate G2 compares the reference with.

  python experiments/diffusion_art/optimum.py --out=/tmp/diffusion_art/samples_optimum.json
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)
  import jax.numpy as jnp
  import numpy as np

  from configs.diffusion_art import SAMPLES, get_config
  from rlkit.diffusion.gen_rewards import GEN_REWARDS

  section = get_config("art").rl
  reward = GEN_REWARDS.get(section.reward.name).build(section.reward, section)
  x = reward.optimum[:, :SAMPLES]
  flat, rows = jnp.asarray(x.reshape(-1, x.shape[-1])), jnp.repeat(jnp.arange(x.shape[0]), x.shape[1])
  out = {"workdir": "optimum", "reward": float(jnp.mean(reward.score(flat, rows))),
         "true_reward": float(jnp.mean(reward.reports["true_reward"](flat, rows))), "opt_mmd": 0.0,
         "samples": np.round(x, 3).tolist()}
  with open(args.out + ".tmp", "w") as f:
    json.dump(out, f)
  os.replace(args.out + ".tmp", args.out)
  print(json.dumps({k: v for k, v in out.items() if k != "samples"}), flush=True)


if __name__ == "__main__":
  main()
