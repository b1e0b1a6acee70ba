"""The ACCRUE experiment (experiments/accrue/): across a sequence of tasks, does inheriting a residual actor-critic
adapt faster than starting afresh, and does a small trajectory memory forget less than plain sequential training?

  python experiments/accrue/run.py --root=/tmp/accrue
  python launch.py --config=configs/accrue.py:bc --workdir=/tmp/accrue/bc_s0
  python launch.py --config=configs/accrue.py:accrue --workdir=/tmp/accrue/accrue_s0 \
      --config.accrue.expert_path=/tmp/accrue/bc_s0

The point mass (methods/embodied.md §4.4): four goal regions, one per quadrant (spread 0.2, radius 0.05, 50 steps,
dense reward), each with its own constant drift that the base never saw (the third task also halves the action
gain), so the frozen base misses every goal and the residual it needs differs per task (the goal, in the
observation, says which). `bc`: BC_STEPS steps of behaviour cloning of the scripted controller on the drift-free
quadrant-free task (the frozen base). Every other preset is one `accrue` stage of PER_TASK iterations per task
from a `bc` run's expert (`accrue.expert_path`), 16 environments x 8 chunks an iteration:

  fresh      Fresh-AC: the actor and critics start afresh on every task, no memory (inherit False, p_mem 0)
  seqft      SeqFT: inherited from task to task, no memory (p_mem 0)
  accrue     ACCRUE: inherited, MEMORY trajectories of each earlier task (top return) a quarter of every batch,
             the critic regressed to their Monte-Carlo returns
  accrue_bc  ACCRUE + behaviour cloning on the memory's successful chunks (lambda_bc LAMBDA_BC)
  replay     full replay: every candidate trajectory kept (16 a task) and half of every batch from the memory
  base       the frozen base alone (no updates; evaluated like the others)
"""
from configs.embodied import get_config as embodied_config

BC_STEPS = 500
PER_TASK = 30
EVAL_EVERY = 5
EVAL_EPISODES = 256
MEMORY = 4
LAMBDA_BC = 1.0
TASKS = (
    {"goal_center": [0.5, 0.5], "drift": [0.4, -0.3]},
    {"goal_center": [-0.5, 0.5], "drift": [-0.3, -0.4]},
    {"goal_center": [-0.5, -0.5], "drift": [0.15, 0.15], "action_gain": 0.5},
    {"goal_center": [0.5, -0.5], "drift": [-0.4, 0.3]},
)
ARMS = {
    "fresh": dict(inherit=False, p_mem=0.0),
    "seqft": dict(p_mem=0.0),
    "accrue": {},
    "accrue_bc": dict(lambda_bc=LAMBDA_BC),
    "replay": dict(per_task=16, p_mem=0.5),
    "base": dict(critic_updates=0, eval_every=0),   # constant: evaluated at the task ends only (amendment 1)
}
PRESETS = {"bc": f"{BC_STEPS} BC steps of the scripted controller (the frozen base)",
           **{arm: f"accrue stage, {len(TASKS)} tasks x {PER_TASK} iterations: {fields or 'the full method'}"
              for arm, fields in ARMS.items()}}


def get_config(arg=None):
  preset = arg or "accrue"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for accrue; choose one of {', '.join(PRESETS)}.")
  c = embodied_config("accrue")
  c.progress = False
  c.bc.steps, c.bc.eval_every, c.bc.eval_episodes = BC_STEPS, 0, EVAL_EPISODES
  if preset == "bc":
    c.stages = ("bc",)
    return c
  c.stages = ("accrue",)
  c.accrue.tasks = tuple({"goal_spread": 0.2, **task} for task in TASKS)
  c.accrue.update(steps=len(TASKS) * PER_TASK, steps_per_task=PER_TASK, eval_every=EVAL_EVERY,
                  eval_episodes=EVAL_EPISODES, per_task=MEMORY)
  c.accrue.update(ARMS[preset])
  return c
