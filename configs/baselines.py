"""Every policy-gradient variant on the main job's task, each from the same SFT checkpoint (experiments/baselines/).

  python launch.py --config=configs/baselines.py:sft --workdir=/tmp/baselines/sft_s0 --config.seed=0
  python launch.py --config=configs/baselines.py:gspo --workdir=/tmp/baselines/gspo_s0 --config.seed=0 \
    --config.model.path=/tmp/baselines/sft_s0
  python launch.py --config=configs/baselines.py:gspo:quick ...     # the same, QUICK_STEPS iterations
  python experiments/baselines/run.py --root=/tmp/baselines [--quick] [--seeds=0,1,2] [--variants=grpo,dapo]

`sft` is the SFT stage of configs/grpo_arith.py (preset cpu) alone; one SFT run per seed is shared by every
variant. A variant preset is the RL stage of configs/grpo_arith.py alone (900 iterations x 32 prompts x 8
samples, AdamW lr 1e-4, one update per iteration, no KL, eval every 100) with only the fields of its
`VARIANTS` entry changed; it needs `--config.model.path` = that seed's SFT workdir (its newest checkpoint, the
SFT stage's last) and the same `--config.seed` (the seed fixes the data split, so the held-out set matches).
`<variant>:quick` runs QUICK_STEPS iterations, evaluating every QUICK_EVAL_EVERY (no preset given: `grpo`).
Settings are each method's defaults as rlkit's docstrings give them (rlkit/objectives/*.py), untuned here.
wandb is off (metrics.jsonl has everything). Every field is documented in rlkit/train/config.py.

  grpo          GRPO as published (DeepSeekMath): group-std advantages, PPO clip 0.2, seq-mean-token-mean
  grpo_main     the main job's RL stage unchanged: GRPO advantages and clip, token-mean
  dr_grpo       Dr. GRPO: advantage r - mean (no std), seq-mean-token-sum-norm (constant 1 / (S * 5))
  dapo          DAPO: clip-higher 0.2 / 0.28, dynamic sampling, token-mean, soft overlong penalty over the
                last token of the 5-token budget (DAPO's 4k of 20k, 20%: only budget-exhausting rows, all wrong)
  gspo          GSPO: sequence ratio clipped at 3e-4 / 4e-4, seq-mean-token-mean
  cispo         CISPO (verl's clip): weight sg[clip(rho, 0, 1.2)] on A log pi (eps_low 1: no lower clip), token-mean
  sapo          SAPO: smooth gate, tau_pos 1.0 / tau_neg 1.05, seq-mean-token-mean
  gmpo          GMPO: geometric-mean ratio, log-space clip 0.4 / 0.4, seq-mean-token-mean
  rloo          RLOO: leave-one-out baseline advantages, token-mean
  reinforce_pp  REINFORCE++: batch-whitened returns (gamma 1, no group baseline), token-mean
  ppo_critic    PPO with a critic: GAE (gamma 1, lambda 1, whitened), value clip 0.5, critic AdamW lr 1e-3
                (verl's critic/actor lr ratio of 10), token-mean
"""
from rlkit.train.config import set_dotted, sibling_config

grpo_arith = sibling_config(__file__, "grpo_arith")

QUICK_STEPS = 100
QUICK_EVAL_EVERY = 25
SEQ = {"aggregation": "seq-mean-token-mean"}

# Per-variant changes to the main job's RL stage (rl.<key>; dotted keys reach nested sections).
VARIANTS = {
    "grpo": dict(SEQ),
    "grpo_main": {},
    "dr_grpo": {"advantage": "none", "aggregation": "seq-mean-token-sum-norm"},
    "dapo": {"eps_low": 0.2, "eps_high": 0.28, "filter": "dynamic_sampling", "aggregation": "token-mean",
             "overlong_cache": 1, "overlong_factor": 1.0},
    "gspo": {"policy_loss": "gspo", "eps_low": 3e-4, "eps_high": 4e-4, **SEQ},
    "cispo": {"policy_loss": "cispo", "eps_low": 1.0, "eps_high": 0.2, "aggregation": "token-mean"},
    "sapo": {"policy_loss": "sapo", "policy_kwargs.tau_pos": 1.0, "policy_kwargs.tau_neg": 1.05, **SEQ},
    "gmpo": {"policy_loss": "gmpo", "eps_low": 0.4, "eps_high": 0.4, **SEQ},
    "rloo": {"advantage": "rloo"},
    "reinforce_pp": {"advantage": "reinforce_pp", "gamma": 1.0},
    "ppo_critic": {"advantage": "gae", "gamma": 1.0, "gae_lambda": 1.0, "whiten_advantages": True,
                   "critic.value_clip": 0.5, "critic.optimizer.lr": 1e-3},
}

PRESETS = {"sft": "the SFT stage of configs/grpo_arith.py alone (one per seed, shared by every variant)",
           **{v: f"the main job's RL stage, rl fields changed: {VARIANTS[v] or 'none'}" for v in VARIANTS},
           **{f"{v}:quick": f"{v} for {QUICK_STEPS} iterations" for v in VARIANTS}}


def get_config(arg=None):
  preset = arg or "grpo"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for baselines; choose one of {', '.join(PRESETS)}.")
  variant, _, modifier = preset.partition(":")
  c = grpo_arith.get_config("cpu")
  c.wandb.mode = "disabled"
  if variant == "sft":
    c.stages = ("sft",)
    return c
  c.stages = ("rl",)
  c.model.path = "REQUIRED:--config.model.path=<the seed's SFT workdir>"   # fails validation until set
  for key, value in VARIANTS[variant].items():
    set_dotted(c.rl, key, value)
  if modifier == "quick":
    c.rl.steps = QUICK_STEPS
    c.rl.eval_every = QUICK_EVAL_EVERY
  return c
