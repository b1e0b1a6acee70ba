"""ProRubric's tiny experiment (experiments/prorubric/): an advice-piling rubric that additive scoring lets a
policy game, scored additively (HealthBench) or with ProRubric's gate, at three advice/decision weight ratios.

  python launch.py --config=configs/prorubric.py:sft --workdir=/tmp/prorubric/sft_s0 --config.seed=0
  python launch.py --config=configs/prorubric.py:gated_w0.5 --workdir=/tmp/prorubric/gated_w0.5_s0 \
    --config.seed=0 --config.model.path=/tmp/prorubric/sft_s0
  python experiments/prorubric/run.py --root=/tmp/prorubric [--seeds=0,1,2]        # all of it

`sft`: the main job's SFT stage (configs/grpo_arith.py, preset cpu) alone, the base policy (1-2 digit sums,
about a third right). Every arm starts from it on the same sums with the task `advice_arithmetic`
(rlkit/data/advice.py): each example's rubric is the decision (the sum, critical, 1 point) and ten advice items
"mentions the digit d" (W points each), and the main job's RL settings (32 prompts x 8 samples at temperature
1, at most 5 new tokens, lr 1e-4, one update per iteration, no KL) for STEPS iterations, evaluated every
EVAL_EVERY on the 500 held-out sums. Arms, `<mode>_w<W>`:

  additive_w<W>  reward = HealthBench's score: (1[sum right] + W * distinct digits written) / (1 + 10 W)
  gated_w<W>     ProRubric, mode `gated` (hard gate on the decision, penalties none): the same score times
                 1[sum right], so advice pays only with the decision made
  W in RATIOS    0.1 (writing digits never beats the sum), 0.5 (a 5-digit pile ties or beats a short right
                 sum), 1.0 (the pile wins clearly)
"""
from rlkit.train.config import sibling_config

grpo_arith = sibling_config(__file__, "grpo_arith")

STEPS = 100
EVAL_EVERY = 25
RATIOS = (0.1, 0.5, 1.0)
MODES = ("additive", "gated")
ARMS = {f"{mode}_w{w}": (mode, w) for mode in MODES for w in RATIOS}
PRESETS = {"sft": "the base policy: the main job's SFT stage",
           **{arm: f"RL with the advice-piling rubric, mode {mode}, advice points {w}"
              for arm, (mode, w) in ARMS.items()}}


def get_config(arg=None):
  preset = arg or "gated_w0.5"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for prorubric; choose one of {', '.join(PRESETS)}.")
  c = grpo_arith.get_config("cpu")
  c.wandb.mode = "disabled"
  # The main job's sums with the rubric attached (the same prompts and demonstrations: SFT is the main job's,
  # and its evaluation reports the rubric metrics too, at the default advice points 0.5).
  c.task.name = "advice_arithmetic"
  if preset == "sft":
    c.stages = ("sft",)
    return c
  mode, w = ARMS[preset]
  c.model.path = "REQUIRED:--config.model.path=<the seed's sft workdir>"   # fails validation until set
  c.task.kwargs.decision_points = 1.0
  c.task.kwargs.advice_points = w
  c.rl.reward.name = "rubric"
  c.rl.reward.kwargs = {"mode": mode}
  c.rl.steps = STEPS
  c.rl.eval_every = EVAL_EVERY
  c.stages = ("rl",)
  return c
