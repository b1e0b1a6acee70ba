"""The code task: write a Python function; hidden tests grade it inside the sandbox (rlkit/agents/sandbox.py).

  python launch.py --config=configs/code.py --workdir=/tmp/code            # SFT from the base, then GRPO
  python launch.py --config=configs/code.py:test --workdir=/tmp/code_test  # seconds

Task `code_functions` (rlkit/agents/code_task.py): "Write a Python function f(x): multiply x by 3, then add 2.
Example: f(4) = 14." The base (experiments/base/model) never saw Python, so an SFT stage on the task's
step-by-step demonstrations comes first; GRPO then trains on the `code_tests` reward (rlkit/agents/code_reward.py):
every completion's function runs against 8 hidden inputs in a fresh bubblewrap sandbox (no network, no host
files, CPU/memory/process/output limits), the host compares the outputs, and the post-hoc audit resets a passing
solution that imports, opens files, introspects or special-cases inputs. `--config.rl.reward.kwargs.backend=rlimits`
selects the weaker sandbox where bubblewrap cannot run (it is never chosen silently). Presets:
"""
from rlkit.train.config import base_config, sft_defaults
from rlkit.train.rl_config import rl_defaults

BASE_MODEL = "experiments/base/model"   # the pretrained base, from the repository root
PRESETS = {
    "code": "default: 300 SFT steps from the base on the demonstrations, then 100 GRPO iterations on hidden tests",
    "test": "seconds: a tiny model from scratch, 2 SFT steps and 2 RL iterations (the tests use it)",
}


def get_config(arg=None):
  preset = arg or "code"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for code; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.stages = ("sft", "rl")
  c.model.path = BASE_MODEL
  c.tokenizer.kind = "hf"            # the model folder's tokenizer
  c.wandb.mode = "disabled"
  c.task.name = "code_functions"
  c.task.kwargs.verbose_rate = 0.0   # the fraction of padded demonstrations (rlkit/agents/code_task.py)
  c.data.num_train = 5_000
  c.data.num_test = 200
  c.data.max_prompt_len = 112        # the longest prompt is 105 of the base's tokens (3 steps)

  c.sft = sft_defaults()
  c.sft.steps = 300
  c.sft.stop_at_loss = 0.0           # a fixed length
  c.sft.batch_size = 32
  c.sft.max_len = 216                # prompt (<= 105) + demonstration (<= 62; 102 padded) + end token
  c.sft.optimizer.lr = 3e-4
  c.sft.optimizer.warmup_steps = 20

  c.rl = rl_defaults()
  c.rl.steps = 100
  c.rl.prompts_per_step = 8
  c.rl.group_size = 8
  c.rl.max_new_tokens = 104          # the longest demonstration is 62 tokens, 102 padded (verbose_rate)
  c.rl.optimizer.lr = 2e-5
  c.rl.reward.name = "code_tests"
  c.rl.eval_every = 25
  c.eval.num_examples = 200          # each graded in the sandbox (~50 ms each, serial)
  c.eval.batch_size = 200
  c.eval.pass_k = 0
  c.eval.max_new_tokens = 104
  c.checkpoint.every = 25
  if preset == "test":
    c.model.path = ""
    c.tokenizer.kind = "char"
    c.model.hidden_size = 32
    c.model.intermediate_size = 64
    c.model.num_layers = 1
    c.model.num_heads = 2
    c.model.num_kv_heads = 1
    c.model.head_dim = 16
    c.task.kwargs.max_steps = 1
    c.data.max_prompt_len = 80       # a character a token
    c.data.num_train = 64
    c.data.num_test = 8
    c.sft.steps = 2
    c.sft.batch_size = 8
    c.sft.max_len = 120
    c.rl.steps = 2
    c.rl.prompts_per_step = 2
    c.rl.group_size = 4
    c.rl.max_new_tokens = 40
    c.rl.eval_every = 0
    c.eval.num_examples = 8
    c.eval.batch_size = 8
    c.eval.max_new_tokens = 40
    c.checkpoint.every = 1
  return c
