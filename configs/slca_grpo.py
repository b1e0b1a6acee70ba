"""SLCA-GRPO's experiment from the pretrained base (experiments/slca_grpo/): does crediting the tool call and the
summary apart protect the call from a noisy summary judge?

  python experiments/slca_grpo/run.py --root=/tmp/slca_grpo               # the gate, then 3 seeds x 6 arms
  python launch.py --config=configs/slca_grpo.py:slca_n1.5 --workdir=/tmp/slca_grpo/slca_n1.5_s0 --config.seed=0

Built on configs/agentic.py's `calculator` preset (the multi-turn collector, the calculator environment, the
`tool_task` reward; every field not set here is that preset's, documented there and in rlkit/train/config.py
and rl_config.py). Every run starts from experiments/base/model and runs one RL stage on the `tool_calls` task
with operands of up to MAX_DIGITS digits (the base's corpus stopped at 3): episodes of at most 2 policy turns
(the call, then the summary after the calculator's result), STEPS iterations of PROMPTS prompts x GROUP samples
at temperature 1, AdamW at LR, one update per iteration, no KL. The reward's execution component (the first
call is the gold call and ran) is the tool-call accuracy; its summary component is the judge: the rule (the
summary states the right value) plus N(0, noise^2) from a deterministic judge seeded by the run's seed, plus
the reward's penalties (0.5 per failed or extra call). Evaluated at the start and every EVAL_EVERY iterations,
greedy, single-turn, 500 held-out prompts: the task grades the call (`eval/accuracy`). Presets:

  gate              the calibration gate's run: grpo_n0 with every weight frozen (the learning rate of 0 that
                    rlkit refuses) for GATE["steps"] iterations: the base's own multi-turn behaviour, nothing
                    learned; experiments/slca_grpo/run.py reads it before any arm
  grpo_n<noise>     GRPO: one group advantage of the summed reward on every trained token (rl.advantage=group)
  slca_n<noise>     SLCA: execution's group advantage on the tool-call turn's tokens, the judge's on the
                    summary turn's (rl.advantage=slca, kinds tool_call,summary, weights 1,1)

for judge noise (std) in NOISES. A GRPO arm and an SLCA arm of the same noise and seed differ in rl.advantage
only: same data, same judge, same sampler keys, so their first iteration plays the same episodes.
"""
from rlkit.train.config import set_dotted, sibling_config

agentic = sibling_config(__file__, "agentic")

BASE_MODEL = agentic.BASE_MODEL   # experiments/base/model, from the repository root
MAX_DIGITS = 4                  # operands of 1..MAX_DIGITS digits; the base's corpus stopped at 3 (README)
STEPS = 60                      # RL iterations of every arm (README "Budget": set to fit ~90 CPU-minutes)
EVAL_EVERY = 20                 # held-out evaluations at 0, 20, 40, 60
WINDOW = 10                     # iterations averaged for "first" and "final" tool-call accuracy (README)
PROMPTS, GROUP = 8, 8
LR = 5e-5                       # onepo's rate for this base (README "Setup": why not agentic's 1e-5)
NOISES = (0.0, 0.5, 1.5)        # the summary judge's noise std, rl.reward.kwargs.judge_noise
# The calibration gate (experiments/slca_grpo/README.md), on the `gate` preset's runs of GATE["seeds"], pooled.
GATE = {"steps": 3,             # iterations of the gate's run (frozen: each a fresh batch of the base's episodes)
        "seeds": (0, 1, 2),     # the gate's runs, pooled
        "call_low": 0.15,       # G1: mean reward/execution at least this (something to reinforce) ...
        "call_high": 0.85,      # ... and at most this (room to learn)
        "summary_min": 0.3}     # G2: mean reward/summary_rule at least this (summaries the judge can score)
BUDGET_MINUTES = 90             # the arms' projected CPU wall must fit (run.py checks it after the gate)


def arm_name(kind: str, noise: float) -> str:
  """"grpo_n0", "slca_n1.5": the arm of advantage `kind` at judge noise `noise`."""
  return f"{kind}_n{noise:g}"


ESTIMATORS = {"grpo": {"advantage": "group"},
              "slca": {"advantage": "slca", "slca.kinds": "tool_call,summary", "slca.weights": "1.0,1.0"}}
ARMS = {arm_name(kind, noise): {**fields, "reward.kwargs.judge_noise": noise}
        for noise in NOISES for kind, fields in ESTIMATORS.items()}
PRESETS = {"gate": f"the calibration gate: {arm_name('grpo', 0.0)}, every weight frozen, {GATE['steps']} iterations",
           **{arm: f"tool task ({MAX_DIGITS}-digit operands) from the base, rl fields {fields}"
              for arm, fields in ARMS.items()}}


def get_config(arg=None):
  preset = arg or arm_name("slca", NOISES[-1])
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for slca_grpo; choose one of {', '.join(PRESETS)}.")
  c = agentic.get_config("calculator")
  c.task.kwargs.max_digits = MAX_DIGITS   # agentic: 2; one step beyond the base's 3 (README "Setup")
  c.data.num_train = 5_000               # 480 prompts are drawn (STEPS x PROMPTS); agentic: the default
  c.data.num_test = 500
  c.data.max_prompt_len = 16             # BOS + "What is 9999 times 9999?\n": 15 tokens, a digit a token
  mt = c.rl.multi_turn
  mt.max_turns = 2                       # agentic: 3; the call, then the summary (a second call is penalised)
  mt.turn_tokens = 32                    # agentic: 24; the longest turn, "<say>9999 times 9999 is 99980001.</say>"
                                         # and the end token, is 27 tokens; the longest call 17
  c.rl.max_new_tokens = 64               # as agentic: the longest episode, 17 + 14 (the result) + 27 = 58
  c.rl.steps = STEPS                     # agentic: 100
  c.rl.prompts_per_step = PROMPTS
  c.rl.group_size = GROUP
  c.rl.optimizer.lr = LR                 # agentic: 1e-5
  c.rl.eval_every = EVAL_EVERY           # agentic: only at the end
  # agentic: 0. The run's seed: a derived reference follows --config.seed, and an explicit judge_seed override
  # sets only itself (assigning to a plain reference, get_ref("seed"), would set the run's seed too).
  c.rl.reward.kwargs.judge_seed = c.get_ref("seed") + 0
  c.eval.num_examples = 500              # agentic: 64; as onepo, 500 held-out prompts, greedy
  c.eval.batch_size = 500
  c.eval.max_new_tokens = 18             # agentic: the default 8, too few for a call; the longest call is 17
                                         # tokens ("<call>mul(9999,9999)</call>"), and the task grades the call
  c.checkpoint.every = EVAL_EVERY        # agentic: 25
  if preset == "gate":
    for key, value in ARMS[arm_name("grpo", 0.0)].items():
      set_dotted(c.rl, key, value)
    c.rl.steps = GATE["steps"]
    c.rl.optimizer.frozen = "."          # every weight frozen (its update is -0.0, bit for bit): a measurement
                                         # of the base, nothing learned (rlkit refuses lr 0)
    c.rl.eval_every = 0                  # evaluated at the start and the end only
    return c
  for key, value in ARMS[preset].items():
    set_dotted(c.rl, key, value)
  return c
