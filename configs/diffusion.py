"""Online RL of conditional flow generators (rlkit/diffusion; methods/embodied.md §1): a generator pretrained by flow
matching (stage `pretrain`, kind gen_pretrain), then fine-tuned on a reward (stage `rl`, kind gen_rl) by DiffusionART
(our design) or a baseline: `--config.rl.method=flow_grpo | dance_grpo | nft | draft | art`, and
`--config.rl.art.restore=False` for ART without restoration. No tokenizer, data or language model is built.

  python launch.py --config=configs/diffusion.py --workdir=/tmp/gen_toy2d                 # the 2-D prompt task
  python launch.py --config=configs/diffusion.py:digits --workdir=/tmp/gen_digits         # 8x8 digits
  python launch.py --config=configs/diffusion.py:test --workdir=/tmp/gen_test             # seconds

The toy2d reward points at each prompt's rare mode; `--config.rl.reward.gamma=0.5` adds the hackable term gamma * x[0]
(true_reward leaves it out), and opt_mmd measures the distance to the exact optimum for `rl.reward.beta`. One pretrained
generator can start many RL runs: `--config.stages='("rl",)' --config.rl.expert_path=PRETRAIN_WORKDIR`. Presets:
"""
from rlkit.diffusion.gen_pretrain_stage import gen_pretrain_defaults
from rlkit.diffusion.gen_rl_stage import gen_rl_defaults
from rlkit.train.config import base_config

PRESETS = {
    "toy2d": "default: 2000 flow-matching steps on the 8-prompt 2-D mixtures, then 200 iterations of ART",
    "digits": "4000 steps on the class-conditioned 8x8 digits, then 200 iterations of ART on the classifier's "
              "log-probability of the class",
    "test": "seconds: 4 pretraining steps of a tiny generator on toy2d, 2 RL iterations, every step checkpointed",
    "digits_test": "seconds: the test preset on the digits with the digit_confidence reward",
}


def get_config(arg=None):
  preset = arg or "toy2d"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for diffusion; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.stages = ("pretrain", "rl")
  c.wandb.mode = "disabled"
  c.pretrain = gen_pretrain_defaults()
  c.pretrain.eval_every = 500
  c.rl = gen_rl_defaults()
  c.rl.eval_every = 20
  if preset.startswith("digits"):
    for s in (c.pretrain, c.rl):
      s.data = "digits"
      s.flow.hidden = 256
    c.pretrain.steps = 4000
    c.rl.reward.name = "digit_confidence"
    c.rl.prompts = 10             # every class each iteration
  if preset in ("test", "digits_test"):
    c.pretrain.steps, c.pretrain.batch_size, c.pretrain.dataset_size = 4, 32, 256
    c.rl.steps, c.rl.prompts, c.rl.group_size, c.rl.rollout_steps = 2, 4, 4, 3
    for s in (c.pretrain, c.rl):
      s.flow.update(hidden=16, blocks=1, time_dim=8)
      s.eval_every, s.eval_samples, s.sample_steps = 2, 8, 3
    c.rl.monitor_samples = 8
    c.rl.nft.draws = 2
    c.rl.art.update(draws=2, probe_samples=2, drift_every=1,
                    tau_hi=1e-12, tau_target=1e-12)   # every drift check restores: the test walks that path too
    c.checkpoint.every = 1
  return c
