"""OnePO's tiny experiment (experiments/onepo/): a teacher guides a policy on a task it almost never solves.

  python launch.py --config=configs/onepo.py:sft --workdir=/tmp/onepo/sft_s0 --config.seed=0
  python launch.py --config=configs/onepo.py:annealed --workdir=/tmp/onepo/annealed_s0 --config.seed=0 \
    --config.model.path=/tmp/onepo/sft_s0
  python experiments/onepo/run.py --root=/tmp/onepo [--seeds=0,1,2]      # all of it

`sft`: the main job's SFT stage (configs/grpo_arith.py, preset cpu) alone: the base policy, trained on 1-2 digit
additions. Every arm starts from it on 3-digit additions (`a+b=` with a, b in [100, 999]), which it was never
trained on, with the main job's RL settings (32 prompts x 8 samples at temperature 1, lr 1e-4, one update per
iteration, no KL) for STEPS iterations, evaluated every EVAL_EVERY on three held-out sets: the 3-digit task
(`eval/accuracy`), the base skill (`eval/base/...`, 1-2 digits) and a shifted split (`eval/long/...`, 4 digits).
The teacher is the task's demonstration (the exact sum). Arms:

  grpo        plain GRPO on the hard task
  permanent   OnePO's guidance that never retires: a teacher row joins every all-fail group, weight alpha0 = 1
              for the whole run (anneal_steps far beyond STEPS)
  annealed    OnePO: the same, weight 1 - t / ANNEAL (zero from iteration ANNEAL on: plain GRPO after it)
  sft_grpo    SFT_STEPS SFT steps of batch 64 on the hard task's demonstrations (as many demonstrations as
              the annealed arm can receive), then plain GRPO for STEPS iterations

The guided arms use OnePO's defaults (rlkit/train/onepo.py): mixed_group advantages over the union with the
teacher row in the baseline, the shaped off-policy term p / (p + 0.1) on teacher tokens, the clipped surrogate
on policy rows only. Every field is documented in rlkit/train/config.py.
"""
from rlkit.train.config import set_dotted, sibling_config

grpo_arith = sibling_config(__file__, "grpo_arith")

STEPS = 100
EVAL_EVERY = 25
ANNEAL = 50
SFT_STEPS = 25
GUIDED = {"augment": "onepo", "advantage": "mixed_group", "loss_terms": {"shaped_offpolicy": 1.0},
          "surrogate_rows": ("policy",)}
ARMS = {
    "grpo": {},
    "permanent": {**GUIDED, "onepo.anneal_steps": 10 ** 9},
    "annealed": {**GUIDED, "onepo.anneal_steps": ANNEAL},
    "sft_grpo": {},
}
PRESETS = {"sft": "the base policy: the main job's SFT stage on 1-2 digit additions",
           **{arm: f"3-digit additions from the base policy, rl fields {fields or 'unchanged'}"
              for arm, fields in ARMS.items()}}


def get_config(arg=None):
  preset = arg or "annealed"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for onepo; choose one of {', '.join(PRESETS)}.")
  c = grpo_arith.get_config("cpu")
  c.wandb.mode = "disabled"
  if preset == "sft":
    c.stages = ("sft",)
    return c
  c.model.path = "REQUIRED:--config.model.path=<the seed's sft workdir>"   # fails validation until set
  c.task.kwargs.min_digits = c.task.kwargs.max_digits = 3
  c.data.max_prompt_len = 12            # BOS + "9999+9999=" (the long set) fits
  c.eval.max_new_tokens = 6             # a 5-digit sum and the end token
  c.eval.extra_sets = {"base": {"min_digits": 1, "max_digits": 2}, "long": {"min_digits": 4, "max_digits": 4}}
  c.rl.steps = STEPS
  c.rl.eval_every = EVAL_EVERY
  for key, value in ARMS[preset].items():
    set_dotted(c.rl, key, value)
  c.stages = ("rl",)
  if preset == "sft_grpo":
    c.sft.steps = SFT_STEPS
    c.sft.stop_at_loss = 0.0
    c.sft.optimizer.warmup_steps = 5
    c.stages = ("sft", "rl")
  return c
