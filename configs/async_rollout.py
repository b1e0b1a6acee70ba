"""The asynchronous-rollout experiment (experiments/async_rollout/): synchronous collection vs rollout workers on
Ray at staleness 0..4, and with workers dying at random, from the pretrained base.

  python experiments/async_rollout/run.py --root=/tmp/async_rollout
  python launch.py --config=configs/async_rollout.py:async_s1 --workdir=/tmp/async_rollout/async_s1_s0

Every arm: one RL stage of STEPS GRPO iterations from experiments/base/model on the `tool_calls` task (single
turn: the verifier grades the call), PROMPTS prompts x GROUP samples of at most 24 tokens, AdamW at 1e-5,
evaluated once at the end on 128 held-out prompts. The arms differ in the collector only:

  sync              rl.collector=single_turn: the learner samples, then trains (the default)
  async_s<k>        rl.collector=async on one Ray worker actor (1 CPU reserved, the learner keeps the rest),
                    prefetch = max_staleness = k: the worker samples step t+1..t+k while the learner trains on t
                    (k = 0: nothing overlaps, the worker only moves sampling to another process)
  async_s1_faults   async_s1 with rl.async_rollout.fault_rate = FAULT_RATE: a worker call's process exits at
                    random (the actor dies and is replaced; its samples are requeued)
"""
from rlkit.train.config import base_config, set_dotted
from rlkit.train.rl_config import rl_defaults

BASE_MODEL = "experiments/base/model"
STEPS = 40
WARMUP = 5                 # iterations left out of the throughput (compilation, the worker's start, prefetch)
PROMPTS, GROUP = 8, 8
FAULT_RATE = 0.1
STALENESS = (0, 1, 2, 4)
ARMS = {"sync": {"collector": "single_turn"},
        **{f"async_s{k}": {"collector": "async", "async_rollout.prefetch": k, "async_rollout.max_staleness": k}
           for k in STALENESS},
        "async_s1_faults": {"collector": "async", "async_rollout.prefetch": 1, "async_rollout.max_staleness": 1,
                            "async_rollout.fault_rate": FAULT_RATE}}
PRESETS = {arm: f"rl fields {fields}" for arm, fields in ARMS.items()}


def get_config(arg=None):
  preset = arg or "async_s1"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for async_rollout; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.stages = ("rl",)
  c.model.path = BASE_MODEL
  c.tokenizer.kind = "hf"
  c.wandb.mode = "disabled"
  c.task.name = "tool_calls"
  c.task.kwargs.max_digits = 3
  c.data.num_train = 2_000
  c.data.num_test = 128
  c.data.max_prompt_len = 16
  c.rl = rl_defaults()
  c.rl.steps = STEPS
  c.rl.prompts_per_step = PROMPTS
  c.rl.group_size = GROUP
  c.rl.max_new_tokens = 24
  c.rl.optimizer.lr = 1e-5
  c.rl.eval_every = 0
  c.eval.num_examples = 128
  c.eval.batch_size = 128
  c.eval.pass_k = 0
  c.eval.max_new_tokens = 24
  c.checkpoint.every = 10
  a = c.rl.async_rollout
  a.backend = "ray"
  a.workers = 1
  a.num_cpus = 1.0
  a.items_per_call = PROMPTS * GROUP       # one call samples a whole step's batch
  for key, value in ARMS[preset].items():
    set_dotted(c.rl, key, value)
  return c
