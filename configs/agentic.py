"""Agentic RL: multi-turn tool rollouts on the real trainer (`rl.collector=multi_turn`).

  python launch.py --config=configs/agentic.py:calculator --workdir=/tmp/agentic          # SLCA-GRPO, tool task
  python launch.py --config=configs/agentic.py:key_door --workdir=/tmp/key_door           # GRPO, key-door rooms

The policy writes `<call>mul(23,4)</call>`, the calculator's `<result>92</result>` enters its context as tokens
(attended, never trained), and it answers `<say>23 times 4 is 92.</say>`; the `tool_task` reward scores the
call and the summary apart (the summary through a judge whose noise is `rl.reward.kwargs.judge_noise`), and
`rl.advantage=slca` credits each to its own tokens (`--config.rl.advantage=group` is GRPO on their sum). The
key-door preset plays the multi-room text task of SRD's testbed. Both start from the pretrained base
(experiments/base/model), which learned the call format in pretraining (its tool_calls skill). Presets:
"""
from rlkit.train.config import base_config
from rlkit.train.rl_config import rl_defaults

BASE_MODEL = "experiments/base/model"   # the pretrained base (experiments/base/README.md), from the repository root
PRESETS = {
    "calculator": "SLCA-GRPO on the calculator tool task from the base, a noisy summary judge (std 0.5)",
    "key_door": "GRPO on the key-and-door rooms from the base (3 rooms, 8 actions)",
    "test": "seconds: a tiny model from scratch, the calculator task, 2 RL iterations (the tests use it)",
}


def get_config(arg=None):
  preset = arg or "calculator"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for agentic; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.stages = ("rl",)
  c.model.path = BASE_MODEL
  c.tokenizer.kind = "hf"            # the model folder's tokenizer
  c.wandb.mode = "disabled"
  c.checkpoint.every = 25
  c.rl = rl_defaults()
  c.rl.collector = "multi_turn"
  c.rl.steps = 100
  c.rl.prompts_per_step = 8
  c.rl.group_size = 8
  c.rl.optimizer.lr = 1e-5
  c.eval.num_examples = 64           # single-turn evaluation: the tool task grades the call, key_door the actions
  c.eval.batch_size = 64
  c.eval.pass_k = 0
  mt = c.rl.multi_turn
  if preset in ("calculator", "test"):
    c.task.name = "tool_calls"
    c.task.kwargs.max_digits = 2
    c.data.max_prompt_len = 16       # "What is 99 times 99?\n" in the base's tokens
    mt.env = "calculator"
    mt.max_turns = 3
    mt.turn_tokens = 24
    c.rl.max_new_tokens = 64         # the call, its result and the summary
    c.rl.reward.name = "tool_task"
    c.rl.reward.kwargs.judge_noise = 0.5
    c.rl.advantage = "slca"          # execution -> tool_call tokens, the judge -> summary tokens
    c.eval.max_new_tokens = 24       # single-turn evaluation grades the call: room for the longest one
  else:
    c.task.name = "key_door"
    c.task.kwargs.hidden_keys = False   # True: rooms show keys without colours (rlkit/agents/keydoor.py)
    c.data.max_prompt_len = 184      # the longest prompt in the base's tokens (its corpus never held these words)
    c.data.num_train = 15            # the task has 16 distinct prompts (3 rooms); one held out
    c.data.num_test = 1
    c.eval.num_examples = 1          # single-turn evaluation means little for an agent: success is reward/success
    c.eval.batch_size = 1
    mt.env = "key_door"
    mt.env_kwargs.max_actions = 8
    mt.max_turns = 8
    mt.turn_tokens = 24              # the longest action, "<act>take yellow key</act>", is 21 tokens
    c.rl.max_new_tokens = 512        # 8 actions and their room descriptions
    c.rl.reward.name = "key_door"
  if preset == "test":
    c.model.path = ""
    c.tokenizer.kind = "char"
    c.model.hidden_size = 32
    c.model.intermediate_size = 64
    c.model.num_layers = 1
    c.model.num_heads = 2
    c.model.num_kv_heads = 1
    c.model.head_dim = 16
    c.data.max_prompt_len = 24
    c.data.num_train = 64
    c.data.num_test = 8
    c.eval.num_examples = 8
    c.eval.batch_size = 8
    c.rl.steps = 2
    c.rl.prompts_per_step = 2
    c.rl.group_size = 4
    c.rl.max_new_tokens = 32
    mt.turn_tokens = 8
    mt.tool_timeout_s = 2.0
    c.rl.optimizer.lr = 1e-3
    c.checkpoint.every = 1
  return c
