"""TIPS' experiment (experiments/tips/, second design from the base): a step verifier that writes its own checks,
trained on the step labels of running-DIFFERENCE chains, or by RL on the outcome labels only.

  python launch.py --config=configs/tips.py:start --workdir=/tmp/tips/start_s0 --config.seed=0
  python launch.py --config=configs/tips.py:supervised --workdir=/tmp/tips/supervised_s0 --config.seed=0 \
      --config.model.path=/tmp/tips/start_s0
  python launch.py --config=configs/tips.py:outcome --workdir=/tmp/tips/outcome_s0 --config.seed=0 \
      --config.model.path=/tmp/tips/start_s0
  python experiments/tips/run.py --root=/tmp/tips        # start, the calibration gate (supervised), then outcome

The verifier writes a worked verdict (rlkit.rewards.prm): per step, the step undone and the number it must give
back, then the verdict, "55-14=38-10=28>" -> "38+14=52:55-28+10=38:38+". Only the verdict characters are graded.

  start       START_STEPS SFT steps from experiments/base/model on worked verdicts of running-SUM chains, whose
              step labels the base saw in pretraining (its step_check skill): the check format and its verdicts,
              on the other operator. One start policy (seed 0); both arms start from it.
  supervised  SFT on the worked step labels of running-difference chains (the upper bound; the gate's runs),
              SUPERVISED_STEPS steps of SFT_BATCH chains
  outcome     RL_STEPS GRPO iterations (RL_PROMPTS chains x RL_GROUP verdicts, lr RL_LR, one update per
              iteration, no KL) on running-difference chains with TIPS' outcome-only reward `tips_outcome`
              (rlkit/rewards/prm.py): 1 when "some step is flagged" equals "the final answer is wrong", which is
              all the supervision it gets

Both arms see the same number of chains: SFT_BATCH x SUPERVISED_STEPS = RL_PROMPTS x RL_STEPS. The start policy
(each arm's evaluation at its start) and the final-answer checker (run.py scores it) are the floors. Evaluation:
500 held-out running-difference chains, greedy, `eval/processbench/f1` (and per subset),
`eval/processbench_nontrap/f1`, `eval/processbench_traps/accuracy`.
"""
from rlkit.train.config import base_config, sft_defaults
from rlkit.train.rl_config import rl_defaults

BASE_MODEL = "experiments/base/model"   # the pretrained base (experiments/base/README.md), from the repository root
OP = "-"                   # the arms' chains: running differences
START_OP = "+"             # the start policy's chains: running sums, the base's own step_check skill
SUBSETS = ("len3", "len4", "len5")
START_STEPS = 250
SUPERVISED_STEPS = 100
SFT_BATCH = 32
RL_STEPS = 200
RL_PROMPTS = 16
RL_GROUP = 8
RL_LR = 5e-5                # onepo's, slca_grpo's and srd's rate for this base (README: why not 1e-4)
EVAL_EVERY = 25            # SFT steps and RL iterations alike
MAX_NEW_TOKENS = 91        # up to 6 checks ("155+1=156:156+", at most 15 tokens each) and the end token
PRESETS = {
    "start": f"SFT from the base on worked verdicts of running-sum chains, {START_STEPS} steps (both arms' start)",
    "supervised": f"SFT from the start on the worked step labels, {SUPERVISED_STEPS} steps (the upper bound; the gate)",
    "outcome": f"{RL_STEPS} RL iterations from the start with the outcome-only reward",
}


def get_config(arg=None):
  preset = arg or "outcome"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for tips; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.model.path = BASE_MODEL if preset == "start" else "REQUIRED:--config.model.path=<the start workdir>"
  c.tokenizer.kind = "hf"            # the model folder's tokenizer (tokenizer.path "")
  c.task.name = "processbench_chains"
  c.task.kwargs = {"op": START_OP if preset == "start" else OP, "subsets": SUBSETS, "sft_target": "checks"}
  c.data.num_train = 8_000
  c.data.num_test = 500
  c.data.max_prompt_len = 48         # BOS + the longest chain (45 characters, at most a token each)
  c.eval.num_examples = 500
  c.eval.batch_size = 500
  c.eval.max_new_tokens = MAX_NEW_TOKENS
  c.eval.pass_k = 0
  c.eval.by_category = True          # greedy accuracy per subset
  c.checkpoint.every = 0             # the stage's last checkpoint only
  c.wandb.mode = "disabled"
  if preset in ("start", "supervised"):
    c.stages = ("sft",)
    c.sft = sft_defaults()
    c.sft.steps = START_STEPS if preset == "start" else SUPERVISED_STEPS
    c.sft.batch_size = SFT_BATCH
    c.sft.max_len = c.data.max_prompt_len + MAX_NEW_TOKENS + 5
    c.sft.eval_every = c.sft.steps if preset == "start" else EVAL_EVERY
    c.sft.optimizer.lr = 3e-4
    c.sft.optimizer.warmup_steps = 10
    c.sft.optimizer.schedule = "cosine"
    return c
  c.stages = ("rl",)
  c.rl = rl_defaults()
  c.rl.steps = RL_STEPS
  c.rl.prompts_per_step = RL_PROMPTS
  c.rl.group_size = RL_GROUP
  c.rl.max_new_tokens = MAX_NEW_TOKENS
  c.rl.reward.name = "tips_outcome"
  c.rl.eval_every = EVAL_EVERY
  c.rl.optimizer.lr = RL_LR
  return c
