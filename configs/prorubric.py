"""ProRubric's tiny experiment (experiments/prorubric/), from the pretrained base: an advice-piling rubric scored
additively (HealthBench), with ProRubric's gate (our design), or by the released protocol's dimensions.

  python launch.py --config=configs/prorubric.py:sft --workdir=/tmp/prorubric/sft_s0 --config.seed=0
  python launch.py --config=configs/prorubric.py:gated_w0.5 --workdir=/tmp/prorubric/gated_w0.5_s0 \
    --config.seed=0 --config.model.path=/tmp/prorubric/sft_s0
  python experiments/prorubric/run.py --root=/tmp/prorubric [--seeds=0,1,2]        # all of it, gate first

`sft`: the pretrained base (experiments/base/model, `--config.model.path` to use another) fine-tuned for SFT_STEPS
steps on the task's sums (a share PAD_FRAC of the demonstrations padded with one digit), the base policy of every
arm (its own per seed). Every arm starts from it on the same sums with the task `advice_arithmetic`
(rlkit/data/advice.py): each example's rubric is the decision (the sum, critical, 1 point), ten advice items
"mentions the digit d" (W points each) and the released protocol's grouping of them (dimension "answer" with the
failure clause "writes anything after the answer", dimension "advice"). RL: 32 prompts x 8 samples at temperature 1
(the driver passes the gate's, 1 or 1.5), at most 5 new tokens, lr 1e-4, one update per iteration, no KL, for STEPS
iterations, evaluated every EVAL_EVERY on the 500 held-out sums. Arms, `<mode>_w<W>`:

  additive_w<W>     reward = HealthBench's score: (1[sum right] + W * distinct digits written) / (1 + 10 W)
  gated_w<W>        ProRubric (ours), mode `gated` (hard gate on the decision, penalties none): the same score
                    times 1[sum right], so advice pays only with the decision made
  dimensions_w1.0   the released protocol, mode `dimensions`: 1[sum right, nothing after it] / (1 + 10 W) (the
                    advice dimension needs all ten digits, out of reach in 5 tokens); the group advantage
                    divides the constant out, so one W stands for all
  W in RATIOS       0.1 (writing digits never beats the sum), 0.5 (a 5-digit pile ties or beats a short right
                    sum), 1.0 (the pile wins clearly)

GATE holds the calibration gate's thresholds (experiments/prorubric/README.md), which experiments/prorubric/run.py
checks on every seed's `sft` policy before any arm runs.
"""
from rlkit.train.config import sibling_config

grpo_arith = sibling_config(__file__, "grpo_arith")

BASE = "experiments/base/model"
SFT_STEPS = 100
# Amendment 1 (README): the first attempt's gate failed on G2 (its SFT policy wrote the bare sum: at most 0.6% of
# samples outscored it); a share PAD_FRAC of the SFT demonstrations now pad the sum with one digit ("42 7").
PAD_FRAC = 0.3
STEPS = 60
EVAL_EVERY = 20
RATIOS = (0.1, 0.5, 1.0)
MODES = ("additive", "gated")
ARMS = {**{f"{mode}_w{w}": (mode, w) for mode in MODES for w in RATIOS}, "dimensions_w1.0": ("dimensions", 1.0)}
PRESETS = {"sft": f"the base policy: the pretrained base, SFT_STEPS={SFT_STEPS} steps on the sums",
           **{arm: f"RL with the advice-piling rubric, mode {mode}, advice points {w}"
              for arm, (mode, w) in ARMS.items()}}
# The calibration gate (README): on 500 held-out sums, each seed's SFT policy answers at least `min_accuracy` of
# them right (greedy), and at least `min_outscoring` of its samples would outscore the bare right answer under the
# additive score at W = `pile_w` (a pile or padding: what RL must be able to find), at the first of `temperatures`
# where every seed does so; the arms then sample at that temperature.
GATE = {"min_accuracy": 0.3, "min_outscoring": 0.01, "pile_w": 1.0, "samples": 4, "temperatures": (1.0, 1.5)}


def get_config(arg=None):
  preset = arg or "gated_w0.5"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for prorubric; choose one of {', '.join(PRESETS)}.")
  c = grpo_arith.get_config("cpu")
  c.wandb.mode = "disabled"
  c.tokenizer.kind = "hf"            # the base's BPE; tokenizer.path "" takes model.path's
  c.tokenizer.path = ""
  # The main job's sums with the rubric attached; the SFT policy's evaluations report the rubric metrics too,
  # at the default advice points 0.5.
  c.task.name = "advice_arithmetic"
  c.task.kwargs.pad_frac = PAD_FRAC  # every stage's examples alike; only the SFT demonstrations read it
  c.data.max_prompt_len = 0          # derived: the longest held-out prompt
  c.eval.pass_k = 0                  # greedy is what the predictions read; the gate samples on its own
  if preset == "sft":
    c.stages = ("sft",)
    c.model.path = BASE
    c.sft.steps = SFT_STEPS
    c.sft.stop_at_loss = 0.0         # a fixed length: the base starts below the main job's threshold
    c.sft.optimizer.lr = 1e-4        # a pretrained model: adapt to the prompts, do not retrain it
    c.sft.optimizer.warmup_steps = 10
    return c
  mode, w = ARMS[preset]
  c.model.path = "REQUIRED:--config.model.path=<the seed's sft workdir>"   # fails validation until set
  c.stages = ("rl",)
  c.task.kwargs.decision_points = 1.0
  c.task.kwargs.advice_points = w
  c.rl.reward.name = "rubric"
  c.rl.reward.kwargs = {"mode": mode}
  c.rl.steps = STEPS
  c.rl.eval_every = EVAL_EVERY
  return c
