"""The DiffusionART experiment (experiments/diffusion_art/): on the 2-D prompt task, with how many network
evaluations does ART reach the late-stage reward of Flow-GRPO, DanceGRPO, DiffusionNFT and DRaFT, and does its
drift-adaptive restoration keep it nearer the exact KL-regularised optimum than ART without restoration?

  python experiments/diffusion_art/run.py --root=/tmp/diffusion_art
  python launch.py --config=configs/diffusion_art.py:pretrain --workdir=/tmp/diffusion_art/pretrain_s0
  python launch.py --config=configs/diffusion_art.py:art --workdir=/tmp/diffusion_art/art_s0 \
      --config.rl.expert_path=/tmp/diffusion_art/pretrain_s0

toy2d (methods/embodied.md §1.4; rlkit/diffusion/toy2d.py): 8 prompts, each a 3-mode Gaussian mixture in the
plane; the reward r(x, c) = -||x - g_c||^2 + GAMMA x[0] points at each prompt's rare mode, GAMMA x[0] being the
hackable term off the data (true_reward leaves it out). `pretrain`: PRETRAIN_STEPS flow-matching steps (the
reference model, one per seed). Every other preset is one gen_rl stage of STEPS iterations from a pretrain run's
generator (`rl.expert_path`), 8 prompts x 8 samples an iteration, each method at its defaults:

  flow_grpo      Flow-GRPO (SDE sampling, per-step Gaussian log-probs, the clipped ratio)
  dance_grpo     DanceGRPO (shared initial noise per group, a random subset of steps trained)
  nft            DiffusionNFT (ODE samples, the negative-aware flow-matching loss)
  draft          DRaFT-K (the gradient of the reward through the sampler's last step)
  art            DiffusionART (OUR DESIGN): per-prompt aggregated directions, drift-adaptive restoration
  art_norestore  ART with the drift measured but never acted on
"""
from configs.diffusion import get_config as diffusion_config

PRETRAIN_STEPS = 2000
STEPS = 200
GAMMA = 0.5                     # the hackable term's weight
BETA = 1.0                      # the KL weight of the exact optimum opt_mmd measures to
EVAL_EVERY = 20
SAMPLES = 256                   # per prompt, the final samples the grids and the end-of-run measures use
ARMS = {
    "flow_grpo": dict(method="flow_grpo"),
    "dance_grpo": dict(method="dance_grpo"),
    "nft": dict(method="nft"),
    "draft": dict(method="draft"),
    "art": dict(method="art"),
    "art_norestore": dict(method="art"),
}
PRESETS = {"pretrain": f"{PRETRAIN_STEPS} flow-matching steps on toy2d (the reference generator)",
           **{arm: f"gen_rl, {STEPS} iterations of {fields['method']}"
              + (" without restoration" if arm == "art_norestore" else "") for arm, fields in ARMS.items()}}


def get_config(arg=None):
  preset = arg or "art"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for diffusion_art; choose one of {', '.join(PRESETS)}.")
  c = diffusion_config("toy2d")
  c.progress = False
  c.pretrain.steps = PRETRAIN_STEPS
  if preset == "pretrain":
    c.stages = ("pretrain",)
    return c
  c.stages = ("rl",)
  c.rl.update(steps=STEPS, eval_every=EVAL_EVERY, **ARMS[preset])
  c.rl.reward.update(gamma=GAMMA, beta=BETA)
  if preset == "art_norestore":
    c.rl.art.restore = False
  return c
