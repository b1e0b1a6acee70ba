"""The SFT probe run after mimo_graders' second failed gate, before any new pre-registration: does a longer SFT
stage lift the policy's sampled pass rate (temperature 0.6) to G1's 0.15, where 200 steps gave 0.073 (greedy,
held out: 0.21-0.30)? One SFT run per preset from the base, then the gate's own frozen measurement on it:

  python launch.py --config=experiments/mimo_graders/probe.py:sft800 --workdir=/tmp/mimo_probe/sft800
  python launch.py --config=configs/mimo_graders.py:gate --workdir=/tmp/mimo_probe/gate_sft800 --config.seed=0 \
      --config.model.path=/tmp/mimo_probe/sft800
"""
from configs import mimo_graders

PRESETS = {"sft800": 800,      # SFT steps: four times the second attempt's 200
           "sft400": 400}      # round 2, after sft800's policy passed every sample (G1's upper bound)


def get_config(arg=None):
  if arg not in PRESETS:
    raise ValueError(f"Unknown preset {arg!r} for the mimo_graders probe; choose one of {', '.join(PRESETS)}.")
  c = mimo_graders.get_config("sft")
  c.sft.steps = PRESETS[arg]
  if arg == "sft400":
    c.checkpoint.every = 100     # checkpoints on the way (the last two kept), each a start the gate can measure
  return c
