"""calibrated_is's runs from the pretrained base (experiments/calibrated_is/README.md): GRPO on the base's add_sub
skill with the sampler on its own weight copy (rl.sync), so the distribution the rollouts are drawn from
persistently differs from the float32 master the trainer scores and updates: a real engine mismatch.

  python launch.py --config=configs/calibrated_is.py:fp8 --workdir=/tmp/calibrated_is/gate_fp8

Presets (the sampler copy; each computes in bfloat16, as an engine serving bf16 weights does):
  bf16   every floating leaf cast to bfloat16 (RNE)
  fp8    the matmul kernels rounded to float8_e4m3fn with one scale per output channel (rl.sync.quantizer=fp8,
         rlkit/quant/fp8.py), the norms and the embedding in bfloat16
  nvfp4  the matmul kernels in NVFP4 (E2M1 codes, an E4M3 scale per 16 inputs, a float32 tensor scale;
         rl.sync.quantizer=nvfp4, rlkit/quant/fp4.py), the rest in bfloat16 (amendment 1 of the README)
  mxfp4  the same in MXFP4 (an E8M0 power-of-two scale per 32 inputs; amendment 1)
  nvfp4_w4a4, mxfp4_w4a4   nvfp4 / mxfp4 with every dense kernel's activations rounded to the same FP4 format
         as well (rl.sync.quantizer=*_w4a4: W4A4, as an FP4 engine computes; amendment 2)
Each is the calibration gate's run of that copy (README: 3 iterations, the trainer's `mismatch/*` and the
published rule's `rollout_corr/*`); experiments/calibrated_is/run.py measures the arms' gradients with the same
model, task, sampling and copy in-process. `model.path` is relative to the repository root (launch.py's cwd).
Every field is documented in rlkit/train/config.py.
"""
from rlkit.train.config import base_config
from rlkit.train.rl_config import rl_defaults

BASE = "experiments/base/model"
PRESETS = {
    "bf16": "the calibration gate's run of the bf16 sampler copy (3 GRPO iterations from the base)",
    "fp8": "the calibration gate's run of the fp8-rounded sampler copy (3 GRPO iterations from the base)",
    "nvfp4": "the calibration gate's run of the NVFP4 sampler copy (3 GRPO iterations from the base)",
    "mxfp4": "the calibration gate's run of the MXFP4 sampler copy (3 GRPO iterations from the base)",
    "nvfp4_w4a4": "the calibration gate's run of the NVFP4 W4A4 sampler copy (3 GRPO iterations from the base)",
    "mxfp4_w4a4": "the calibration gate's run of the MXFP4 W4A4 sampler copy (3 GRPO iterations from the base)",
}
COPIES = tuple(PRESETS)
QUANTIZER = {"bf16": "none", "fp8": "fp8", "nvfp4": "nvfp4", "mxfp4": "mxfp4", "nvfp4_w4a4": "nvfp4_w4a4",
             "mxfp4_w4a4": "mxfp4_w4a4"}
# The arms (rl.correction fields), pre-registered in experiments/calibrated_is/README.md: library defaults or the
# peers' presets, never tuned here.
ARMS = {
    "none": {"name": "none"},
    "token_tis": {"name": "rollout_correction", "rollout_is": "token", "rollout_is_threshold": "2.0"},
    "seq_tis": {"name": "rollout_correction", "rollout_is": "sequence", "rollout_is_threshold": "2.0"},
    "icepop": {"name": "icepop"},
    "calibrated": {"name": "calibrated"},                                        # ours
    "cis": {"name": "cis"},                                                      # the published rule
}
TASK = {"ops": "+-", "min_digits": 1, "max_digits": 3}   # the base's add_sub skill (experiments/base/config.py)
PROMPTS, GROUP, MAX_NEW_TOKENS = 16, 8, 6   # one batch of the gradient harness: 128 rows; "-998" + EOS fits


def get_config(arg=None):
  preset = arg or "fp8"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for calibrated_is; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.stages = ("rl",)
  c.model.path = BASE                # float32 master and compute (model.param_dtype / dtype defaults)
  c.tokenizer.kind = "hf"            # the base folder's own tokenizer (tokenizer.path "")
  c.task.name = "arithmetic"
  for k, v in TASK.items():
    c.task.kwargs[k] = v
  c.data.num_train = 2_000           # 3 iterations read 48 prompts
  c.data.num_test = 200
  c.data.max_prompt_len = 0          # derived: the longest prompt

  c.rl = rl_defaults()
  c.rl.steps = 3                     # the gate reads the first 3 iterations (iteration 1 samples the base itself)
  c.rl.prompts_per_step = PROMPTS
  c.rl.group_size = GROUP
  c.rl.max_new_tokens = MAX_NEW_TOKENS
  c.rl.optimizer.lr = 1e-5           # small: iterations 2-3 sample nearly the base
  c.rl.correction.name = "cis"       # logs the published rule's truncated fraction beside the mismatch
  c.rl.sync.kind = "dense"           # the sampler's own copy, re-exported after every update
  c.rl.sync.dtype = "bfloat16"
  c.rl.sync.quantizer = QUANTIZER[preset]

  c.eval.num_examples = 200          # the base's held-out greedy accuracy on the task (capability, reported)
  c.eval.batch_size = 200
  c.eval.pass_k = 0
  c.eval.max_new_tokens = MAX_NEW_TOKENS
  c.checkpoint.every = 0             # only the stage's last checkpoint
  c.wandb.mode = "disabled"
  c.progress = False
  return c
