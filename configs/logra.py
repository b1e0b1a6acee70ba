"""LoGRA against AdamW and LoRA on the main job's task, each arm from the same SFT checkpoint (experiments/logra/).

  python launch.py --config=configs/logra.py:sft --workdir=/tmp/logra/sft_s0 --config.seed=0
  python launch.py --config=configs/logra.py:logra_r16 --workdir=/tmp/logra/logra_r16_s0 --config.seed=0 \
    --config.model.path=/tmp/logra/sft_s0
  python launch.py --config=configs/logra.py:logra_r16:quick ...     # the same, QUICK_STEPS iterations
  python experiments/logra/run.py --root=/tmp/logra [--seeds=0,1,2] [--arms=adamw,logra_r16]

`sft` is the SFT stage of configs/grpo_arith.py (preset cpu) alone, one run per seed shared by every arm. An arm
is the main job's RL stage alone (32 prompts x 8 samples, temperature 1, 5 new tokens, lr 1e-4, one update per
iteration, no KL) for STEPS iterations, evaluated every EVAL_EVERY, with only the fields of its `ARMS` entry
changed (dotted keys from the config's root); it needs `--config.model.path` = that seed's SFT workdir and the
same `--config.seed` (the seed fixes the data split). `<arm>:quick`: QUICK_STEPS iterations (a smoke test).
No arm is tuned: every arm keeps the main job's learning rate 1e-4 and clip norm 1. wandb is off.

  adamw       the main job's RL stage unchanged (900 iterations, eval every 100): AdamW on every parameter
  lora_r16    LoRA rank 16 (alpha 16, so scale 1) on qkv, o, gate_up, down; base and embedding frozen; AdamW on
              the adapters; sampling on the merged weights
  logra_r16   LoGRA: RowAdam on rank-16 gradient sketches of qkv, o, gate_up, down (a fresh Rademacher
              projection every step), AdamW on the embedding and norms
  logra_r64   the same at rank 64
  full_rank   the full-rank control: LoGRA at rank = the width D (128), the largest rank every projection
              admits (full for o and down, half of qkv's 256 outputs, a sixth of gate_up's 768); the trainer
              does not expose the identity projection, so the control is a dense Rademacher sketch
  logra_r16_kl  logra_r16 with predicted-KL control: each step scaled so the KL it predicts on its batch's
              tokens is at most KL_TARGET; logs kl/predicted, kl/scale, kl/applied and kl/realised
Every field is documented in rlkit/train/config.py (optimizer fields: rlkit/optim/optimizers.py; model.lora:
rlkit/models/lora.py).
"""
from rlkit.train.config import set_dotted, sibling_config

grpo_arith = sibling_config(__file__, "grpo_arith")

STEPS = 900                    # the main job's RL length: adamw is its RL stage unchanged
EVAL_EVERY = 100
QUICK_STEPS = 20
QUICK_EVAL_EVERY = 10
WIDTH = 128                    # configs/grpo_arith.py:cpu's model.hidden_size (the full-rank control's rank)

LOGRA = {"rl.optimizer.name": "logra"}
# logra_r16's KL target: the median predicted KL of its unscaled step over a 20-iteration smoke run on seed 0
# (0.00194; README), so the control scales down about half of the early steps.
KL_TARGET = 2e-3
# Per-arm changes to the main job's config (dotted keys from the root).
ARMS = {
    "adamw": {},
    "lora_r16": {"model.lora.rank": 16},
    "logra_r16": {**LOGRA, "rl.optimizer.logra_rank": 16},
    "logra_r64": {**LOGRA, "rl.optimizer.logra_rank": 64},
    "full_rank": {**LOGRA, "rl.optimizer.logra_rank": WIDTH},
    "logra_r16_kl": {**LOGRA, "rl.optimizer.logra_rank": 16, "rl.optimizer.kl_target": KL_TARGET},
}
PRESETS = {"sft": "the SFT stage of configs/grpo_arith.py alone (one per seed, shared by every arm)",
           **{arm: f"the main job's RL stage for {STEPS} iterations, changed: {ARMS[arm] or 'none'}" for arm in ARMS},
           **{f"{arm}:quick": f"{arm} for {QUICK_STEPS} iterations" for arm in ARMS}}


def get_config(arg=None):
  preset = arg or "logra_r16"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for logra; choose one of {', '.join(PRESETS)}.")
  arm, _, modifier = preset.partition(":")
  c = grpo_arith.get_config("cpu")
  c.wandb.mode = "disabled"
  if arm == "sft":
    c.stages = ("sft",)
    return c
  assert c.model.hidden_size == WIDTH, "full_rank's rank is the model width; update WIDTH"
  c.stages = ("rl",)
  c.model.path = "REQUIRED:--config.model.path=<the seed's SFT workdir>"   # fails validation until set
  c.rl.steps = QUICK_STEPS if modifier == "quick" else STEPS
  c.rl.eval_every = QUICK_EVAL_EVERY if modifier == "quick" else EVAL_EVERY
  for key, value in ARMS[arm].items():
    set_dotted(c, key, value)
  return c
