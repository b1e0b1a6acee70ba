"""Cross-tokenizer on-policy distillation's tiny experiment (experiments/xtok_opd/; OUR DESIGN, methods/llm.md §6):
a teacher that reads the main job's 1-2 digit sums through byte-level BPE merges A, a student that reads them
through merges B, and OPD through the alignment of the two tokenizations (rl.distill.cross_tokenizer): strictly
aligned tokens only, mismatch spans only, or both; against continued SFT and a same-tokenizer upper bound.

  python experiments/xtok_opd/make_bpe.py /tmp/xtok_opd/tokenizers                  # A and B (run.py does it)
  python launch.py --config=configs/xtok_opd.py:teacher_sft --workdir=/tmp/xtok_opd/teacher_s0 --config.seed=0 \
    --config.tokenizer.path=/tmp/xtok_opd/tokenizers/a
  python launch.py --config=configs/xtok_opd.py:student_sft --workdir=/tmp/xtok_opd/student_s0 --config.seed=0 \
    --config.tokenizer.path=/tmp/xtok_opd/tokenizers/b
  python launch.py --config=configs/xtok_opd.py:aligned --workdir=/tmp/xtok_opd/aligned_s0 --config.seed=0 \
    --config.tokenizer.path=/tmp/xtok_opd/tokenizers/b --config.model.path=/tmp/xtok_opd/student_s0 \
    --config.models.teacher.path=/tmp/xtok_opd/teacher_s0
  python experiments/xtok_opd/run.py --root=/tmp/xtok_opd [--seeds=0,1,2]          # all of it

Tokenizers: `make_bpe.py` trains both on the task's training texts ("17+25=42"), VOCAB_A and VOCAB_B tokens
(B's merges are the first of A's: B writes "43" as "4" "3" where A has "43"). The presets read the committed
copy in experiments/xtok_opd/bpe/ (the same files: tests/experiments/test_xtok_opd.py); run.py passes its own
copy under ROOT. Every model is the main job's architecture (configs/grpo_arith.py, 0.4M parameters).

  teacher_sft   tokenizer A, TEACHER_SFT_STEPS SFT steps, evaluated and checkpointed every STUDENT_SFT_STEPS:
                its checkpoint at STUDENT_SFT_STEPS is the same-tokenizer student (the run a student_sft with
                tokenizer A and this seed would be, to the bit: same init, data order and constant lr)
  student_sft   tokenizer B, STUDENT_SFT_STEPS steps: the cross-tokenizer student, short so distillation has room
  sft_demo      from student_sft, STEPS more SFT steps on the task's demonstrations (the main job's SFT settings)
  aligned, spans, both
                from student_sft, the distill stage (advantage opd, pure: reward_weight 0) for STEPS iterations of
                PROMPTS prompts x SAMPLES samples at temperature 1, lr LR, the teacher (models.teacher: the seed's
                teacher_sft workdir) through distill.cross_tokenizer = the arm's name
  same_tok      the same distill stage from the teacher's checkpoint at STUDENT_SFT_STEPS (tokenizer A), plain
                OPD (cross_tokenizer ''): the teacher reads the student's own tokens, nothing is lost to alignment
  test          seconds: SFT 4 steps of a tiny student (tokenizer B), then 2 distill iterations (mode both) from a
                tiny teacher built from fields with tokenizer A (models.teacher.tokenizer)
"""
import os

from rlkit.train.config import sibling_config
from rlkit.train.models import role_model_defaults
from rlkit.train.rl_stage import distill_defaults as distill_stage_defaults

grpo_arith = sibling_config(__file__, "grpo_arith")

VOCAB_A = 360                  # teacher: 2-digit sums mostly one token
VOCAB_B = 290                  # student: 70 merges fewer
BPE_DIR = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "experiments", "xtok_opd", "bpe")
TOKENIZERS = {"a": os.path.join(BPE_DIR, "a"), "b": os.path.join(BPE_DIR, "b")}
TEACHER_SFT_STEPS = 1200         # 600 before the calibration gate (experiments/xtok_opd/results.md)
STUDENT_SFT_STEPS = 300          # 150 before the calibration gate
STEPS = 100                    # distill iterations, or SFT steps of sft_demo: the same number of updates
EVAL_EVERY = 25
PROMPTS, SAMPLES = 32, 2       # 64 sequences an update, as SFT's batch of 64
LR = 1e-4                      # the main job's RL learning rate
ARMS = {"sft_demo": {"student": "b", "cross_tokenizer": None},
        "aligned": {"student": "b", "cross_tokenizer": "aligned"},
        "spans": {"student": "b", "cross_tokenizer": "spans"},
        "both": {"student": "b", "cross_tokenizer": "both"},
        "same_tok": {"student": "a", "cross_tokenizer": ""}}
PRESETS = {"teacher_sft": f"the teacher: tokenizer A, {TEACHER_SFT_STEPS} SFT steps (checkpoint {STUDENT_SFT_STEPS}: "
                          "the same-tokenizer student)",
           "student_sft": f"the student: tokenizer B, {STUDENT_SFT_STEPS} SFT steps",
           "sft_demo": f"{STEPS} more SFT steps of the student on demonstrations",
           **{arm: f"OPD through cross_tokenizer={arm!r}" for arm in ("aligned", "spans", "both")},
           "same_tok": "plain OPD of the same-tokenizer student (the teacher's checkpoint at STUDENT_SFT_STEPS)",
           "test": "seconds: SFT of a tiny student (B), 2 distill iterations from a tiny teacher (A) built from fields"}


def _distill_stage(c, cross_tokenizer: str, steps: int, prompts: int, samples: int):
  c.stages = ("distill",)
  c.distill = d = distill_stage_defaults()
  d.steps, d.prompts_per_step, d.group_size = steps, prompts, samples
  d.max_new_tokens = c.rl.max_new_tokens
  d.optimizer.lr = LR
  d.eval_every = EVAL_EVERY
  d.distill.teacher = "teacher"
  d.distill.cross_tokenizer = cross_tokenizer
  c.models.teacher = role_model_defaults()
  return d


def get_config(arg=None):
  preset = arg or "aligned"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for xtok_opd; choose one of {', '.join(PRESETS)}.")
  c = grpo_arith.get_config("test" if preset == "test" else "cpu")
  c.wandb.mode = "disabled"
  c.tokenizer.kind = "hf"
  c.tokenizer.path = TOKENIZERS["a" if preset == "teacher_sft" or ARMS.get(preset, {}).get("student") == "a" else "b"]
  c.eval.pass_k = 0
  c.sft.stop_at_loss = 0.0           # fixed step counts: the teacher's checkpoint doubles as a student
  if preset == "test":
    d = _distill_stage(c, "both", steps=2, prompts=4, samples=2)
    c.stages = ("sft", "distill")
    d.eval_every = 0
    for key in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
      c.models.teacher[key] = c.model[key]
    c.models.teacher.tokenizer.kind, c.models.teacher.tokenizer.path = "hf", TOKENIZERS["a"]
    return c
  if preset in ("teacher_sft", "student_sft"):
    c.stages = ("sft",)
    c.sft.steps = TEACHER_SFT_STEPS if preset == "teacher_sft" else STUDENT_SFT_STEPS
    if preset == "teacher_sft":
      c.sft.eval_every = STUDENT_SFT_STEPS
      c.checkpoint.every = STUDENT_SFT_STEPS
      c.checkpoint.max_to_keep = TEACHER_SFT_STEPS // STUDENT_SFT_STEPS    # the one at STUDENT_SFT_STEPS stays
    return c
  if preset == "same_tok":
    c.model.path = (f"REQUIRED:--config.model.path=<the seed's teacher_sft workdir>/checkpoints/{STUDENT_SFT_STEPS}")
  else:
    c.model.path = "REQUIRED:--config.model.path=<the seed's student_sft workdir>"   # fails validation until set
  if preset == "sft_demo":
    c.stages = ("sft",)
    c.sft.steps = STEPS
    c.sft.eval_every = EVAL_EVERY
    return c
  _distill_stage(c, ARMS[preset]["cross_tokenizer"], STEPS, PROMPTS, SAMPLES)
  c.models.teacher.path = "REQUIRED:--config.models.teacher.path=<the seed's teacher_sft workdir>"
  return c
