"""TIPS' tiny experiment (experiments/tips/): a verifier that writes one verdict per step, trained from outcome
labels only, against one trained on the step labels; ProcessBench's F1 on synthetic running-sum chains.

  python launch.py --config=configs/tips.py:supervised --workdir=/tmp/tips/supervised_s0 --config.seed=0
  python launch.py --config=configs/tips.py:format --workdir=/tmp/tips/format_s0 --config.seed=0
  python launch.py --config=configs/tips.py:outcome --workdir=/tmp/tips/outcome_s0 --config.seed=0 \
    --config.model.path=/tmp/tips/format_s0
  python experiments/tips/run.py --root=/tmp/tips [--seeds=0,1,2]        # all of it

The task `processbench_chains` (rlkit/data/processbench.py): prompt "5+3=8+4=13+2=15>", target "+-+", graded by
ProcessBench's exact earliest-error match, with four subsets of rising length and 20% of the erroneous chains
traps (a second error cancels the first: the final answer is right). The verifier is the main job's decoder
(configs/grpo_arith.py, preset cpu: 0.4M parameters, character tokens), trained from scratch. Arms:

  supervised  SFT on every step's true verdict (the upper bound), SUPERVISED_STEPS steps of 64
  format      SFT_FORMAT_STEPS steps of 64 on all-'+' verdicts: the verdict's form and length, no error
              information (the start of the outcome arm, evaluated as such)
  outcome     from `format`, RL_STEPS GRPO iterations (32 chains x 8 verdicts, the main job's settings) with
              TIPS' outcome-only reward `tips_outcome` (rlkit/rewards/prm.py): 1 when "some step is flagged"
              equals "the final answer is wrong", which is all the supervision it gets

Both arms see the same number of chains: 64 x SUPERVISED_STEPS = 64 x SFT_FORMAT_STEPS + 32 x RL_STEPS. The
final-answer baseline (flag the last step iff the final answer is wrong) needs no training: run.py scores it on
the same held-out chains. Evaluation: 500 held-out chains, greedy, `eval/processbench/f1` (and per subset),
`eval/processbench_nontrap/f1`, `eval/processbench_traps/accuracy`.
"""
from rlkit.train.config import sibling_config

grpo_arith = sibling_config(__file__, "grpo_arith")

SUPERVISED_STEPS = 250
SFT_FORMAT_STEPS = 100
RL_STEPS = 300
EVAL_EVERY = 50
PRESETS = {
    "supervised": f"SFT on the step labels, {SUPERVISED_STEPS} steps (the upper bound)",
    "format": f"SFT on all-'+' verdicts, {SFT_FORMAT_STEPS} steps (format only)",
    "outcome": f"{RL_STEPS} RL iterations with the outcome-only reward, from a `format` checkpoint",
    "test": "seconds: a tiny model, 4 format SFT steps then 2 RL iterations (the tests use it)",
}


def get_config(arg=None):
  preset = arg or "outcome"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for tips; choose one of {', '.join(PRESETS)}.")
  c = grpo_arith.get_config("test" if preset == "test" else "cpu")
  c.wandb.mode = "disabled"
  c.task.name = "processbench_chains"
  c.task.kwargs = {"sft_target": "steps" if preset == "supervised" else "format"}
  c.data.max_prompt_len = 64         # BOS + the longest chain (59 characters)
  c.sft.max_len = 76                 # prompt, 8 verdicts and the end token
  c.sft.stop_at_loss = 0.0
  c.rl.max_new_tokens = 9
  c.rl.reward.name = "tips_outcome"
  c.rl.eval_every = EVAL_EVERY
  c.eval.max_new_tokens = 9
  c.eval.pass_k = 0
  c.eval.by_category = True          # greedy accuracy per subset
  if preset == "test":
    c.data.max_prompt_len = 40
    c.sft.max_len = 52
    c.task.kwargs.subsets = ("len3", "len4")
    c.rl.steps = 2
    c.rl.eval_every = 0
    return c
  c.checkpoint.every = 100
  if preset in ("supervised", "format"):
    c.stages = ("sft",)
    c.sft.steps = SUPERVISED_STEPS if preset == "supervised" else SFT_FORMAT_STEPS
    c.sft.eval_every = EVAL_EVERY
    return c
  c.model.path = "REQUIRED:--config.model.path=<the seed's format workdir>"   # fails validation until set
  c.stages = ("rl",)
  c.rl.steps = RL_STEPS
  return c
