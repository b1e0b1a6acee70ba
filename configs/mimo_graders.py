"""MiMo-V2.6's graders on the code task (experiments/mimo_graders/): plain pass/fail rewards vs GRS (tests x
solution x behaviour) and GAR (quality-weighted redistribution over the passing rows, optionally with the
length penalty), from the pretrained base.

  python experiments/mimo_graders/run.py --root=/tmp/mimo_graders
  python launch.py --config=configs/mimo_graders.py:gar --workdir=/tmp/mimo_graders/gar_s0 \
      --config.seed=0 --config.model.path=/tmp/mimo_graders/sft_s0

Built on configs/code.py (the `code_functions` task in the bubblewrap sandbox, reward `code_tests`), with half of
the demonstrations padded by redundant statement pairs (task.kwargs.verbose_rate = VERBOSE): the SFT policy then
writes concise and padded solutions, both correct, which a pass/fail reward cannot tell apart and GRS's solution
score (the concise reference's AST size over the solution's) can. Presets:

  sft        SFT_STEPS steps from experiments/base/model on the task's demonstrations (one SFT policy, seed 0,
             shared by every arm and seed: README "Setup")
  gate       the calibration gate's run: pass_fail with every weight frozen for GATE["steps"] iterations from the
             SFT policy: its pass rate and solution quality as sampled, nothing learned
  pass_fail  GRPO on all hidden tests passing (code_tests grader pass_fail, rl.advantage=group)
  grs        GRPO on GRS: tests passed x solution score x behaviour score (grader grs, advantage group)
  gar        GRS rewards, GAR advantages (rl.advantage=gar, quality = the solution score, lam_cap 2)
  gar_len    gar with the group-relative length penalty (gar.length_coef = LENGTH_COEF, anchor quantile 0.3)

Every RL arm: STEPS iterations of PROMPTS prompts x GROUP samples (at most 104 tokens, at TEMPERATURE), AdamW at
LR, evaluated on 200 held-out prompts at the start and the end (greedy; a prompt counts when every hidden test
passes).
"""
from rlkit.train.config import set_dotted, sibling_config

code = sibling_config(__file__, "code")

# Amendment 2 (README): 200 steps gave a sampled pass rate of 0.073 (the second attempt's gate); the probe after it
# (experiments/mimo_graders/probe_runs): 0.28 at 300 steps, 1.00 at 400.
SFT_STEPS = 300
STEPS = 40
PROMPTS, GROUP = 4, 8
LR = 2e-5
VERBOSE = 0.5
LENGTH_COEF = 0.1
# Amendment 1 (README): the first attempt's gate failed at temperature 1 (sampled pass rate 0.045, greedy 0.297);
# every RL run (the gate's and the arms') samples, and the trainer scores, at this temperature.
TEMPERATURE = 0.6
WINDOW = 10                # the last iterations averaged for the training-side measures (README)
GATE = {"steps": 3, "pass_low": 0.15, "pass_high": 0.85, "quality_max": 0.9}
ARMS = {"pass_fail": {"reward.kwargs.grader": "pass_fail", "advantage": "group"},
        "grs": {"reward.kwargs.grader": "grs", "advantage": "group"},
        "gar": {"reward.kwargs.grader": "grs", "advantage": "gar"},
        "gar_len": {"reward.kwargs.grader": "grs", "advantage": "gar", "gar.length_coef": LENGTH_COEF}}
PRESETS = {"sft": f"{SFT_STEPS} SFT steps from the base, half the demonstrations padded",
           "gate": f"pass_fail frozen for {GATE['steps']} iterations (the gate's measurement)",
           **{arm: f"rl fields {fields}" for arm, fields in ARMS.items()}}


def get_config(arg=None):
  preset = arg or "gar"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for mimo_graders; choose one of {', '.join(PRESETS)}.")
  c = code.get_config("code")
  c.task.kwargs.verbose_rate = VERBOSE
  c.data.num_test = 200
  c.tokenizer.path = ""                  # the model folder's (the base's BPE, kept in the SFT checkpoint)
  if preset == "sft":
    c.stages = ("sft",)
    c.sft.steps = SFT_STEPS
    return c
  c.stages = ("rl",)
  c.model.path = "REQUIRED:--config.model.path=<the sft workdir>"   # fails validation until set
  c.rl.steps = STEPS
  c.rl.prompts_per_step = PROMPTS
  c.rl.group_size = GROUP
  c.rl.optimizer.lr = LR
  c.rl.temperature = TEMPERATURE
  c.rl.eval_every = STEPS                # the start (a loaded model) and the end
  c.checkpoint.every = 10
  arm = "pass_fail" if preset == "gate" else preset
  for key, value in ARMS[arm].items():
    set_dotted(c.rl, key, value)
  if preset == "gate":
    c.rl.steps = GATE["steps"]
    c.rl.optimizer.frozen = "."          # every weight frozen: a measurement of the SFT policy
    c.rl.eval_every = 0
  return c
