"""The step-label SFT probe run after tips' failed gate, before any new pre-registration: does a longer SFT of the
base on the running-difference step labels learn to localise errors, where 125 steps learned only the verdict
prior ("no error": ProcessBench F1 0.3 against the final-answer baseline's 32)? One `supervised` run per preset,
seed 0, evaluated on the 500 held-out chains every 125 steps.

  python launch.py --config=experiments/tips/probe.py:sft1000 --workdir=/tmp/tips_probe/sft1000
"""
from configs import tips

# preset -> (SFT steps of tips.SFT_BATCH chains, peak learning rate)
PRESETS = {"sft1000": (1_000, 3e-4), "sft1000_hi": (1_000, 1e-3)}


def get_config(arg=None):
  if arg not in PRESETS:
    raise ValueError(f"Unknown preset {arg!r} for the tips probe; choose one of {', '.join(PRESETS)}.")
  c = tips.get_config("supervised")
  c.sft.steps, c.sft.optimizer.lr = PRESETS[arg]
  c.sft.eval_every = 125
  return c
