"""Embodied RL on a control environment (rlkit/envs, rlkit/embodied): a flow-matching action expert cloned from
the environment's scripted controller. No tokenizer, data or language model is built.

  python launch.py --config=configs/embodied.py --workdir=/tmp/embodied                 # the point mass
  python launch.py --config=configs/embodied.py:reacher --workdir=/tmp/embodied_reacher # the MJX arm
  python launch.py --config=configs/embodied.py:test --workdir=/tmp/embodied_test       # seconds

A task is `--config.bc.env_task='{"goal_center": [0.1, 0.0], "drift": [0.2, 0.0]}'` (rlkit/envs/core.py's
EnvParams fields); presets:
"""
import ml_collections

from rlkit.embodied.bc_stage import flow_bc_defaults
from rlkit.train.config import base_config

PRESETS = {
    "point_mass": "default: 500 BC steps of a flow expert on the point mass's scripted controller",
    "reacher": "500 BC steps on the two-link MJX arm's scripted controller",
    "test": "seconds: 4 BC steps of a tiny expert on the point mass, every step checkpointed",
}


def get_config(arg=None):
  preset = arg or "point_mass"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for embodied; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.stages = ("bc",)
  c.wandb.mode = "disabled"
  c.bc = flow_bc_defaults()
  c.bc.eval_every = 100
  if preset == "reacher":
    c.bc.env = "reacher"
  if preset == "test":
    c.bc.steps = 4
    c.bc.batch_size = 32
    c.bc.demo_envs, c.bc.demo_steps = 4, 20
    c.bc.flow.update(hidden=16, blocks=1, time_dim=8, horizon=2)
    c.bc.eval_every, c.bc.eval_episodes, c.bc.sample_steps = 2, 4, 2
    c.bc.env_task = ml_collections.ConfigDict({"max_steps": 10})
    c.checkpoint.every = 1
  return c
