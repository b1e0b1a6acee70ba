"""GRAFT's experiment from the pretrained base (experiments/graft/): two policies fine-tuned from the base on
partially overlapping 4-digit skills trade successes, at two overlaps.

  python launch.py --config=configs/graft.py:sft_add_o10 --workdir=/tmp/graft/sft_add_o10
  python launch.py --config=configs/graft.py:sft_sub_o10 --workdir=/tmp/graft/sft_sub_o10
  python launch.py --config=configs/graft.py:graft_o10 --workdir=/tmp/graft/graft_o10_s0 --config.seed=0 \
    --config.model.path=/tmp/graft/sft_add_o10 --config.models.peer.path=/tmp/graft/sft_sub_o10
  python experiments/graft/run.py --root=/tmp/graft      # the calibration gate, then every arm and seed

The base (experiments/base/model) adds and subtracts up to 3-digit operands; 4-digit operands are beyond it.
`sft_<model>_<overlap>`: SFT from the base on 4-digit problems, a share 1 - OVERLAP of them the model's own
operator (`add`: '+', policy A; `sub`: '-', peer B) and OVERLAP the other's (SFT_STEPS steps of SFT_BATCH, each
example seen once); evaluated on its own mixture and on the balanced set `mixed` (eval/mixed/accuracy/+ and
/-: both skills, what the gate reads). `<arm>_<overlap>`: one `graft` stage on the balanced 4-digit task
(`a+b=` and `a-b=` equally likely) with A as the policy and B as `models.peer`, both trained with the same RL
settings (RL_PROMPTS prompts x RL_GROUP samples, lr RL_LR, one update per iteration, no KL) for STEPS
iterations, held-out accuracy per operator for both every EVAL_EVERY. The arms change only the exchange (`ARMS`,
keys of `graft.`):

  independent   graft.rows=0: no exchange; the two policies train side by side on the same prompts
  graft         GRAFT's defaults: up to 2 of the other's successes join an all-fail group, weighted
                min(pi_self / pi_peer, 2) per token, rows whose geometric-mean ratio is outside [0.5, 2]
                rejected, positive advantages only
"""
from rlkit.train.config import base_config, sft_defaults
from rlkit.train.graft_stage import graft_defaults
from rlkit.train.models import role_model_defaults

BASE_MODEL = "experiments/base/model"   # the pretrained base (experiments/base/README.md), from the repository root
DIGITS = 4                 # operand digits: one step beyond the base's 3
OVERLAPS = {"o10": 0.1, "o30": 0.3}     # tag -> share of the other model's operator in a model's SFT data
MODELS = {"add": ("+", "-"), "sub": ("-", "+")}   # SFT model -> (own operator, weak operator); add is A, sub is B
SFT_STEPS = 150
SFT_BATCH = 64
STEPS = 80                 # RL iterations of every arm
EVAL_EVERY = 20
RL_PROMPTS = 16
RL_GROUP = 8
RL_LR = 1e-4
ARMS = {
    "independent": {"rows": 0},
    "graft": {"rows": 2, "cap": 2.0, "geo_low": 0.5, "geo_high": 2.0, "positive_only": True},
}
SFTS = {f"sft_{model}_{tag}": (model, tag) for tag in OVERLAPS for model in MODELS}
RUNS = {f"{arm}_{tag}": (arm, tag) for tag in OVERLAPS for arm in ARMS}
PRESETS = {**{name: f"SFT from the base: {1 - OVERLAPS[tag]:g} '{MODELS[m][0]}', {OVERLAPS[tag]:g} "
              f"'{MODELS[m][1]}' ({'policy A' if m == 'add' else 'peer B'})" for name, (m, tag) in SFTS.items()},
           **{name: f"the graft stage on '+' and '-' from the {tag} pair, graft fields {ARMS[arm]}"
              for name, (arm, tag) in RUNS.items()}}


def skills(shares: dict) -> dict:
  """A `mixture` of 4-digit problems: operator -> share (a skill named by its operator, so eval.by_category
  reports eval/accuracy/+ and /- as the RL task's categories do)."""
  return {op: {"task": "arithmetic", "weight": share, "kwargs": {"ops": op, "min_digits": DIGITS,
                                                                "max_digits": DIGITS}}
          for op, share in shares.items() if share > 0}


def _common(c):
  c.model.path = BASE_MODEL
  c.tokenizer.kind = "hf"            # the model folder's tokenizer (tokenizer.path "")
  c.data.num_test = 500
  c.data.max_prompt_len = 12         # BOS + "9999+9999=" (digits are single tokens)
  c.eval.num_examples = 500
  c.eval.batch_size = 500
  c.eval.max_new_tokens = 6          # "-8999" or "19998" and the end token
  c.eval.pass_k = 0
  c.eval.by_category = True
  c.checkpoint.every = 0             # the stage's last checkpoint only
  c.wandb.mode = "disabled"
  return c


def get_config(arg=None):
  preset = arg or "graft_o10"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for graft; choose one of {', '.join(PRESETS)}.")
  c = _common(base_config())
  if preset in SFTS:
    model, tag = SFTS[preset]
    own, weak = MODELS[model]
    c.stages = ("sft",)
    c.task.name = "mixture"
    c.task.kwargs.skills = skills({own: 1.0 - OVERLAPS[tag], weak: OVERLAPS[tag]})
    c.eval.extra_sets = {"mixed": {"skills": skills({"+": 0.5, "-": 0.5})}}   # both skills, 250 each
    c.data.num_train = SFT_STEPS * SFT_BATCH    # each example once
    c.sft = sft_defaults()
    c.sft.steps = SFT_STEPS
    c.sft.batch_size = SFT_BATCH
    c.sft.max_len = 20               # prompt, answer and end token
    c.sft.optimizer.lr = 3e-4
    c.sft.optimizer.warmup_steps = 10
    c.sft.optimizer.schedule = "cosine"
    return c
  arm, tag = RUNS[preset]
  c.task.name = "arithmetic"
  c.task.kwargs.ops = "+-"
  c.task.kwargs.min_digits = DIGITS
  c.task.kwargs.max_digits = DIGITS
  c.data.num_train = 8_000
  c.model.path = f"REQUIRED:--config.model.path=<the sft_add_{tag} workdir>"   # fails validation until set
  c.models.peer = role_model_defaults()
  c.models.peer.path = f"REQUIRED:--config.models.peer.path=<the sft_sub_{tag} workdir>"
  c.models.peer.trainable = True
  c.graft = g = graft_defaults()
  g.steps, g.eval_every = STEPS, EVAL_EVERY
  g.prompts_per_step, g.group_size, g.max_new_tokens = RL_PROMPTS, RL_GROUP, 6
  g.optimizer.lr = RL_LR
  g.graft.update(ARMS[arm])
  c.stages = ("graft",)
  return c
