"""Self-Retrospection Distillation's experiment (experiments/srd/, its third design): when every group of a
key-and-door task fails, so GRPO's gradient is exactly zero, does the policy shown its own hindsight teach itself
out of the plateau?

  python experiments/srd/run.py --root=/tmp/srd                       # the SFT, the gate, then 3 seeds x 3 arms
  python launch.py --config=configs/srd.py:srd --workdir=/tmp/srd/srd_s0 --config.seed=0 \
      --config.model.path=/tmp/srd/sft_s0

Built on configs/agentic.py's `key_door` preset (the multi-turn collector, the key-door environment and task,
the `key_door` reward: 1 where the episode reached the last room; every field not set here is that preset's,
documented there and in rlkit/train/config.py and rl_config.py). The start policy is one SFT run from
experiments/base/model (`sft`); every other run loads it (`--config.model.path`, which run.py passes) and runs one
RL stage on N_ROOMS rooms whose keys show no colour (HIDDEN_KEYS): episodes of at most MAX_ACTIONS actions (one a
policy turn, MAX_TURNS turns), STEPS iterations of PROMPTS prompts x GROUP samples at temperature 1, AdamW at LR,
one update per iteration, no KL. A failed episode ends with the observation "Out of time. The way was: ..." (the
shortest way); the episode's summary field "solution" is that way, which the SRD teacher reads as hindsight
(rlkit/train/srd.py, `rl.srd.hindsight=episode`). Presets:

  sft           the start policy: SFT from the base on run.py's rows (2-room demonstrations to act; the 4-room
                layouts no arm plays, the hindsight block in the prompt, to read it), every turn encoded apart
  grpo          GRPO: one group advantage of the success reward on every action token (rl.advantage=group)
  srd           GRPO + the `srd_jsd` loss term (weight SRD_WEIGHT): the current policy, stop-gradient, shown
                "<hindsight>The way was: ...</hindsight>" between the prompt and the episode, is the teacher
                of a top-k JSD on every action token; rows of zero-variance groups weigh weight_hi, the others
                weight_lo (rl.srd)
  srd_shuffled  the control: srd with each group shown another group's way (rl.srd.hindsight=shuffled)
  gate          the calibration gate's run: srd with every weight frozen (the learning rate of 0 that rlkit
                refuses) for GATE["steps"] iterations: the policy's own episodes, nothing learned, with the
                hindsight scorer running so that srd/gap and srd/zero_variance_frac are logged;
                experiments/srd/run.py reads it (and scores the arms' demonstrations, G2) before any arm

The arms differ only where they should: grpo and srd in rl.loss_terms.srd_jsd, srd and srd_shuffled in
rl.srd.hindsight; same data, same sampler keys, so their first iteration plays the same episodes.

Evaluation is kept to the smallest rlkit allows: the task's single-turn `verify` accepts only the whole shortest
way written in one greedy completion, which means nothing for a multi-turn agent, so each run evaluates one
held-out prompt at its start and end (`eval/accuracy` exists only because a finished run is recognised by it).
The success rate comes from the training rows: `reward/success` (= `accuracy`), 32 episodes an iteration.
"""
from rlkit.train.config import set_dotted, sft_defaults, sibling_config

agentic = sibling_config(__file__, "agentic")

BASE_MODEL = agentic.BASE_MODEL   # experiments/base/model, from the repository root
# Third design (README "Third design"): 4 rooms whose keys show no colour (`hidden_keys`), so the key of a door
# further east must be guessed and only the way told at the end names it; the shortest way is 3 x 3 = 9 actions.
N_ROOMS, MAX_ACTIONS, MAX_TURNS = 4, 11, 11   # 2 actions to spare, as the first design's 6 of 8
HIDDEN_KEYS = True
STEPS = 20                      # RL iterations of every arm (README "Budget": the projection rule decides)
WINDOW = 10                     # iterations averaged for "first" and "final" success (README)
PROMPTS, GROUP = 4, 8            # 32 episodes an iteration: 8 prompts did not fit the budget (README "Budget")
LR = 5e-5                       # slca_grpo's and onepo's rate for this base (README "Setup": why not agentic's 1e-5)
SRD_WEIGHT = 1.0                # rl.loss_terms.srd_jsd of the SRD arms
SRD = {"field": "solution", "weight_hi": 1.0, "weight_lo": 0.1}   # rl.srd of every preset (hindsight per arm)
# With hidden keys the prompt shows door 0's colour and how many keys lie in room 0: 12 distinct prompts over the
# 144 layouts. A split keeps its prompts unique (each prompt one layout, the first drawn): 11 to train on (each
# drawn ~7 times in STEPS x PROMPTS = 80 draws), 1 held out for the one-prompt evaluation.
NUM_TRAIN, NUM_TEST = 11, 1
SEEDS = (0, 1, 2)               # the arms' seeds (and the gate's): each seed's split picks its own layouts
# Token sizes, measured with the base's BPE (the build's tokenizer, workdirs/base/tokenizer: 588 tokens, trained on
# a corpus without this task, so its text is spelt almost a character a token) over every layout;
# tests/experiments/test_srd_experiment.py measures them again with a stand-in of the same corpus.
PROMPT_TOKENS = 183             # the longest prompt with BOS (the shortest 161)
ACT_TOKENS = 21                 # the longest action, "<act>take yellow key</act>" ("<act>go east</act>": 14)
DEMO_TOKENS = 507               # the longest demonstration (the 9 actions of the shortest way and their observations),
                                # each action and observation tokenised apart as an episode lays them out
SUCCESS_TOKENS = 703            # the longest successful episode of <= 11 actions, every turn at TURN_TOKENS (627
                                # with every action written as the tokenizer spells it)
EPISODE_TOKENS = 770            # the longest 11-action episode with its final "Out of time" observation, actions
                                # as spelt
HINDSIGHT_TOKENS = 124          # the longest hindsight block, "<hindsight>The way was: ...</hindsight>\n"
MAX_PROMPT_LEN = 184            # >= PROMPT_TOKENS (agentic: 96, too short for this tokenizer)
TURN_TOKENS = 24                # >= ACT_TOKENS with 3 to spare (agentic: 12, shorter than any action here)
MAX_NEW_TOKENS = 704            # >= SUCCESS_TOKENS: no successful episode is ever cut by the token budget (agentic:
                                # 240); a failed one may be cut before its final observation, which the teacher does
                                # not need (it reads the summary's "solution")
# The start model (README "Third design"): one SFT run from the base (seed 0), every gate run and arm from it. Its
# rows (experiments/srd/run.py `sft_rows`): PLAIN_COPIES copies of each of 3 two-room layouts' demonstrations (to
# act), beside the four-room layouts no arm plays (no seed's split holds them) with the hindsight block in the
# prompt, then the demonstration (to read the block). Every turn encoded apart, as the collector lays it out.
SFT = {"steps": 240, "batch_size": 16, "lr": 1e-3, "warmup_steps": 5, "max_len": 864,
       "turn_pattern": "<act>[^<]*</act>(?=<obs>)|<hindsight>[^<]*</hindsight>\n"}
PLAIN_COPIES = 40
# The calibration gate (experiments/srd/README.md), on the `gate` preset's runs of GATE["seeds"], pooled.
GATE = {"steps": 3,             # iterations of the gate's run (frozen: each a fresh batch of the SFT policy's episodes)
        "seeds": SEEDS,         # the gate's runs, pooled
        "success_max": 0.2,     # G1: mean reward/success at most this (most groups all-fail: SRD's regime)
        "blind_gain_min": 0.5,  # G2: the SFT policy's mean log-prob gain, with the hindsight block over without,
                                # summed over each blind take of the arms' layouts (a key whose colour no
                                # observation showed), at least this (nats an action; run.py `hindsight_gain`)
        "turns_min": 2.0}       # G3: policy turns per episode at least this (the policy acts)
BUDGET_MINUTES = 78             # the gate's and the arms' projected CPU wall must fit (run.py checks it after the
                                # gate); the SFT before them takes ~12 of the ~90 CPU-minutes

ARMS = {"grpo": {},
        "srd": {"loss_terms.srd_jsd": SRD_WEIGHT, "srd.hindsight": "episode"},
        "srd_shuffled": {"loss_terms.srd_jsd": SRD_WEIGHT, "srd.hindsight": "shuffled"}}
PRESETS = {"sft": f"the start model: {SFT['steps']} SFT steps from the base on run.py's rows (data.train_jsonl)",
           "gate": f"the calibration gate: srd, every weight frozen, {GATE['steps']} iterations",
           **{arm: f"key-door rooms ({N_ROOMS} rooms, hidden keys, {MAX_ACTIONS} actions) from the SFT policy "
                   f"(model.path), rl fields {fields}" for arm, fields in ARMS.items()}}


def get_config(arg=None):
  preset = arg or "srd"
  if preset not in PRESETS:
    raise ValueError(f"Unknown preset {preset!r} for srd; choose one of {', '.join(PRESETS)}.")
  c = agentic.get_config("key_door")
  if preset == "sft":
    return sft_config(c)
  c.task.kwargs.n_rooms = N_ROOMS
  c.task.kwargs.max_actions = MAX_ACTIONS
  c.task.kwargs.hidden_keys = HIDDEN_KEYS
  c.data.num_train = NUM_TRAIN           # agentic: 15, more than this task's 12 distinct prompts
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


def sft_config(c):
  """The `sft` preset: one SFT stage from the base on the JSONL rows run.py writes (`--config.data.train_jsonl`,
  `--config.data.test_jsonl`; rlkit refuses the run without them), every turn encoded apart (`sft.turn_pattern`)."""
  c.stages = ("sft",)
  c.task.name, c.task.kwargs = "jsonl", {}
  c.data.max_prompt_len = 0              # derived from the rows (a prompt with its hindsight block)
  c.eval.num_examples, c.eval.batch_size = 1, 1   # run.py's one held-out row (data.test_jsonl): evaluated only
  c.eval.max_new_tokens = TURN_TOKENS             # so that a finished run is recognised, as the arms' prompt
  c.sft = s = sft_defaults()
  s.steps, s.batch_size, s.max_len = SFT["steps"], SFT["batch_size"], SFT["max_len"]
  s.turn_pattern = SFT["turn_pattern"]
  s.optimizer.lr, s.optimizer.warmup_steps, s.optimizer.schedule = SFT["lr"], SFT["warmup_steps"], "cosine"
  c.checkpoint.every = 0
  return c
