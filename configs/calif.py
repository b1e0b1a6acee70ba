"""CALIF's tiny experiment (experiments/calif/): instruction-following RL on sums that ask for a keyword, with a
constraint-only reward, with CALIF's quality-anchored reward, and with the constraint reward plus a KL penalty.

  python launch.py --config=configs/calif.py:sft --workdir=/tmp/calif/sft_s0 --config.seed=0
  python launch.py --config=configs/calif.py:calif --workdir=/tmp/calif/calif_s0 --config.seed=0 \
    --config.model.path=/tmp/calif/sft_s0 --config.models.reference.path=/tmp/calif/sft_s0
  python experiments/calif/run.py --root=/tmp/calif [--seeds=0,1,2]                 # all of it

Task `keyword_arithmetic` (rlkit/data/constrained.py): "17+25=[BLUE]" asks for the sum and the word, "42 BLUE"
does both. `sft`: the main job's model and SFT settings (configs/grpo_arith.py, preset cpu) for SFT_STEPS steps
on these prompts, whose demonstrations write the word on 30% of the examples (the base policy follows the
instruction sometimes). Every arm starts from it with the main job's RL settings (32 prompts x 8 samples at
temperature 1, lr 1e-4, one update per iteration) for STEPS iterations, at most 10 new tokens, evaluated every
EVAL_EVERY on the 500 held-out prompts. Arms (reward, rlkit/rewards/calif.py):

  constraints     r = share of the constraints met (here: the word is there), no KL
  calif           r = constraints * task verifier * min(1, content / (0.5 * reference content)), the reference
                  being the frozen SFT policy (`models.reference`) answering the prompt without "[WORD]"
  constraints_kl  the constraint reward with a KL penalty to the SFT policy, rl.kl_beta = KL_BETA (k3)
"""
from rlkit.train.config import sibling_config
from rlkit.train.models import role_model_defaults

grpo_arith = sibling_config(__file__, "grpo_arith")

SFT_STEPS = 400
STEPS = 150
EVAL_EVERY = 25
KL_BETA = 0.1
ARMS = {"constraints": {"name": "constraints"},
        "calif": {"name": "calif", "kwargs": {"reference_role": "reference"}},
        "constraints_kl": {"name": "constraints"}}
PRESETS = {"sft": f"the base policy: SFT_STEPS={SFT_STEPS} steps on keyword sums (30% of demonstrations follow)",
           **{arm: f"RL with reward {spec['name']!r}{' and KL' if arm.endswith('_kl') else ''}"
              for arm, spec in ARMS.items()}}


def get_config(arg=None):
  preset = arg or "calif"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for calif; choose one of {', '.join(PRESETS)}.")
  c = grpo_arith.get_config("cpu")
  c.wandb.mode = "disabled"
  c.task.name = "keyword_arithmetic"
  c.data.max_prompt_len = 16         # BOS + "99+99=[GREEN]"
  c.sft.max_len = 28                 # the prompt, "198 GREEN" and the end token
  c.rl.max_new_tokens = c.eval.max_new_tokens = 10
  c.eval.pass_k = 0
  if preset == "sft":
    c.stages = ("sft",)
    c.sft.steps = SFT_STEPS
    c.sft.stop_at_loss = 0.0         # the word's 30% makes the loss floor higher than the main job's threshold
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
