"""The diffusion reward model's tiny experiment (experiments/drm/): four reward heads on one frozen embedding of
(prompt, response) learn the rating distribution of a synthetic annotator population that splits on style,
then RL from the same SFT policy with the scalar head's mean against the diffusion head's lower quantile.

  python launch.py --config=configs/drm.py:sft --workdir=/tmp/drm/sft_s0 --config.seed=0
  python launch.py --config=configs/drm.py:rl_drm --workdir=/tmp/drm/rl_drm_s0 --config.seed=0 \
    --config.model.path=/tmp/drm/sft_s0 --config.models.embed.path=/tmp/drm/sft_s0 \
    --config.rl.reward.kwargs.path=/tmp/drm/sft_s0/reward_model/rm_diffusion
  python experiments/drm/run.py --root=/tmp/drm [--seeds=0,1,2]                     # all of it

Task `annotated_responses` (rlkit/data/annotated.py): "12+7=" with one rated response, terse "19" (everyone
agrees) or verbose "19 as 12+7=19" (group A +2.5, group B -1.5: bimodal), right or a near miss (+1 for
everyone for a right one), 8 ratings per response, all at the task's defaults. `sft` is one run of five
stages: the main job's decoder (configs/grpo_arith.py, preset cpu: 0.4M parameters, character tokens) trained
from scratch by SFT for SFT_STEPS steps of 64 on the right answers in both styles (half verbose), then
`rm_<head>` for each of HEADS: the reward_model stage (rlkit/train/reward_model_stage.py) on that decoder's
frozen mean-pooled embeddings of the NUM_TRAIN training examples, RM_STEPS Adam steps of 64 examples, lr RM_LR
on a cosine to 5%, every head at its registry defaults (no head is tuned), written to
<workdir>/reward_model/rm_<head>. The RM stages leave the decoder as it was, so the workdir's newest
checkpoint is the SFT policy. Arms, each from that checkpoint with the main job's RL settings (32 prompts x 8
samples at temperature 1, lr 1e-4, one update per iteration, no KL) for RL_STEPS iterations, the decoder
itself as the frozen embedder (`models.embed`):

  rl_scalar   reward = the scalar head's prediction (`reward_model`, risk mean)
  rl_drm      reward = the diffusion head's 10% quantile over RM_SAMPLES DDIM samples (risk quantile 0.1)

`test` (under a minute): a tiny decoder, 4 SFT steps and one 8-step diffusion head; `test_rl` (under a
minute): 2 RL iterations with that head, given the test workdir as model.path, models.embed.path and the reward
path <workdir>/reward_model/rm_diffusion.
"""
from rlkit.train.config import sibling_config
from rlkit.train.models import role_model_defaults
from rlkit.train.reward_model_stage import reward_model_defaults

grpo_arith = sibling_config(__file__, "grpo_arith")

NUM_TRAIN = 4000
SFT_STEPS = 300
HEADS = ("scalar", "gaussian", "quantile", "diffusion")
RM_STEPS = 1000
RM_LR = 3e-3
RL_STEPS = 50
EVAL_EVERY = 25
RM_SAMPLES = 32
RISK_LEVEL = 0.1
ARMS = {"rl_scalar": {"head": "scalar", "risk": "mean"},
        "rl_drm": {"head": "diffusion", "risk": "quantile", "level": RISK_LEVEL}}
PRESETS = {"sft": f"SFT_STEPS={SFT_STEPS} SFT steps, then the reward_model stage for each head in {HEADS}",
           **{arm: f"RL with the {spec['head']} head's {spec['risk']} as the reward" for arm, spec in ARMS.items()},
           "test": "under a minute: a tiny decoder, 4 SFT steps, one diffusion head of 8 steps",
           "test_rl": "under a minute: 2 RL iterations with the test preset's head (its workdir as the paths)"}
REQUIRED = "REQUIRED:--config.{key}=<the seed's sft workdir{tail}>"    # fails validation (or loading) until set


def _heads(c, heads, steps: int) -> None:
  """One reward_model stage section `rm_<head>` per head, after the SFT stage."""
  for head in heads:
    s = reward_model_defaults()
    s.head = head
    s.steps = steps
    s.batch_size = 64
    s.eval_samples = 64
    s.optimizer.name = "adam"
    s.optimizer.lr = RM_LR
    s.optimizer.schedule = "cosine"    # fit_head's reason: the diffusion loss's fresh noise stays in a last
    s.optimizer.final_lr_frac = 0.05   # iterate at a constant rate; every head gets the same schedule
    c[f"rm_{head}"] = s
  c.stages = ("sft",) + tuple(f"rm_{head}" for head in heads)


def _rl(c, spec: dict) -> None:
  c.stages = ("rl",)
  c.model.path = REQUIRED.format(key="model.path", tail="")
  c.models.embed = role_model_defaults()
  c.models.embed.path = REQUIRED.format(key="models.embed.path", tail="")
  c.rl.reward.name = "reward_model"
  head_path = REQUIRED.format(key="rl.reward.kwargs.path", tail=f"/reward_model/rm_{spec['head']}")
  c.rl.reward.kwargs = {"path": head_path, "embed_role": "embed", "risk": spec["risk"],
                        "level": spec.get("level", RISK_LEVEL), "samples": RM_SAMPLES}


def get_config(arg=None):
  preset = arg or "rl_drm"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for drm; choose one of {', '.join(PRESETS)}.")
  test = preset.startswith("test")
  c = grpo_arith.get_config("test" if test else "cpu")
  c.wandb.mode = "disabled"
  c.task.name = "annotated_responses"
  c.data.num_train = 256 if test else NUM_TRAIN
  c.data.max_prompt_len = 8          # BOS + "99+99="
  c.sft.max_len = 24                 # the prompt, "198 as 99+99=198" and the end token
  c.sft.steps = 4 if test else SFT_STEPS
  c.sft.stop_at_loss = 0.0           # a fixed step count: every seed's embedding model gets the same training
  c.rl.max_new_tokens = c.eval.max_new_tokens = 17
  c.eval.pass_k = 0
  c.checkpoint.every = 100
  if preset == "test":
    _heads(c, ("diffusion",), 8)
  elif preset == "test_rl":
    _rl(c, ARMS["rl_drm"])
    c.rl.steps = 2
    c.rl.reward.kwargs.samples = 4
  elif preset == "sft":
    _heads(c, HEADS, RM_STEPS)
  else:
    _rl(c, ARMS[preset])
    c.rl.steps = RL_STEPS
    c.rl.eval_every = EVAL_EVERY
  return c
