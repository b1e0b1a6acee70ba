"""Embodied RL on a control environment (rlkit/envs, rlkit/embodied): a flow-matching action expert cloned from
the environment's scripted controller (stage `bc`, kind flow_bc), then trained by PPO on the task's reward through
ReinFlow's noise-injected chain (stage `rl`, kind flow_rl; `--config.rl.method=fpo` for FPO). No tokenizer, data
or language model is built.

  python launch.py --config=configs/embodied.py --workdir=/tmp/embodied                 # the point mass
  python launch.py --config=configs/embodied.py:reacher --workdir=/tmp/embodied_reacher # the MJX arm
  python launch.py --config=configs/embodied.py:test --workdir=/tmp/embodied_test       # seconds

A task is `--config.bc.env_task='{"goal_center": [0.1, 0.0], "drift": [0.2, 0.0]}'` (rlkit/envs/core.py's
EnvParams fields; `rl.env_task` is the RL stage's, e.g. a drift the cloned controller never saw). One cloned expert
can start many RL runs: `--config.stages='("rl",)' --config.rl.expert_path=BC_WORKDIR` (any embodied section's
`expert_path`; rlkit/embodied/expert_source.py). Presets:
"""
import ml_collections

from rlkit.embodied.accrue_stage import accrue_defaults
from rlkit.embodied.acob_stage import acob_defaults
from rlkit.embodied.bc_stage import flow_bc_defaults
from rlkit.embodied.flow_rl_stage import flow_rl_defaults
from rlkit.train.config import base_config

PRESETS = {
    "point_mass": "default: 500 BC steps of a flow expert on the point mass, then 100 ReinFlow PPO iterations",
    "reacher": "the same on the two-link MJX arm",
    "test": "seconds: 4 BC steps of a tiny expert on the point mass, 2 RL iterations, every step checkpointed",
    "acob": "500 BC steps on the point mass, then ACoB (calibrate, TD to the gate, reference-regularised updates)",
    "acob_test": "seconds: the test preset's BC, then 5 ACoB iterations through all three phases",
    "accrue": "500 BC steps on the point mass, then ACCRUE over four goal quadrants (the third with half the gain)",
    "accrue_test": "seconds: the test preset's BC, then ACCRUE over two tasks of 3 iterations",
}


def get_config(arg=None):
  preset = arg or "point_mass"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for embodied; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  second = "acob" if preset.startswith("acob") else "accrue" if preset.startswith("accrue") else "rl"
  c.stages = ("bc", second)
  c.wandb.mode = "disabled"
  c.bc = flow_bc_defaults()
  c.bc.eval_every = 100
  if preset.startswith("acob"):
    c.acob = acob_defaults()
  elif preset.startswith("accrue"):
    c.accrue = accrue_defaults()
    quadrants = ((0.5, 0.5), (-0.5, 0.5), (-0.5, -0.5), (0.5, -0.5))
    c.accrue.tasks = tuple({"goal_center": list(q), "goal_spread": 0.2, **({"action_gain": 0.5} if i == 2 else {})}
                           for i, q in enumerate(quadrants))
    c.accrue.steps = 4 * c.accrue.steps_per_task
  else:
    c.rl = flow_rl_defaults()
    c.rl.eval_every = 25
  if preset == "reacher":
    c.bc.env = c.rl.env = "reacher"
  if preset == "acob_test":
    c.bc.steps, c.bc.batch_size, c.bc.demo_envs, c.bc.demo_steps = 4, 32, 4, 20
    c.acob.update(steps=5, num_envs=4, decisions=3, calibrate_steps=1, td_steps=1, td_rounds=1, critic_hidden=8,
                  critic_updates=2, batch_size=8, buffer=64, actor_updates=2, check_every=1,
                  gate=False)                              # the gate is logged, not obeyed: the test walks every phase
    for s in (c.bc, c.acob):
      s.flow.update(hidden=16, blocks=1, time_dim=8, horizon=2)
      s.eval_every, s.eval_episodes, s.sample_steps = 0, 4, 2
      s.env_task = ml_collections.ConfigDict({"max_steps": 4})              # episodes end inside a collection
    c.checkpoint.every = 1
  if preset == "accrue_test":
    c.bc.steps, c.bc.batch_size, c.bc.demo_envs, c.bc.demo_steps = 4, 32, 4, 20
    c.accrue.update(tasks=c.accrue.tasks[:2], steps_per_task=3, steps=6, num_envs=4, decisions=3, hidden=8,
                    critic_updates=2, batch_size=8, buffer=64, per_task=2, n_warm=1)
    for s in (c.bc, c.accrue):
      s.flow.update(hidden=16, blocks=1, time_dim=8, horizon=2)
      s.eval_every, s.eval_episodes, s.sample_steps = 0, 4, 2
      s.env_task = ml_collections.ConfigDict({"max_steps": 4})
    c.checkpoint.every = 1
  if preset == "test":
    c.bc.steps, c.rl.steps = 4, 2
    c.bc.batch_size = 32
    c.bc.demo_envs, c.bc.demo_steps = 4, 20
    c.rl.num_envs, c.rl.decisions, c.rl.epochs, c.rl.minibatches, c.rl.critic_hidden = 4, 3, 2, 2, 8
    c.rl.chain.update(steps=2, hidden=8)
    c.rl.fpo.draws = 2
    for s in (c.bc, c.rl):
      s.flow.update(hidden=16, blocks=1, time_dim=8, horizon=2)
      s.eval_every, s.eval_episodes, s.sample_steps = 2, 4, 2
      s.env_task = ml_collections.ConfigDict({"max_steps": 10})
    c.checkpoint.every = 1
  return c
