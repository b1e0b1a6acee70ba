"""R-Quest's experiment from the pretrained base (experiments/rquest/; OUR DESIGN, ../shared/methods/llm.md §5): a
proposer writes practice questions `a=3,b=5:a*b+2`, a solver learns from them; the proposer is rewarded by
validity, frontier difficulty and novelty against a memory bank (`rquest`) or by frontier difficulty minus
surface repetition (`rzero`, the R-Zero-style baseline), and the solver learns from the majority of its own
answers (R-Zero's pseudo-label) or, in the checker-label controls, from the checker's exact answer.

  python launch.py --config=configs/rquest.py:gate --workdir=/tmp/rquest/gate_s0 --config.seed=0
  python launch.py --config=configs/rquest.py:rquest --workdir=/tmp/rquest/rquest_s0 --config.seed=0
  python experiments/rquest/run.py --root=/tmp/rquest    # the calibration gate, then every arm and seed

Both models start from the base (experiments/base/model), which solves such questions (its solve_bound skill,
prompt "x=5,a=3:7-x-a=") and writes them (write_question, prompt "b=6,x=8:"), and never learned the reject
head's verdicts: no arm uses the reject head (rquest.judge_samples=0). Every arm runs the `rquest` stage
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

`gate`: the base in the rquest stage for GATE_STEPS iterations with every weight frozen (optimizer.frozen='.'),
its evaluation at the start also on proposer prompts (eval/propose/accuracy: the share of valid questions it
writes greedily): what the calibration gate reads (experiments/rquest/run.py).
"""
from rlkit.train.config import base_config
from rlkit.train.models import role_model_defaults
from rlkit.train.rquest_stage import rquest_defaults

BASE_MODEL = "experiments/base/model"   # the pretrained base (experiments/base/README.md), from the repository root
STEPS = 60
EVAL_EVERY = 10
GATE_STEPS = 5
RL_LR = 1e-4
ARMS = {"rquest": {"reward": "rquest", "labels": "majority"},
        "rzero": {"reward": "rzero", "labels": "majority"},
        "rquest_checker": {"reward": "rquest", "labels": "checker"},
        "rzero_checker": {"reward": "rzero", "labels": "checker"}}
PRESETS = {**{arm: f"the rquest stage from the base, proposer reward {spec['reward']!r}, {spec['labels']} labels"
              for arm, spec in ARMS.items()},
           "gate": f"the base in the rquest stage, frozen, {GATE_STEPS} iterations: the calibration gate's run"}


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
  c.models.proposer.path = BASE_MODEL
  c.models.proposer.trainable = True
  if preset == "gate":
    r.steps, r.eval_every = GATE_STEPS, 0
    r.optimizer.frozen = "."         # every weight of both models: the base measured in the stage's own loop
    c.eval.extra_sets = {"propose": {"role": "propose"}}   # the base writing questions (valid share), greedily
    c.eval.max_new_tokens = 12       # an expression of the proposer's length
  return c
