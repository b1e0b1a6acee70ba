"""GRAFT's tiny experiment (experiments/graft/): two policies with complementary skills trade successes.

  python launch.py --config=configs/graft.py:sft_add --workdir=/tmp/graft/sft_add_s0 --config.seed=0
  python launch.py --config=configs/graft.py:sft_sub --workdir=/tmp/graft/sft_sub_s0 --config.seed=0
  python launch.py --config=configs/graft.py:graft --workdir=/tmp/graft/graft_s0 --config.seed=0 \
    --config.model.path=/tmp/graft/sft_add_s0 --config.models.peer.path=/tmp/graft/sft_sub_s0
  python experiments/graft/run.py --root=/tmp/graft [--seeds=0,1,2]      # all of it

`sft_add` / `sft_sub`: the main job's SFT stage (configs/grpo_arith.py, preset cpu) on 1-2 digit additions
only / subtractions only: policy A and its peer B. An arm is one `graft` stage on the mixed task (`a+b=` and
`a-b=`, equally likely) with A as the policy (`--config.model.path`) and B as `models.peer`
(`--config.models.peer.path`), both trained with the main job's RL settings (32 prompts x 8 samples, lr 1e-4,
one update per iteration, no KL) for STEPS iterations; held-out accuracy per operator (`eval.by_category`)
for both models every EVAL_EVERY. The arms change only the exchange (`ARMS`, keys of `graft.`):

  independent   graft.rows=0: no exchange; the two policies train side by side on the same prompts
  naive         up to 2 of the other's successes join an all-fail group, weight 1, no rejection, and they
                train also where their advantage is negative
  graft         GRAFT's defaults: weight min(pi_self / pi_peer, 2), rows whose geometric-mean ratio is
                outside [0.5, 2] rejected, positive advantages only
"""
from rlkit.train.config import sibling_config
from rlkit.train.graft_stage import graft_defaults
from rlkit.train.models import role_model_defaults

grpo_arith = sibling_config(__file__, "grpo_arith")

STEPS = 100
EVAL_EVERY = 25
ARMS = {
    "independent": {"rows": 0},
    "naive": {"rows": 2, "cap": 0.0, "geo_high": 0.0, "positive_only": False},
    "graft": {"rows": 2, "cap": 2.0, "geo_low": 0.5, "geo_high": 2.0, "positive_only": True},
}
SFT_OPS = {"sft_add": "+", "sft_sub": "-"}
PRESETS = {"sft_add": "policy A: the main job's SFT stage on additions only",
           "sft_sub": "peer B: the main job's SFT stage on subtractions only",
           **{arm: f"the graft stage on + and -, graft fields {fields}" for arm, fields in ARMS.items()}}


def get_config(arg=None):
  preset = arg or "graft"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for graft; choose one of {', '.join(PRESETS)}.")
  c = grpo_arith.get_config("cpu")
  c.wandb.mode = "disabled"
  if preset in SFT_OPS:
    c.stages = ("sft",)
    c.task.kwargs.ops = SFT_OPS[preset]
    return c
  c.task.kwargs.ops = "+-"
  c.model.path = "REQUIRED:--config.model.path=<the seed's sft_add workdir>"   # fails validation until set
  c.models.peer = role_model_defaults()
  c.models.peer.path = "REQUIRED:--config.models.peer.path=<the seed's sft_sub workdir>"
  c.models.peer.trainable = True
  c.graft = graft_defaults()
  for key, value in c.rl.items():         # the main job's RL settings
    if key != "kind":
      c.graft[key] = value
  c.graft.steps = STEPS
  c.graft.eval_every = EVAL_EVERY
  c.graft.graft.update(ARMS[preset])
  c.stages = ("graft",)
  c.eval.by_category = True
  return c
