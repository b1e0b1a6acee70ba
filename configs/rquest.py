"""R-Quest's tiny experiment (experiments/rquest/; OUR DESIGN, ../shared/methods/llm.md §5): a proposer writes
practice questions `a=3,b=5:a*b+2`, a solver learns from them, with the proposer rewarded by validity, frontier
difficulty and novelty against a memory bank (`rquest`) or by frontier difficulty minus surface repetition
(`rzero`, the R-Zero-style baseline).

  python launch.py --config=configs/rquest.py:solver_sft --workdir=/tmp/rquest/solver_s0 --config.seed=0
  python launch.py --config=configs/rquest.py:proposer_sft --workdir=/tmp/rquest/proposer_s0 --config.seed=0
  python launch.py --config=configs/rquest.py:rquest --workdir=/tmp/rquest/rquest_s0 --config.seed=0 \
    --config.model.path=/tmp/rquest/solver_s0 --config.models.proposer.path=/tmp/rquest/proposer_s0
  python experiments/rquest/run.py --root=/tmp/rquest [--seeds=0,1,2]                 # all of it

Task `rquest_questions` (rlkit/data/questions.py): questions over one or two bound values in [0, 9] with one or
two of + - * and literals in [0, 9]. `solver_sft`: the main job's model (configs/grpo_arith.py) trained by SFT
on the answers for SOLVER_SFT_STEPS steps, held-out accuracy well below 1 so the solver has room. `proposer_sft`:
the same architecture trained on writing the expression for given bindings, and on reject-head verdicts (30% of
its examples: V or I for a question, half of them corrupted), PROPOSER_SFT_STEPS steps. Both arms then run the
`rquest` stage (rlkit/train/rquest_stage.py) for STEPS iterations of 8 bindings x 8 questions x 4 solver answers,
lr 1e-4 for both models, majority-vote labels for the solver (R-Zero's), evaluated every EVAL_EVERY on the 500
held-out questions:

  rquest   r = v (u - 0.5 d) - 0.5 (1 - v), v = checker-valid and p >= 0.25, d = skill fingerprint in the
           bank or earlier in the batch; the reject head (2 verdicts per draft) drops drafts it calls invalid;
           the solver learns from valid, kept questions
  rzero    r = u - 1.0 rep (trigram Jaccard >= 0.5 within the batch), no checker, no memory, no reject head;
           the solver learns from every question it answered
"""
from rlkit.train.config import sibling_config
from rlkit.train.models import role_model_defaults

grpo_arith = sibling_config(__file__, "grpo_arith")

SOLVER_SFT_STEPS = 300
PROPOSER_SFT_STEPS = 300
STEPS = 50
EVAL_EVERY = 10
ARMS = {"rquest": {"reward": "rquest", "judge_samples": 2},
        "rzero": {"reward": "rzero", "judge_samples": 0}}
PRESETS = {"solver_sft": f"the solver: {SOLVER_SFT_STEPS} steps on answering questions",
           "proposer_sft": f"the proposer: {PROPOSER_SFT_STEPS} steps on writing questions and judging them",
           **{arm: f"the rquest stage with proposer reward {spec['reward']!r}" for arm, spec in ARMS.items()},
           "test": "seconds: both models built from config, 2 iterations (the tests use it)"}


def get_config(arg=None):
  preset = arg or "rquest"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for rquest; choose one of {', '.join(PRESETS)}.")
  c = grpo_arith.get_config("test" if preset == "test" else "cpu")
  c.wandb.mode = "disabled"
  c.task.name = "rquest_questions"
  c.task.kwargs = {"role": "solve"}
  c.data.num_train = 8_000
  c.data.max_prompt_len = 26         # BOS + the longest bindings "a=10,b=99:" + 12 expression tokens + "="
  c.sft.max_len = 32
  c.sft.stop_at_loss = 0.0
  c.eval.max_new_tokens = 6
  c.eval.pass_k = 0
  if preset.endswith("_sft"):
    c.stages = ("sft",)
    c.sft.steps = SOLVER_SFT_STEPS if preset == "solver_sft" else PROPOSER_SFT_STEPS
    if preset == "proposer_sft":
      c.task.kwargs = {"role": "propose", "judge_frac": 0.3}
      c.data.num_train = 1_000       # distinct bindings (and verdict prompts) are the limit of this role
      c.eval.max_new_tokens = 12
    return c
  from rlkit.train.rquest_stage import rquest_defaults
  c.stages = ("rquest",)
  c.rquest = r = rquest_defaults()
  r.steps, r.eval_every, r.prompts_per_step, r.group_size, r.max_new_tokens = STEPS, EVAL_EVERY, 8, 4, 6
  r.optimizer.lr = 1e-4
  r.rquest.reward = ARMS.get(preset, ARMS["rquest"])["reward"]
  r.rquest.judge_samples = ARMS.get(preset, ARMS["rquest"])["judge_samples"]
  c.models.proposer = role_model_defaults()
  c.models.proposer.trainable = True
  for key in ("hidden_size", "intermediate_size", "num_layers", "num_heads", "num_kv_heads", "head_dim"):
    c.models.proposer[key] = c.model[key]
  if preset == "test":
    c.data.num_train, c.data.num_test = 256, 16
    r.steps, r.eval_every, r.prompts_per_step, r.rquest.group = 2, 0, 2, 4
    r.reward.timeout_s = 0.0
    return c
  c.model.path = "REQUIRED:--config.model.path=<the seed's solver_sft workdir>"
  c.models.proposer.path = "REQUIRED:--config.models.proposer.path=<the seed's proposer_sft workdir>"
  return c
