"""On-policy distillation across teacher and student scales (experiments/opd_scale/; OUR DESIGN, methods/llm.md
§6 "Tiny CPU experiments (2) Scales"): teachers of two widths, each SFT-trained and RL-trained (SFT then GRPO),
distilled by pure OPD into students of two other widths that start from a short SFT; gap recovery against the
initial top-k overlap of teacher and student and against the teacher's accuracy.

  python launch.py --config=configs/opd_scale.py:teacher_w192 --workdir=/tmp/opd_scale/teacher_w192_s0 \
    --config.seed=0
  python launch.py --config=configs/opd_scale.py:student_w128 --workdir=/tmp/opd_scale/student_w128_s0 \
    --config.seed=0
  python launch.py --config=configs/opd_scale.py:s128_from_t192rl --workdir=/tmp/opd_scale/s128_from_t192rl_s0 \
    --config.seed=0 --config.model.path=/tmp/opd_scale/student_w128_s0 \
    --config.models.teacher.path=/tmp/opd_scale/teacher_w192_s0/checkpoints/740
  python experiments/opd_scale/run.py --root=/tmp/opd_scale [--seeds=0,1,2]          # all of it

Task, data, tokenizer (char), SFT and RL settings: the main job's (configs/grpo_arith.py, preset cpu: 1-2 digit
sums, 8,000 training and 500 held-out prompts per seed, SFT batch 64 at AdamW lr 1e-3 with 20 warm-up steps,
RL 32 prompts x 8 samples at lr 1e-4, one update per iteration), at fixed step counts; only the width changes
(2 layers, head_dim 32, MLP 3 x the width: WIDTHS). Greedy held-out accuracy only (eval.pass_k 0).

  teacher_w96, teacher_w192
                a teacher from scratch: TEACHER_SFT_STEPS SFT steps (that stage's checkpoint is the SFT-trained
                teacher t<w>sft), then TEACHER_RL_STEPS iterations of the main job's GRPO stage (the RL-trained
                teacher t<w>rl); each stage evaluated at its end, its last checkpoint kept (`teacher_step`)
  student_w64, student_w128
                a student from scratch: STUDENT_SFT_STEPS SFT steps (short, so the teachers have room above it)
  s<w>_from_t<w><sft|rl>   (the 6 pre-registered PAIRS)
                from the student's workdir (model.path), the distill stage: advantage opd, pure (reward_weight
                0), DISTILL_STEPS iterations of PROMPTS x SAMPLES at temperature 1, AdamW lr DISTILL_LR after
                DISTILL_WARMUP warm-up steps, the teacher's checkpoint as models.teacher.path; evaluated at the end
  test          seconds: 4 SFT steps of a tiny student (width 32), then 2 distill iterations from a tiny teacher
                of another width (48) built from fields: what an arm runs, at test size
"""
from rlkit.train.config import sibling_config
from rlkit.train.models import role_model_defaults
from rlkit.train.rl_stage import distill_defaults as distill_stage_defaults

grpo_arith = sibling_config(__file__, "grpo_arith")

# width -> (num_heads, num_kv_heads); head_dim 32 and intermediate 3 x width everywhere (width 128 is the main
# job's model). Parameters besides the embedding: 64 -> 0.10M, 96 -> 0.22M, 128 -> 0.39M, 192 -> 0.88M.
WIDTHS = {64: (2, 1), 96: (3, 1), 128: (4, 2), 192: (6, 3)}
TEACHER_WIDTHS = (96, 192)
STUDENT_WIDTHS = (64, 128)          # 64 below both teachers; 128 above the small one, below the large one
TEACHER_SFT_STEPS = 1200         # 700 before the calibration gate (experiments/opd_scale/results.md)
TEACHER_RL_STEPS = 40
STUDENT_SFT_STEPS = 300
DISTILL_STEPS = 60
PROMPTS, SAMPLES = 32, 2            # 64 sequences an update, as SFT's batch of 64
DISTILL_LR = 3e-4                   # between the main job's RL (1e-4) and SFT (1e-3) rates (README, "Setup")
DISTILL_WARMUP = 10
TEACHERS = {f"t{w}{kind}": {"width": w, "kind": kind} for w in TEACHER_WIDTHS for kind in ("sft", "rl")}
# The pre-registered pairs: the width-128 student from all four teachers, the width-64 student from the small
# RL-trained and the large SFT-trained one (all 8 pairs do not fit the 20-minute budget: README, "Budget").
PAIRS = (("s128", "t96sft"), ("s128", "t96rl"), ("s128", "t192sft"), ("s128", "t192rl"),
         ("s64", "t96rl"), ("s64", "t192sft"))
ARMS = {f"{s}_from_{t}": {"student": int(s[1:]), "teacher": t} for s, t in PAIRS}
PRESETS = {**{f"teacher_w{w}": f"width-{w} teacher: {TEACHER_SFT_STEPS} SFT steps, then {TEACHER_RL_STEPS} GRPO "
                              "iterations" for w in TEACHER_WIDTHS},
           **{f"student_w{w}": f"width-{w} student: {STUDENT_SFT_STEPS} SFT steps" for w in STUDENT_WIDTHS},
           **{arm: f"pure OPD of the width-{spec['student']} student from teacher {spec['teacher']}"
              for arm, spec in ARMS.items()},
           "test": "seconds: SFT of a tiny student, 2 distill iterations from a tiny teacher of another width"}


def teacher_step(kind: str) -> int:
  """The global step of a teacher workdir's checkpoint that is teacher `kind` (sft | rl)."""
  return TEACHER_SFT_STEPS + (TEACHER_RL_STEPS if kind == "rl" else 0)


def set_width(section, width: int, heads: int, kv_heads: int, head_dim: int = 32) -> None:
  """A model section's architecture at `width` (2 layers, MLP 3 x width)."""
  section.hidden_size, section.intermediate_size, section.num_layers = width, 3 * width, 2
  section.num_heads, section.num_kv_heads, section.head_dim = heads, kv_heads, head_dim


def _distill_stage(c, steps: int, prompts: int, samples: int):
  c.stages = ("distill",)
  c.distill = d = distill_stage_defaults()
  d.steps, d.prompts_per_step, d.group_size = steps, prompts, samples
  d.max_new_tokens = c.rl.max_new_tokens
  d.optimizer.lr, d.optimizer.warmup_steps = DISTILL_LR, DISTILL_WARMUP
  d.eval_every = 0                  # at the end only; step 0 is the student's own evaluation
  d.distill.teacher = "teacher"
  d.distill.reward_weight = 0.0     # pure distillation: the verifier's reward is logged, never trained on
  c.models.teacher = role_model_defaults()
  return d


def get_config(arg=None):
  preset = arg or "s128_from_t192rl"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for opd_scale; choose one of {', '.join(PRESETS)}.")
  c = grpo_arith.get_config("test" if preset == "test" else "cpu")
  c.wandb.mode = "disabled"
  c.eval.pass_k = 0                 # greedy accuracy only (pass@k samples 4x as much)
  c.sft.stop_at_loss = 0.0          # fixed step counts, so every seed's models have had the same training
  c.checkpoint.every = 0            # only each stage's last checkpoint (always kept): a teacher workdir's two
                                    # are its SFT-trained and RL-trained teachers (teacher_step)
  if preset == "test":
    _distill_stage(c, steps=2, prompts=4, samples=2)
    c.stages = ("sft", "distill")
    set_width(c.models.teacher, 48, 3, 1, head_dim=16)   # another width than the student's (32)
    return c
  kind, _, rest = preset.partition("_")
  if kind == "teacher":
    set_width(c.model, int(rest[1:]), *WIDTHS[int(rest[1:])])
    c.stages = ("sft", "rl")
    c.sft.steps = TEACHER_SFT_STEPS
    c.rl.steps = TEACHER_RL_STEPS
    c.rl.eval_every = 0
    return c
  if kind == "student":
    set_width(c.model, int(rest[1:]), *WIDTHS[int(rest[1:])])
    c.stages = ("sft",)
    c.sft.steps = STUDENT_SFT_STEPS
    return c
  spec = ARMS[preset]
  set_width(c.model, spec["student"], *WIDTHS[spec["student"]])       # what the student's checkpoint holds
  _distill_stage(c, DISTILL_STEPS, PROMPTS, SAMPLES)
  teacher = TEACHERS[spec["teacher"]]
  set_width(c.models.teacher, teacher["width"], *WIDTHS[teacher["width"]])
  c.model.path = f"REQUIRED:--config.model.path=<the seed's student_w{spec['student']} workdir>"
  c.models.teacher.path = (f"REQUIRED:--config.models.teacher.path=<the seed's teacher_w{teacher['width']} "
                           f"workdir>/checkpoints/{teacher_step(teacher['kind'])}")
  return c
