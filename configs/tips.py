"""TIPS' experiment from the pretrained base (experiments/tips/): a step verifier trained from outcome labels only,
against one trained on the step labels; ProcessBench's F1 on running-difference chains the base never saw.

  python launch.py --config=configs/tips.py:supervised --workdir=/tmp/tips/supervised_s0 --config.seed=0
  python launch.py --config=configs/tips.py:outcome --workdir=/tmp/tips/outcome_s0 --config.seed=0
  python experiments/tips/run.py --root=/tmp/tips        # the calibration gate (supervised), then outcome

The base (experiments/base/model) was pretrained on step labels of running-SUM chains ("9+4=13+4=17>" -> "++",
its step_check skill). The verifier here checks running-DIFFERENCE chains, `processbench_chains` with op="-"
("40-3=37-4=33>" -> "+-"): the verdict format and subtraction come with the base, a label of a '-' step does
not. Subsets len3-len5 (3-6 steps, operands up to 49). Both arms start from the base:

  supervised  SFT on every step's true verdict (the upper bound), SUPERVISED_STEPS steps of SFT_BATCH chains
  outcome     RL_STEPS GRPO iterations (RL_PROMPTS chains x RL_GROUP verdicts, lr RL_LR, one update per
              iteration, no KL) with TIPS' outcome-only reward `tips_outcome` (rlkit/rewards/prm.py): 1 when
              "some step is flagged" equals "the final answer is wrong", which is all the supervision it gets

Both see the same number of chains: SFT_BATCH x SUPERVISED_STEPS = RL_PROMPTS x RL_STEPS. The base itself (each
run's evaluation at its start) and the final-answer checker (run.py scores it) are the floors. Evaluation: 500
held-out chains, greedy, `eval/processbench/f1` (and per subset), `eval/processbench_nontrap/f1`,
`eval/processbench_traps/accuracy`.
"""
from rlkit.train.config import base_config, sft_defaults
from rlkit.train.rl_config import rl_defaults

BASE_MODEL = "experiments/base/model"   # the pretrained base (experiments/base/README.md), from the repository root
OP = "-"                   # running differences: step labels the base never saw
SUBSETS = ("len3", "len4", "len5")
SUPERVISED_STEPS = 125
SFT_BATCH = 32
RL_STEPS = 250
RL_PROMPTS = 16
RL_GROUP = 8
RL_LR = 1e-4
EVAL_EVERY = 25            # SFT steps and RL iterations alike
PRESETS = {
    "supervised": f"SFT from the base on the step labels, {SUPERVISED_STEPS} steps (the upper bound; the gate)",
    "outcome": f"{RL_STEPS} RL iterations from the base with the outcome-only reward",
}


def get_config(arg=None):
  preset = arg or "outcome"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for tips; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.model.path = BASE_MODEL
  c.tokenizer.kind = "hf"            # the model folder's tokenizer (tokenizer.path "")
  c.task.name = "processbench_chains"
  c.task.kwargs = {"op": OP, "subsets": SUBSETS, "sft_target": "steps"}
  c.data.num_train = 8_000
  c.data.num_test = 500
  c.data.max_prompt_len = 48         # BOS + the longest chain (45 characters, at most a token each)
  c.eval.num_examples = 500
  c.eval.batch_size = 500
  c.eval.max_new_tokens = 8          # up to 6 verdicts (fewer tokens where the tokenizer merged them) and the end
  c.eval.pass_k = 0
  c.eval.by_category = True          # greedy accuracy per subset
  c.checkpoint.every = 0             # the stage's last checkpoint only
  c.wandb.mode = "disabled"
  if preset == "supervised":
    c.stages = ("sft",)
    c.sft = sft_defaults()
    c.sft.steps = SUPERVISED_STEPS
    c.sft.batch_size = SFT_BATCH
    c.sft.max_len = 56               # prompt, verdicts and the end token
    c.sft.eval_every = EVAL_EVERY
    c.sft.optimizer.lr = 3e-4
    c.sft.optimizer.warmup_steps = 10
    c.sft.optimizer.schedule = "cosine"
    return c
  c.stages = ("rl",)
  c.rl = rl_defaults()
  c.rl.steps = RL_STEPS
  c.rl.prompts_per_step = RL_PROMPTS
  c.rl.group_size = RL_GROUP
  c.rl.max_new_tokens = 8
  c.rl.reward.name = "tips_outcome"
  c.rl.eval_every = EVAL_EVERY
  c.rl.optimizer.lr = RL_LR
  return c
