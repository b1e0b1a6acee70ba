"""The step-label SFT probe run after tips' failed gate, before any new pre-registration: does a longer SFT of the
base on the running-difference step labels learn to localise errors, where 125 steps learned only the verdict
prior ("no error": ProcessBench F1 0.3 against the final-answer baseline's 32)? One `supervised` run per preset,
seed 0, evaluated on the 500 held-out chains every 125 steps.

  python launch.py --config=experiments/tips/probe.py:sft1000 --workdir=/tmp/tips_probe/sft1000
"""
from configs import tips

# preset -> (SFT steps of tips.SFT_BATCH chains, peak learning rate, the chains' operator, the SFT target)
PRESETS = {"sft1000": (1_000, 3e-4, "-", "steps"), "sft1000_hi": (1_000, 1e-3, "-", "steps"),
           "plus125": (125, 3e-4, "+", "steps"),      # running SUMS, the base's own step_check skill
           "checks250": (250, 3e-4, "-", "checks")}   # worked verdicts: each step's result, then its verdict


def get_config(arg=None):
  if arg not in PRESETS:
    raise ValueError(f"Unknown preset {arg!r} for the tips probe; choose one of {', '.join(PRESETS)}.")
  c = tips.get_config("supervised")
  c.sft.steps, c.sft.optimizer.lr, op, target = PRESETS[arg]
  c.task.kwargs = {**c.task.kwargs, "op": op, "sft_target": target}
  if target == "checks":     # up to 6 checks ("155+1=156:156+": up to 15 tokens each) and the end
    c.sft.max_len = 144
    c.eval.max_new_tokens = 91
  c.sft.eval_every = 125 if c.sft.steps > 125 else 25
  return c
