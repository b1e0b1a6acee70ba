"""R-Quest's experiment from the pretrained base (experiments/rquest/; OUR DESIGN, ../shared/methods/llm.md §5): a
proposer writes practice questions `a=3,b=5:a*b+2`, a solver learns from them; the proposer is rewarded by
validity, frontier difficulty and novelty against a memory bank (`rquest`) or by frontier difficulty minus
surface repetition (`rzero`, the R-Zero-style baseline), and the solver learns from the majority of its own
answers (R-Zero's pseudo-label) or, in the checker-label controls, from the checker's exact answer.

  python launch.py --config=configs/rquest.py:proposer_sft --workdir=/tmp/rquest/proposer_sft_s0 --config.seed=0
  python launch.py --config=configs/rquest.py:gate --workdir=/tmp/rquest/gate_s0 --config.seed=0 \
      --config.models.proposer.path=/tmp/rquest/proposer_sft_s0
  python launch.py --config=configs/rquest.py:rquest --workdir=/tmp/rquest/rquest_s0 --config.seed=0 \
      --config.models.proposer.path=/tmp/rquest/proposer_sft_s0
  python experiments/rquest/run.py --root=/tmp/rquest    # proposer SFT, the calibration gate, every arm and seed

The solver is the base (experiments/base/model), which solves such questions (its solve_bound skill, prompt
"x=5,a=3:7-x-a="). The proposer is the base after `proposer_sft`: PROPOSER_SFT_STEPS steps of SFT on the
proposer's demonstrations (bindings -> expression, prompt "b=6,x=8:"), one run per seed, since the base's own
write_question skill did not take (the first gate: 0 of 320 questions valid). Neither learned the reject head's
verdicts: no arm uses the reject head (rquest.judge_samples=0). Every arm runs the `rquest` stage
(rlkit/train/rquest_stage.py) for STEPS iterations of 8 bindings x 8 questions x 4 solver answers, lr RL_LR for
both models, evaluated every EVAL_EVERY on the 500 held-out questions; the arms differ in the proposer reward
and the solver's labels only (`ARMS`):

  rquest          r = v (u - 0.5 d) - 0.5 (1 - v), v = checker-valid and p >= 0.25, d = skill fingerprint in the
                  bank or earlier in the batch; the solver learns from the v questions, majority labels
  rzero           r = u - 1.0 rep (trigram Jaccard >= 0.5 within the batch); the solver learns from every
                  question it answered, majority labels
  rquest_checker  rquest with the checker's labels (rquest.labels='checker'): the label-noise control
  rzero_checker   rzero with the checker's labels (which exist for valid questions only, so its solver learns
                  from the valid ones)

`gate`: the base solver and the seed's SFT proposer in the rquest stage for GATE_STEPS iterations with every
weight frozen (optimizer.frozen='.'): what the calibration gate reads (experiments/rquest/run.py), with the
proposer SFT's own held-out evaluation (eval/accuracy: the share of valid questions it writes greedily).
"""
from rlkit.train.config import base_config, sft_defaults
from rlkit.train.models import role_model_defaults
from rlkit.train.rquest_stage import rquest_defaults

BASE_MODEL = "experiments/base/model"   # the pretrained base (experiments/base/README.md), from the repository root
STEPS = 60
EVAL_EVERY = 10
GATE_STEPS = 5
RL_LR = 1e-4
PROPOSER_SFT_STEPS = 800            # 66% valid questions, greedy, in the probe (experiments/rquest/probe_runs)
PROPOSER_REQUIRED = "REQUIRED:--config.models.proposer.path=<the seed's proposer_sft workdir>"
ARMS = {"rquest": {"reward": "rquest", "labels": "majority"},
        "rzero": {"reward": "rzero", "labels": "majority"},
        "rquest_checker": {"reward": "rquest", "labels": "checker"},
        "rzero_checker": {"reward": "rzero", "labels": "checker"}}
PRESETS = {**{arm: f"the rquest stage from the base, proposer reward {spec['reward']!r}, {spec['labels']} labels"
              for arm, spec in ARMS.items()},
           "gate": f"the base and the SFT proposer in the rquest stage, frozen, {GATE_STEPS} iterations: the gate's run",
           "proposer_sft": f"the base fine-tuned on the proposer's demonstrations, {PROPOSER_SFT_STEPS} steps"}


def get_config(arg=None):
  preset = arg or "rquest"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for rquest; choose one of {', '.join(PRESETS)}.")
  c = base_config()
  c.model.path = BASE_MODEL
  c.tokenizer.kind = "hf"            # the model folder's tokenizer (tokenizer.path "")
  c.task.name = "rquest_questions"
  c.task.kwargs = {"role": "solve"}
  c.data.num_train = 8_000
  c.data.num_test = 500
  c.data.max_prompt_len = 26         # what the stage needs: BOS, the longest bindings, 12 expression tokens, "="
  c.eval.num_examples = 500
  c.eval.batch_size = 500
  c.eval.max_new_tokens = 6
  c.eval.pass_k = 0
  c.checkpoint.every = 0             # the stage's last checkpoint only
  c.wandb.mode = "disabled"
  c.stages = ("rquest",)
  c.rquest = r = rquest_defaults()
  r.steps, r.eval_every, r.prompts_per_step, r.group_size, r.max_new_tokens = STEPS, EVAL_EVERY, 8, 4, 6
  r.optimizer.lr = RL_LR
  spec = ARMS.get(preset, ARMS["rquest"])
  r.rquest.reward, r.rquest.labels, r.rquest.judge_samples = spec["reward"], spec["labels"], 0
  c.models.proposer = role_model_defaults()
  c.models.proposer.path = PROPOSER_REQUIRED
  c.models.proposer.trainable = True
  if preset == "gate":
    r.steps, r.eval_every = GATE_STEPS, 0
    r.optimizer.frozen = "."         # every weight of both models: measured in the stage's own loop
  if preset == "proposer_sft":
    proposer_sft(c, PROPOSER_SFT_STEPS)
  return c


def proposer_sft(c, steps: int) -> None:
  """`c` made an SFT run of `steps` steps of 64 of the proposer's demonstrations (`a=3,b=5:` -> `a*b+2`) from
  the base, evaluated greedily on held-out bindings (eval/accuracy: the share of valid questions, the task's
  own checker) and as a solver (eval/solve/accuracy: what the fine-tuning costs the base at solving)."""
  del c["rquest"]
  del c.models["proposer"]
  c.stages = ("sft",)
  c.task.kwargs = {"role": "propose"}
  c.eval.extra_sets = {"solve": {"role": "solve"}}
  c.eval.max_new_tokens = 12         # an expression of the proposer's length
  # The proposer's prompts are bindings alone: 740 distinct ones, so 600 train (one expression each) and 100
  # held out.
  c.data.num_train, c.data.num_test = 600, 100
  c.eval.num_examples = c.eval.batch_size = 100
  c.sft = s = sft_defaults()
  s.steps, s.batch_size, s.max_len = steps, 64, 40
  s.optimizer.lr, s.optimizer.warmup_steps, s.optimizer.schedule = 3e-4, 10, "cosine"
  s.eval_every = 0
