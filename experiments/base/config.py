"""The pretrained base (experiments/base/README.md): a Qwen3-architecture model pretrained on the `mixture` of
the skills below, with the byte-level BPE tokenizer that build.py trains on the same corpus.

  python experiments/base/build.py --workdir=/tmp/base            # tokenizer, pretraining, export, skill table
  # the pretraining alone, as build.py runs it (TOK = the tokenizer folder build.py wrote):
  python launch.py --config=experiments/base/config.py --workdir=/tmp/base/run --config.tokenizer.path=TOK

Presets: `base` (the committed model) and `tiny` (seconds: the rebuild-determinism test). Every field is documented in
rlkit/train/config.py; the skills' tasks in rlkit/data/ (tasks.py, skills.py, processbench.py, questions.py,
constrained.py).
"""
from rlkit.train.config import base_config, sft_defaults

# skill -> its task, weight (share of examples) and parameters. Arithmetic stops at 3-digit operands (and
# 2-digit factors): 4-digit problems stay one step beyond the base, for the experiments that need a hard task.
SKILLS = {
    "add_sub": {"task": "arithmetic", "weight": 3.0, "kwargs": {"ops": "+-", "min_digits": 1, "max_digits": 3}},
    "mul": {"task": "arithmetic", "weight": 1.5, "kwargs": {"ops": "*", "min_digits": 1, "max_digits": 2}},
    "three_ops": {"task": "arithmetic", "weight": 1.0,
                  "kwargs": {"ops": "+-*", "min_digits": 1, "max_digits": 2, "num_operands": 3}},
    "worked_steps": {"task": "arithmetic_steps", "weight": 1.0,
                     "kwargs": {"method": "reduce", "ops": "+-*", "max_digits": 2, "num_operands": 3}},
    "columns": {"task": "arithmetic_steps", "weight": 1.0, "kwargs": {"method": "columns", "max_digits": 3}},
    "word_problems": {"task": "word_problems", "weight": 1.5, "kwargs": {"max_digits": 2}},
    "step_check": {"task": "processbench_chains", "weight": 1.0, "kwargs": {"sft_target": "steps"}},
    "tool_calls": {"task": "tool_calls", "weight": 1.0, "kwargs": {"max_digits": 3}},
    "keyword": {"task": "keyword_arithmetic", "weight": 0.5, "kwargs": {"max_digits": 2, "follow_frac": 0.5}},
    "solve_bound": {"task": "rquest_questions", "weight": 0.5, "kwargs": {"role": "solve"}},
    "write_question": {"task": "rquest_questions", "weight": 0.5, "kwargs": {"role": "propose"}},
}

# name -> (hidden, layers, heads, kv heads, mlp, head_dim). "7m" is throughput.py's shape of that name: 4.9M
# parameters with the corpus's 588-token vocabulary (6.8M with 4096).
SHAPES = {"7m": (256, 6, 4, 2, 768, 64), "tiny": (32, 1, 1, 1, 64, 32)}

PRESETS = {
    "base": "the committed base model: the 7m shape, 5,200 steps of 16 x 256 tokens (21.3M tokens)",
    "tiny": "seconds: a one-layer model and a few steps (the rebuild-determinism test)",
}


def get_config(arg=None):
  preset = arg or "base"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for experiments/base; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.stages = ("sft",)
  c.task.name = "mixture"
  c.task.kwargs.skills = SKILLS
  c.tokenizer.kind = "hf"            # the BPE folder build.py trains (tokenizer.path)
  c.data.num_train = 1_200_000      # ~24 tokens an example: 5,200 steps read ~0.74 of them
  c.data.num_test = 2_200            # ~200 held-out examples per skill
  c.data.max_prompt_len = 60         # the longest prompt of the corpus (a 7-step chain); what 0 derived at ef601c3
  hidden, layers, heads, kv, mlp, head_dim = SHAPES["tiny" if preset == "tiny" else "7m"]
  c.model.hidden_size, c.model.num_layers, c.model.num_heads = hidden, layers, heads
  c.model.num_kv_heads, c.model.intermediate_size, c.model.head_dim = kv, mlp, head_dim
  c.sft = sft_defaults()
  c.sft.pack = True
  c.sft.loss_on = "all"
  c.sft.max_len = 256
  c.sft.batch_size = 16
  c.sft.steps = 5_200                # ~2.0 s a step on the 2-core EPYC: about 3 hours with the evaluations
  c.sft.eval_every = 1_300           # the skill table against tokens seen
  c.sft.optimizer.lr = 2e-3
  c.sft.optimizer.warmup_steps = 200
  c.sft.optimizer.schedule = "cosine"
  c.sft.optimizer.weight_decay = 0.1
  c.eval.num_examples = 2_200
  c.eval.batch_size = 200
  c.eval.max_new_tokens = 64
  c.eval.pass_k = 0
  c.eval.by_category = True
  c.checkpoint.every = 250
  c.wandb.mode = "disabled"
  if preset == "tiny":
    c.data.num_train, c.data.num_test = 2_000, 48
    c.sft.max_len, c.sft.batch_size, c.sft.steps, c.sft.eval_every = 64, 8, 6, 0   # batches split over 8 devices
    c.sft.optimizer.warmup_steps = 2
    c.eval.num_examples, c.eval.batch_size, c.eval.max_new_tokens = 48, 48, 16
    c.checkpoint.every = 6
    c.progress = False
  return c
