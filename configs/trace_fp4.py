"""The TRACE experiment (experiments/trace_fp4/): GRPO of an MoE upcycled from the pretrained base, sampling from a
bf16 copy, or from an FP4 copy of the experts with the trainer rounding to nearest (plain QAT) or as the rollout
did (TRACE).

  python experiments/trace_fp4/run.py --root=/tmp/trace_fp4
  python launch.py --config=configs/trace_fp4.py:fp4_trace --workdir=/tmp/trace_fp4/fp4_trace_s0

Every arm: one RL stage of STEPS GRPO iterations on the base's `mul` skill (1-2 digit products, `37*8=` ->
`296`), PROMPTS prompts x GROUP samples of at most 6 tokens, AdamW at LR, evaluated every EVAL_EVERY iterations
on 256 held-out prompts. The policy: experiments/base/model with every MLP upcycled into EXPERTS experts, top-2,
perturbed by UPCYCLE_NOISE x each kernel's RMS (rlkit/models/upcycle.py), routing replayed in the update (R3,
as the paper trains). The trainer computes in float32, the sampler in bfloat16 (rl.sync: a dense bf16 copy).

  bf16       no FP4 anywhere: the reference curve
  fp4_rtn    model.expert_quant=nvfp4, rl.sync.quantizer=nvfp4_experts: the sampler's experts compute on NVFP4
             weights and activations; the trainer fake-quantizes both, rounding to nearest (QAT)
  fp4_trace  fp4_rtn with rl.moe.trace: the trainer's expert activations take the rollout's FP4 decisions
  gate       fp4_rtn with every weight frozen for GATE_STEPS iterations (experiments/trace_fp4/README.md)
"""
from rlkit.train.config import base_config, set_dotted
from rlkit.train.rl_config import rl_defaults

BASE_MODEL = "experiments/base/model"
STEPS = 60
EVAL_EVERY = 20
PROMPTS, GROUP = 8, 8
LR = 1e-5
EXPERTS, TOP_K, UPCYCLE_NOISE = 4, 2, 0.02
FP4 = {"model.expert_quant": "nvfp4", "rl.sync.quantizer": "nvfp4_experts"}
ARMS = {"bf16": {}, "fp4_rtn": dict(FP4), "fp4_trace": {**FP4, "rl.moe.trace": True}}
GATE_STEPS = 3
PRESETS = {**{arm: f"fields {fields}" for arm, fields in ARMS.items()},
           "gate": f"fp4_rtn with every weight frozen for {GATE_STEPS} iterations: the calibration gate"}


def get_config(arg=None):
  preset = arg or "fp4_trace"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for trace_fp4; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.stages = ("rl",)
  c.model.path = BASE_MODEL
  c.model.update(upcycle_experts=EXPERTS, upcycle_k=TOP_K, upcycle_noise=UPCYCLE_NOISE)
  c.tokenizer.kind = "hf"
  c.wandb.mode = "disabled"
  c.task.name = "arithmetic"
  c.task.kwargs.ops = "*"
  c.task.kwargs.min_digits = 1
  c.task.kwargs.max_digits = 2
  c.data.num_train = 4_000
  c.data.num_test = 256
  c.data.max_prompt_len = 8
  c.rl = rl_defaults()
  c.rl.steps = STEPS
  c.rl.prompts_per_step = PROMPTS
  c.rl.group_size = GROUP
  c.rl.max_new_tokens = 6
  c.rl.optimizer.lr = LR
  c.rl.eval_every = EVAL_EVERY
  c.rl.replay_routing = True
  c.rl.sync.kind = "dense"
  c.rl.sync.dtype = "bfloat16"
  c.eval.num_examples = 256
  c.eval.batch_size = 256
  c.eval.pass_k = 0
  c.eval.max_new_tokens = 6
  c.checkpoint.every = 20
  for key, value in ARMS["fp4_rtn" if preset == "gate" else preset].items():
    set_dotted(c, key, value)
  if preset == "gate":
    c.rl.steps, c.rl.eval_every = GATE_STEPS, 0
    c.rl.optimizer.frozen = "."          # every weight frozen: a measurement of the starting policy
  return c
