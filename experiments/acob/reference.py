"""pi_ref's success for experiments/acob: the `bc_s<seed>` expert evaluated (deterministic sampler, REF_EPISODES
first episodes, a key fixed by the seed) on the drifted task the arms train on and on the drift-free task it was
cloned on; written to ROOT/ref_s<seed>.json, which the gate (seed 0) and the summary's dips read.

  python experiments/acob/reference.py --root=/tmp/acob --seed=0
"""
import argparse
import json
import os
import sys

import jax

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs.acob import get_config  # noqa: E402
from rlkit.embodied.bc_stage import env_of, flow_config  # noqa: E402
from rlkit.embodied.episodes import evaluate_policy  # noqa: E402
from rlkit.embodied.expert_source import saved_expert  # noqa: E402
from rlkit.models.flow import init_flow, sample  # noqa: E402

REF_EPISODES = 1024


def reference_success(root: str, seed: int, episodes: int = REF_EPISODES) -> dict:
  """{"drifted": success on the arms' task, "drift_free": on the cloned task} of ROOT/bc_s<seed>'s expert."""
  c = get_config("acob")
  out = {}
  for name, section in (("drifted", c.acob), ("drift_free", c.bc)):
    env, task = env_of(section)
    fc = flow_config(section, env)
    expert = saved_expert(os.path.join(root, f"bc_s{seed}"), init_flow(fc, env.obs_dim, jax.random.key(0)))
    row = evaluate_policy(env, task, lambda obs, k: sample(expert, fc, obs, k, section.sample_steps),
                          jax.random.key(9_000 + seed), episodes, fc.horizon)
    out[name] = row["eval/success"]
  return out


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", required=True)
  p.add_argument("--seed", type=int, default=0)
  args = p.parse_args(argv)
  path = os.path.join(args.root, f"ref_s{args.seed}.json")
  with open(path + ".tmp", "w") as f:
    json.dump(reference_success(args.root, args.seed), f)
  os.replace(path + ".tmp", path)
  print(f"[acob] wrote {path}", flush=True)


if __name__ == "__main__":
  main()
