"""Your own data: SFT then GRPO on a JSONL file of {"prompt", "answer", ...} lines (GSM8K-style answers
"<worked solution> #### 42" are split into the SFT target and the graded final answer).

  python launch.py --config=configs/jsonl.py --workdir=/tmp/mine \
    --config.data.train_jsonl=train.jsonl --config.data.test_jsonl=test.jsonl
  # from a Hugging Face model instead of a small model trained from scratch:
  python launch.py --config=configs/jsonl.py:hf --workdir=/tmp/mine --config.model.path=/path/to/Qwen3-0.6B \
    --config.data.train_jsonl=train.jsonl --config.data.test_jsonl=test.jsonl

The prompt and sequence length limits are derived from the data (`data.max_prompt_len = 0`,
`sft.max_len = 0`; launch prints what it derived). Without `data.test_jsonl` there is no evaluation (launch
says so). Every field is documented in rlkit/train/config.py.
"""
from rlkit.train.config import base_config, sft_defaults
from rlkit.train.rl_config import rl_defaults

PRESETS = {
    "cpu": "default: a small model trained from scratch with the character tokenizer",
    "hf": "start from a Hugging Face folder (set model.path; its tokenizer is used)",
    "test": "seconds: a tiny model and a few steps (the tests use it)",
}


def get_config(arg=None):
  preset = arg or "cpu"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for jsonl; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.stages = ("sft", "rl")
  c.task.name = "jsonl"
  c.data.max_prompt_len = 0          # derived: the longest prompt of the files
  c.sft = sft_defaults()
  c.sft.steps = 300
  c.sft.batch_size = 16
  c.sft.max_len = 0                  # derived: the longest prompt + solution of the training file
  c.sft.optimizer.lr = 1e-3
  c.sft.optimizer.warmup_steps = 20
  c.rl = rl_defaults()
  c.rl.steps = 100
  c.rl.prompts_per_step = 8
  c.rl.group_size = 8
  c.rl.max_new_tokens = 128
  c.rl.optimizer.lr = 1e-5
  c.eval.num_examples = 128
  c.eval.batch_size = 64
  c.eval.max_new_tokens = 128
  c.checkpoint.every = 50
  if preset == "hf":
    c.tokenizer.kind = "hf"          # tokenizer.path "" = the model.path folder's
    c.sft.optimizer.lr = 1e-5
    c.sft.batch_size = 8
    c.rl.temperature = 0.7
    c.rl.top_p = 0.95
  elif preset == "test":
    c.model.hidden_size = 32
    c.model.intermediate_size = 64
    c.model.num_heads = 2
    c.model.num_kv_heads = 1
    c.model.head_dim = 16
    c.sft.steps = 2
    c.sft.batch_size = 4
    c.rl.steps = 2
    c.rl.prompts_per_step = 2
    c.rl.group_size = 2
    c.rl.max_new_tokens = 8
    c.eval.num_examples = 4
    c.eval.batch_size = 4
    c.eval.pass_k = 2
    c.eval.max_new_tokens = 8
    c.checkpoint.every = 2
    c.wandb.mode = "disabled"
    c.progress = False
  return c
