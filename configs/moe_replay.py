"""The MoE routing-stability experiment (experiments/moe_replay/): GRPO of the MoE upcycled from the base with and
without routing replay, with the combine weights replayed too, and with the router frozen.

  python experiments/moe_replay/run.py --root=/tmp/moe_replay
  python launch.py --config=configs/moe_replay.py:replay --workdir=/tmp/moe_replay/replay_s0

Every arm is `configs/trace_fp4.py:bf16` (the base upcycled into 4 experts, top-2; GRPO on `mul`, STEPS iterations
of 8 x 8 samples; a float32 trainer and a bfloat16 sampler copy) with one change:

  no_replay        rl.replay_routing=False: the trainer routes every token itself
  replay           R3: the trainer takes the sampler's experts (the trace_fp4 arms' setting)
  replay_weights   replay plus rl.moe.replay_weights: the sampler's combine weights too
  replay_frozen    replay with the router frozen (optimizer.frozen=moe/router$)
  gate             no_replay with every weight frozen for GATE_STEPS iterations (experiments/moe_replay/README.md)
"""
from configs import trace_fp4
from rlkit.train.config import set_dotted

STEPS = trace_fp4.STEPS
GATE_STEPS = 3
ARMS = {"no_replay": {"rl.replay_routing": False}, "replay": {},
        "replay_weights": {"rl.moe.replay_weights": True},
        "replay_frozen": {"rl.optimizer.frozen": "moe/router$"}}
PRESETS = {**{arm: f"trace_fp4:bf16 with {fields}" for arm, fields in ARMS.items()},
           "gate": f"no_replay with every weight frozen for {GATE_STEPS} iterations: the calibration gate"}


def get_config(arg=None):
  preset = arg or "replay"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for moe_replay; choose one of {', '.join(PRESETS)}.")
  c = trace_fp4.get_config("bf16")
  for key, value in ARMS["no_replay" if preset == "gate" else preset].items():
    set_dotted(c, key, value)
  if preset == "gate":
    c.rl.steps, c.rl.eval_every = GATE_STEPS, 0
    c.rl.optimizer.frozen = "."          # every weight frozen: a measurement of the starting policy
  return c
