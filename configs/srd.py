"""Self-Retrospection Distillation's experiment from the pretrained base (experiments/srd/): when every group of
a key-and-door task fails, so GRPO's gradient is exactly zero, does the policy shown its own hindsight teach
itself out of the plateau?

  python experiments/srd/run.py --root=/tmp/srd                       # the gate, then 3 seeds x 3 arms
  python launch.py --config=configs/srd.py:srd --workdir=/tmp/srd/srd_s0 --config.seed=0

Built on configs/agentic.py's `key_door` preset (the multi-turn collector, the key-door environment and task,
the `key_door` reward: 1 where the episode reached the last room; every field not set here is that preset's,
documented there and in rlkit/train/config.py and rl_config.py). Every run starts from experiments/base/model
(whose corpus never held this task) and runs one RL stage on N_ROOMS rooms: episodes of at most MAX_ACTIONS
actions (one a policy turn, MAX_TURNS turns), STEPS iterations of PROMPTS prompts x GROUP samples at temperature
1, AdamW at LR, one update per iteration, no KL. A failed episode ends with the observation "Out of time. The
way was: ..." (the shortest way); the episode's summary field "solution" is that way, which the SRD teacher reads
as hindsight (rlkit/train/srd.py, `rl.srd.hindsight=episode`). Presets:

  grpo          GRPO: one group advantage of the success reward on every action token (rl.advantage=group)
  srd           GRPO + the `srd_jsd` loss term (weight SRD_WEIGHT): the current policy, stop-gradient, shown
                "<hindsight>The way was: ...</hindsight>" between the prompt and the episode, is the teacher
                of a top-k JSD on every action token; rows of zero-variance groups weigh weight_hi, the others
                weight_lo (rl.srd)
  srd_shuffled  the control: srd with each group shown another group's way (rl.srd.hindsight=shuffled)
  gate          the calibration gate's run: srd with every weight frozen (the learning rate of 0 that rlkit
                refuses) for GATE["steps"] iterations: the base's own episodes, nothing learned, with the
                hindsight scorer running so that srd/gap and srd/zero_variance_frac are logged;
                experiments/srd/run.py reads it (and scores the task's demonstrations, G2) before any arm

The arms differ only where they should: grpo and srd in rl.loss_terms.srd_jsd, srd and srd_shuffled in
rl.srd.hindsight; same data, same sampler keys, so their first iteration plays the same episodes.

Evaluation is kept to the smallest rlkit allows: the task's single-turn `verify` accepts only the whole shortest
way written in one greedy completion, which means nothing for a multi-turn agent, so each run evaluates one
held-out prompt at its start and end (`eval/accuracy` exists only because a finished run is recognised by it).
The success rate comes from the training rows: `reward/success` (= `accuracy`), 64 episodes an iteration.
"""
from rlkit.train.config import set_dotted, sibling_config

agentic = sibling_config(__file__, "agentic")

BASE_MODEL = agentic.BASE_MODEL   # experiments/base/model, from the repository root
N_ROOMS, MAX_ACTIONS, MAX_TURNS = 3, 8, 8   # the shortest way is 3 x (N_ROOMS - 1) = 6 actions: 2 to spare
STEPS = 20                      # RL iterations of every arm (README "Budget": the projection rule decides)
WINDOW = 10                     # iterations averaged for "first" and "final" success (README)
PROMPTS, GROUP = 4, 8            # 32 episodes an iteration: 8 prompts did not fit the budget (README "Budget")
LR = 5e-5                       # slca_grpo's and onepo's rate for this base (README "Setup": why not agentic's 1e-5)
SRD_WEIGHT = 1.0                # rl.loss_terms.srd_jsd of the SRD arms
SRD = {"field": "solution", "weight_hi": 1.0, "weight_lo": 0.1}   # rl.srd of every preset (hindsight per arm)
# The task has 16 distinct prompts (24 layouts: where door 1's key lies in room 1 the prompt does not show door
# 1's colour, so 3 layouts share each of 4 prompts), and a split keeps its prompts unique: 15 to train on (each
# drawn ~5 times in STEPS x PROMPTS = 80 draws), 1 held out for the one-prompt evaluation.
NUM_TRAIN, NUM_TEST = 15, 1
# Token sizes, measured with the base's BPE (the build's tokenizer, workdirs/base/tokenizer: 588 tokens, trained on
# a corpus without this task, so its text is spelt almost a character a token) over every layout;
# tests/experiments/test_srd_experiment.py measures them again with a stand-in of the same corpus.
PROMPT_TOKENS = 181             # the longest prompt with BOS (the shortest 163)
ACT_TOKENS = 21                 # the longest action, "<act>take yellow key</act>" ("<act>go east</act>": 14)
DEMO_TOKENS = 328               # the longest demonstration (the 6 actions of the shortest way and their observations),
                                # each action and observation tokenised apart as an episode lays them out
SUCCESS_TOKENS = 504            # the longest successful episode of <= 8 actions, every turn at TURN_TOKENS (447
                                # with every action written as the tokenizer spells it)
EPISODE_TOKENS = 534            # the longest 8-action episode with its final "Out of time" observation (90 tokens),
                                # actions as spelt
HINDSIGHT_TOKENS = 92           # the longest hindsight block, "<hindsight>The way was: ...</hindsight>\n"
MAX_PROMPT_LEN = 184            # >= PROMPT_TOKENS (agentic: 96, too short for this tokenizer)
TURN_TOKENS = 24                # >= ACT_TOKENS with 3 to spare (agentic: 12, shorter than any action here)
MAX_NEW_TOKENS = 512            # >= SUCCESS_TOKENS: no successful episode is ever cut by the token budget (agentic:
                                # 240); a failed one may be cut before its final observation, which the teacher does
                                # not need (it reads the summary's "solution")
# The calibration gate (experiments/srd/README.md), on the `gate` preset's runs of GATE["seeds"], pooled.
GATE = {"steps": 3,             # iterations of the gate's run (frozen: each a fresh batch of the base's episodes)
        "seeds": (0, 1, 2),     # the gate's runs, pooled
        "success_max": 0.2,     # G1: mean reward/success at most this (most groups all-fail: SRD's regime)
        "gain_min": 0.1}        # G2: the base's mean log-prob gain per demonstration action token, with the
                                # hindsight block over without, at least this (nats; run.py `hindsight_gain`)
BUDGET_MINUTES = 90             # the arms' projected CPU wall must fit (run.py checks it after the gate)

ARMS = {"grpo": {},
        "srd": {"loss_terms.srd_jsd": SRD_WEIGHT, "srd.hindsight": "episode"},
        "srd_shuffled": {"loss_terms.srd_jsd": SRD_WEIGHT, "srd.hindsight": "shuffled"}}
PRESETS = {"gate": f"the calibration gate: srd, every weight frozen, {GATE['steps']} iterations",
           **{arm: f"key-door rooms ({N_ROOMS} rooms, {MAX_ACTIONS} actions) from the base, rl fields {fields}"
              for arm, fields in ARMS.items()}}


def get_config(arg=None):
  preset = arg or "srd"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for srd; choose one of {', '.join(PRESETS)}.")
  c = agentic.get_config("key_door")
  c.task.kwargs.n_rooms = N_ROOMS        # the task's defaults, pinned
  c.task.kwargs.max_actions = MAX_ACTIONS
  c.data.num_train = NUM_TRAIN           # agentic: the default 20,000, more than the task's 16 distinct prompts
  c.data.num_test = NUM_TEST             # agentic: the default 500
  c.data.max_prompt_len = MAX_PROMPT_LEN
  mt = c.rl.multi_turn
  mt.env_kwargs.max_actions = MAX_ACTIONS   # the environment's budget, as the task's prompt states it
  mt.max_turns = MAX_TURNS
  mt.turn_tokens = TURN_TOKENS
  c.rl.max_new_tokens = MAX_NEW_TOKENS
  c.rl.steps = STEPS                     # agentic: 100
  c.rl.prompts_per_step = PROMPTS
  c.rl.group_size = GROUP
  c.rl.optimizer.lr = LR                 # agentic: 1e-5
  c.rl.advantage = "group"               # agentic's key_door: the default, pinned
  c.rl.eval_every = 0                    # evaluated at the start and the end only
  c.rl.srd.update(SRD)                   # rlkit's defaults, pinned (the template, top_k 16, beta 0.5 stay rlkit's)
  c.eval.num_examples = 1                # agentic: 64; the smallest allowed (module docstring: meaningless here)
  c.eval.batch_size = 1
  c.eval.max_new_tokens = TURN_TOKENS    # one greedy turn, shown in the run's log as a sample
  c.checkpoint.every = WINDOW            # agentic: 25
  arm = "srd" if preset == "gate" else preset
  for key, value in ARMS[arm].items():
    set_dotted(c.rl, key, value)
  if preset == "gate":
    c.rl.steps = GATE["steps"]
    c.rl.optimizer.frozen = "."          # every weight frozen (its update is -0.0, bit for bit): a measurement
                                         # of the base, nothing learned (rlkit refuses lr 0)
  return c
