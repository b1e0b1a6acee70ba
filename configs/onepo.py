"""OnePO's experiment from the pretrained base (experiments/onepo/, issue 31): a teacher guides RL on 4-digit
additions, one step beyond the base's 3-digit operands.

  python experiments/onepo/run.py --root=/tmp/onepo                      # the gate, then 3 seeds x 4 arms
  python launch.py --config=configs/onepo.py:annealed --workdir=/tmp/onepo/annealed_s0 --config.seed=0

Every run starts from experiments/base/model (`model.path`; its tokenizer, `tokenizer.kind=hf`) and runs one RL
stage on `a+b=` with a, b of HARD_DIGITS digits: STEPS iterations of PROMPTS prompts x GROUP samples at
temperature 1, at most HARD_DIGITS + 2 new tokens, AdamW at LR, one update per iteration, no KL; the verifier's
reward (1 for the exact sum). Evaluated at the start and every EVAL_EVERY iterations, greedy, 500 held-out
problems per set: the hard task (`eval/accuracy`), the step below (`eval/below/...`, HARD_DIGITS - 1 digits: the
base's own skill, kept or lost?) and a shifted split (`eval/long/...`, HARD_DIGITS + 1 digits). The teacher is
the task's demonstration (the exact sum). Presets:

  gate       the calibration gate's run: the base evaluated at its start (greedy, and pass@GATE["pass_k"] at
             temperature 1), then one RL iteration; experiments/onepo/run.py reads it before any arm
  grpo       plain GRPO
  permanent  our design with guidance that never retires: TEACHER_ROWS teacher rows join every all-fail group,
             weight 1 for the whole run
  annealed   our design (rule `guidance`): the same, weight 1 - t/ANNEAL, so plain GRPO from iteration ANNEAL
  huatuo     HuatuoGPT-3's released rule (rule `huatuo`): the teacher replaces one random rollout of a group whose
             every student reward it beats; ratio floor 0.1 on its tokens (`floored_teacher`); retired at
             iteration ANNEAL (`retire=cutoff`, the release's teacher_max_steps)

Our design keeps its defaults otherwise (all-fail groups only, the teacher in the baseline, gamma 0.1, the
clipped surrogate on policy rows only). Every field is documented in rlkit/train/config.py and rl_config.py.
"""
from rlkit.train.config import base_config, set_dotted
from rlkit.train.rl_config import rl_defaults

BASE_MODEL = "experiments/base/model"
HARD_DIGITS = 4                 # the hard task's operands; the base saw at most 3 digits
STEPS = 300                     # RL iterations of every arm
EVAL_EVERY = 50
ANNEAL = 150                    # our annealed weight reaches 0 here; the released rule's teacher retires here
TEACHER_ROWS = 4                # our design's teacher rows per guided group (the released rule replaces 1)
PROMPTS, GROUP = 8, 8
LR = 5e-5
# The calibration gate (experiments/onepo/README.md): the minimum the test needs, checked before any arm.
GATE = {"pass_k": 8,            # k (= n samples at temperature 1) of the base's pass@k on the hard task
        "teacher_min": 0.9,     # G1: the teacher's rows, as trained, verify on at least this share of problems
        "base_pass_max": 0.5,   # G2: the base's pass@k on the hard task is at most this (room for a teacher)
        "below_min": 0.5}       # G3: the base's greedy accuracy one step below (3 digits) is at least this
GUIDED = {"augment": "onepo", "advantage": "mixed_group", "loss_terms": {"shaped_offpolicy": 1.0},
          "surrogate_rows": ("policy",), "onepo.teacher_rows": TEACHER_ROWS}
RELEASED = {"augment": "onepo", "onepo.rule": "huatuo", "advantage": "group",
            "loss_terms": {"floored_teacher": 1.0}, "surrogate_rows": ("policy",)}
ARMS = {
    "grpo": {},
    "permanent": {**GUIDED, "onepo.anneal_steps": 10 ** 9},
    "annealed": {**GUIDED, "onepo.anneal_steps": ANNEAL},
    "huatuo": {**RELEASED, "onepo.anneal_steps": ANNEAL},
}
PRESETS = {"gate": "the calibration gate: the base evaluated at its start (greedy and pass@k), one RL iteration",
           **{arm: f"{HARD_DIGITS}-digit additions from the base, rl fields {fields or 'unchanged'}"
              for arm, fields in ARMS.items()}}


def get_config(arg=None):
  preset = arg or "annealed"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for onepo; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.stages = ("rl",)
  c.model.path = BASE_MODEL
  c.tokenizer.kind = "hf"              # the base's own tokenizer (tokenizer.path "" = the model folder's)
  c.task.name = "arithmetic"
  c.task.kwargs.ops = "+"
  c.task.kwargs.min_digits = c.task.kwargs.max_digits = HARD_DIGITS
  c.data.num_train = 5_000             # 2,400 prompts are drawn (STEPS x PROMPTS)
  c.data.num_test = 500
  c.data.max_prompt_len = 2 * (HARD_DIGITS + 1) + 3   # BOS + "99999+99999=" (the long set): a token a character
  c.rl = rl_defaults()
  c.rl.steps = STEPS
  c.rl.prompts_per_step = PROMPTS
  c.rl.group_size = GROUP
  c.rl.max_new_tokens = HARD_DIGITS + 2   # the longest sum (HARD_DIGITS + 1 digits) and the end token
  c.rl.optimizer.lr = LR
  c.rl.eval_every = EVAL_EVERY
  c.eval.num_examples = 500
  c.eval.batch_size = 500
  c.eval.pass_k = 0                    # greedy accuracy is the measure; the gate's run sets pass@k
  c.eval.max_new_tokens = HARD_DIGITS + 3   # the long set's longest sum and the end token
  c.eval.extra_sets = {"below": {"min_digits": HARD_DIGITS - 1, "max_digits": HARD_DIGITS - 1},
                       "long": {"min_digits": HARD_DIGITS + 1, "max_digits": HARD_DIGITS + 1}}
  c.checkpoint.every = 50
  c.wandb.mode = "disabled"
  if preset == "gate":
    c.rl.steps = 1
    c.rl.eval_every = 0
    c.eval.pass_k = GATE["pass_k"]
    return c
  for key, value in ARMS[preset].items():
    set_dotted(c.rl, key, value)
  return c
