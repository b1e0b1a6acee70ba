"""The exact KL-regularised optimum of experiments/diffusion_art's task, written to --out: its draws per prompt
(rlkit/diffusion/gen_rewards.py's toy2d optimum, p* ∝ p exp(r_true / beta), fixed numpy seed), their training
and true rewards: what the summary's grids draw and gate G2 compares the reference with.

  python experiments/diffusion_art/optimum.py --out=/tmp/diffusion_art/samples_optimum.json
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--out", required=True)
  args = p.parse_args(argv)
  from configs.diffusion_art import SAMPLES, get_config
  from experiments.diffusion_art.samples import measured, write
  from rlkit.diffusion.gen_rewards import GEN_REWARDS

  section = get_config("art").rl
  reward = GEN_REWARDS.get(section.reward.name).build(section.reward, section)
  write(args.out, measured(reward.optimum[:, :SAMPLES], reward, workdir="optimum", opt_mmd=0.0))


if __name__ == "__main__":
  main()
