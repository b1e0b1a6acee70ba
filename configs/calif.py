"""CALIF's tiny experiment (experiments/calif/), from the pretrained base: instruction-following RL on sums that
ask for a keyword, with a constraint-only reward, with CALIF's quality-anchored reward, with the constraint reward
plus a KL penalty, and with the constraint reward plus the task verifier (added, not multiplied: the control).

  python launch.py --config=configs/calif.py:sft --workdir=/tmp/calif/sft_s0 --config.seed=0
  python launch.py --config=configs/calif.py:calif --workdir=/tmp/calif/calif_s0 --config.seed=0 \
    --config.model.path=/tmp/calif/sft_s0 --config.models.reference.path=/tmp/calif/sft_s0
  python experiments/calif/run.py --root=/tmp/calif [--seeds=0,1,2]                 # all of it, gate first

Task `keyword_arithmetic` (rlkit/data/constrained.py): "17+25=[BLUE]" asks for the sum and the word, "42 BLUE"
does both. `sft`: the pretrained base (experiments/base/model; `--config.model.path` to use another), which
knows this skill (its corpus followed the instruction half the time), fine-tuned for SFT_STEPS steps on these
prompts with demonstrations that write the word on 30% of the examples: the base policy of every arm (its own per
seed) follows the instruction sometimes, so RL has something to reinforce. Every arm starts from it: 32 prompts
x 8 samples at temperature 1, at most 8 new tokens, lr 1e-4, one update per iteration, for STEPS iterations,
evaluated every EVAL_EVERY on the 500 held-out prompts. Arms (reward, rlkit/rewards/calif.py):

  constraints            r = share of the constraints met (here: the word is there), no KL
  calif                  r = constraints * task verifier * min(1, content / (0.5 * reference content)), the
                         reference being the frozen SFT policy (`models.reference`) answering the prompt without
                         "[WORD]"
  constraints_kl         the constraint reward with a KL penalty to the SFT policy, rl.kl_beta = KL_BETA (k3)
  constraints_plus_task  r = constraints + task verifier: CALIF's verifier added instead of multiplied

GATE holds the calibration gate's thresholds (experiments/calif/README.md), which experiments/calif/run.py checks
on every seed's `sft` policy before any arm runs.
"""
from rlkit.train.config import sibling_config
from rlkit.train.models import role_model_defaults

grpo_arith = sibling_config(__file__, "grpo_arith")

BASE = "experiments/base/model"
SFT_STEPS = 150
STEPS = 80
EVAL_EVERY = 20
KL_BETA = 0.1
ARMS = {"constraints": {"name": "constraints"},
        "calif": {"name": "calif", "kwargs": {"reference_role": "reference"}},
        "constraints_kl": {"name": "constraints"},
        "constraints_plus_task": {"name": "constraints_plus_task"}}
PRESETS = {"sft": f"the base policy: the pretrained base, SFT_STEPS={SFT_STEPS} steps on keyword sums (30% of "
                  "demonstrations follow)",
           **{arm: f"RL with reward {spec['name']!r}{' and KL' if arm.endswith('_kl') else ''}"
              for arm, spec in ARMS.items()}}
# The calibration gate (README): per seed, the SFT policy's greedy accuracy at least MIN_ACCURACY and its greedy
# satisfaction at most MAX_GREEDY_FOLLOW (room to rise), and its sampled following rate (temperature 1, `samples`
# per held-out prompt) within FOLLOW (RL needs samples with and without the word).
GATE = {"min_accuracy": 0.5, "max_greedy_follow": 0.9, "follow": (0.05, 0.95), "samples": 2}


def get_config(arg=None):
  preset = arg or "calif"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for calif; choose one of {', '.join(PRESETS)}.")
  c = grpo_arith.get_config("cpu")
  c.wandb.mode = "disabled"
  c.tokenizer.kind = "hf"            # the base's BPE; tokenizer.path "" takes model.path's
  c.tokenizer.path = ""
  c.task.name = "keyword_arithmetic"
  c.data.max_prompt_len = 0          # derived: the longest held-out prompt ("99+99=[GREEN]")
  c.rl.max_new_tokens = c.eval.max_new_tokens = 8   # "198 GREEN" is 4 tokens and the end: room to pad
  c.eval.pass_k = 0
  if preset == "sft":
    c.stages = ("sft",)
    c.model.path = BASE
    c.sft.steps = SFT_STEPS
    c.sft.stop_at_loss = 0.0         # a fixed length: the base starts below the main job's threshold
    c.sft.max_len = 28               # the prompt, "198 GREEN" and the end token, with room
    c.sft.optimizer.lr = 1e-4        # a pretrained model: adapt it to these demonstrations, do not retrain it
    c.sft.optimizer.warmup_steps = 10
    return c
  c.model.path = "REQUIRED:--config.model.path=<the seed's sft workdir>"   # fails validation until set
  c.stages = ("rl",)
  c.rl.steps = STEPS
  c.rl.eval_every = EVAL_EVERY
  c.rl.reward.name = ARMS[preset]["name"]
  c.rl.reward.kwargs = ARMS[preset].get("kwargs", {})
  if preset == "calif":
    c.models.reference = role_model_defaults()
    c.models.reference.path = "REQUIRED:--config.models.reference.path=<the seed's sft workdir>"
  if preset == "constraints_kl":
    c.rl.kl_beta = KL_BETA
  return c
