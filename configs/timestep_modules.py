"""The timestep-module study (experiments/timestep_modules/): where does RL change a behaviour-cloned flow expert?

  python experiments/timestep_modules/run.py --root=/tmp/timestep_modules
  python launch.py --config=configs/timestep_modules.py:bc --workdir=/tmp/tm/bc_s0
  python launch.py --config=configs/timestep_modules.py:adam_right --workdir=/tmp/tm/adam_right_s0 \
      --config.rl.expert_path=/tmp/tm/bc_s0

`bc`: BC_STEPS steps of behaviour cloning of the point mass's scripted controller (configs/embodied.py's expert:
hidden 128, 3 adaLN-Zero blocks, a 64-wide time MLP, chunks of 4), evaluated on the drift-free task.
`<arm>_<task>`: one ReinFlow PPO stage of STEPS iterations on TASKS[task] (a constant drift the scripted
controller, and so the clone, is blind to), starting from a `bc` run's expert (`rl.expert_path`), trained by
ARMS[arm]: full fine-tuning with AdamW or with SGD (momentum 0.9), or rank-LORA_RANK adapters on the timestep
modules only or on every kernel. QUICK: the command-line overrides that make any preset tiny (the driver's
--quick smoke run).
"""
from configs.embodied import get_config as embodied_config
from rlkit.train.config import set_dotted

BC_STEPS = 500
STEPS = 60
EVAL_EPISODES = 512
LORA_RANK = 4
TASKS = {"right": {"drift": [0.4, 0.0]}, "up": {"drift": [0.0, 0.4]}, "left": {"drift": [-0.4, 0.0]},
         "diagonal": {"drift": [0.2828, 0.2828]}}
ARMS = {
    "adam": {"optimizer.name": "adamw", "optimizer.lr": 1e-4},
    "sgd": {"optimizer.name": "sgd", "optimizer.lr": 1e-2},
    "lora_ts": {"optimizer.lr": 1e-3, "expert_lora.rank": LORA_RANK, "expert_lora.targets": "timestep"},
    "lora_all": {"optimizer.lr": 1e-3, "expert_lora.rank": LORA_RANK, "expert_lora.targets": "all"},
}
QUICK = {"bc.steps": 20, "rl.steps": 4, "rl.eval_every": 2, "bc.eval_episodes": 32, "rl.eval_episodes": 32,
         **{f"{s}.flow.{k}": v for s in ("bc", "rl") for k, v in (("hidden", 16), ("blocks", 1), ("time_dim", 8))}}
PRESETS = {"bc": f"{BC_STEPS} BC steps on the point mass (the reference expert)",
           **{f"{arm}_{task}": f"ReinFlow PPO on drift {TASKS[task]['drift']}, {arm}: {fields}"
              for arm, fields in ARMS.items() for task in TASKS}}


def get_config(arg=None):
  preset = arg or "adam_right"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for timestep_modules; choose one of {', '.join(PRESETS)}.")
  c = embodied_config("point_mass")
  c.progress = False
  c.bc.steps, c.bc.eval_every, c.bc.eval_episodes = BC_STEPS, 0, EVAL_EPISODES
  c.rl.steps, c.rl.eval_every, c.rl.eval_episodes = STEPS, STEPS // 4, EVAL_EPISODES
  if preset == "bc":
    c.stages = ("bc",)
  else:
    arm = next(a for a in ARMS if preset.startswith(a + "_"))
    task = preset[len(arm) + 1:]
    c.stages = ("rl",)
    c.rl.env_task = dict(TASKS[task])
    for key, value in ARMS[arm].items():
      set_dotted(c.rl, key, value)
  return c
