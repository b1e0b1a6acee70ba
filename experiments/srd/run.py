"""Driver of experiments/srd (README.md; the third design): the start policy (one SFT run from the base), the
calibration gate (the policy's own episodes, and the policy scoring the arms' demonstrations with and without the
hindsight), the budget check, then every arm of every seed from the policy, then the archive.

  python experiments/srd/run.py --root=/tmp/srd                       # SFT, gate, 3 seeds x 3 arms, archive
  python experiments/srd/run.py --root=DIR --seeds=0 --arms=grpo,srd
  python experiments/srd/run.py --root=DIR --dry_run                  # print the commands only
  python experiments/srd/run.py --sizes                               # the token sizes configs/srd.py states
  python experiments/srd/summarize.py --out=experiments/srd           # results.md and the plot

Besides the shared flags (--root, --seeds, --arms, --lock, --dry_run, --archive: experiments/gate.py),
--model=PATH starts the SFT from that base instead of experiments/base/model (a smoke run on a stand-in), and
--ignore_budget runs the arms even when the gate's timing projects them past the budget. --sizes prints
`token_sizes` with --model's tokenizer (default: the base's) and exits.

0. The start policy: `sft_rows` written to DIR/sft_rows.jsonl (and its one-row evaluation file), then
   `configs/srd.py:sft` into DIR/sft_s0 (seed 0); every later run loads it (`--config.model.path`).
1. The gate (README "Calibration gate", as the third design amends it): `configs/srd.py:gate` into
   DIR/gate_s<seed> for each of GATE["seeds"] (whatever --seeds says: the gate is pooled over those); then
   `gate_checks` of their training rows pooled (G1, G3) and of `hindsight_gain`, the policy scoring the arms'
   layouts' demonstrations with and without the hindsight block (G2: on the blind takes), recorded in
   DIR/gate.json with the measured numbers and the budget projection. A failed gate stops the driver before any
   arm (exit GATE_FAILED), after archiving the runs.
2. The budget (README "Budget"): the gate's wall times and iteration times project the gate and every arm of
   GATE["seeds"]; past BUDGET_MINUTES the driver stops before any arm (exit BUDGET_EXCEEDED) and prints the STEPS
   that would fit.
3. The arms: `configs/srd.py:<arm>` into DIR/<arm>_s<seed>, seed by seed.
4. The archive (`--archive`, default experiments/srd/runs; '' none): each finished workdir's config.json and its
   metrics cut to what summarize.py reads (`ARCHIVE_KEYS`), the wall records (each with the commit it ran at),
   and gate.json.

Finished workdirs are skipped, unfinished ones resumed (experiments/driver.py); DIR/runs.jsonl gets each
command's wall time and commit. Every launch shares one persistent XLA compilation cache, DIR/jax_cache (unless
JAX_COMPILATION_CACHE_DIR is set). The flow after the SFT is experiments/gate.py's `gate_then_arms`.
"""
import argparse
import functools
import itertools
import json
import math
import os
import re
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks._common import commit  # noqa: E402
from configs.srd import (ARMS, BASE_MODEL, BUDGET_MINUTES, GATE, HIDDEN_KEYS, MAX_ACTIONS, N_ROOMS,  # noqa: E402
                         NUM_TEST, NUM_TRAIN, PLAIN_COPIES, SEEDS, STEPS, WINDOW, get_config)
from experiments.driver import finished, launch, report, use_compilation_cache  # noqa: E402,F401  (tests patch launch)
from experiments.gate import (BUDGET_EXCEEDED, GATE_FAILED, budget_projection, check, gate_then_arms,  # noqa: E402,F401
                              parse_driver_args, pooled_rows, record_gate)
from experiments.srd.summarize import ARCHIVE_KEYS, SUCCESS  # noqa: E402

CONFIG = "configs/srd.py"
TAG = "srd"
ARCHIVE = os.path.join("experiments", "srd", "runs")
CHECKPOINT_S = 5.0       # an arm's checkpoint beyond the gate's one (every WINDOW iterations), in seconds: an
                         # estimate, as the runs do not log it; the evaluations (one prompt, at the start and the
                         # end) are the gate's own
ACTION = re.compile(r"(<act>.*?</act>)", re.S)


def gate_paths(root: str) -> list:
  return [os.path.join(root, f"gate_s{seed}") for seed in GATE["seeds"]]


# ---------------------------------------------------------------------------------------------------------------
# The task's worlds, their demonstrations as the collector lays them out, and their token sizes.

def layouts(n_rooms: int = N_ROOMS) -> list:
  """Every layout of `n_rooms` rooms: door colours (distinct, ordered) and each door's key room (<= the door)."""
  from rlkit.agents.keydoor import COLOURS
  return [{"doors": list(doors), "keys": list(keys)}
          for doors in itertools.permutations(COLOURS, n_rooms - 1)
          for keys in itertools.product(*(range(i + 1) for i in range(n_rooms - 1)))]


def world_rows(n_rooms: int = N_ROOMS, max_actions: int = MAX_ACTIONS, hidden_keys: bool = HIDDEN_KEYS) -> list:
  """One task row ({prompt, answer, layout}) per layout, in `layouts` order, written by the task itself (its
  `make_example`, drawn from a fixed stream until every layout has come up); `hidden_keys`: the task's variant
  whose rooms show no key colours."""
  from rlkit.agents.keydoor import KeyDoor
  task = KeyDoor(n_rooms=n_rooms, max_actions=max_actions, hidden_keys=hidden_keys)
  rng, found = np.random.default_rng(0), {}
  want = [repr(dict(layout, **({"hidden_keys": True} if hidden_keys else {}))) for layout in layouts(n_rooms)]
  while len(found) < len(want):
    row = task.make_example(rng)
    found.setdefault(repr(row["layout"]), row)
  return [found[key] for key in want]


def segments(row: dict, n_rooms: int = N_ROOMS) -> list:
  """The row's demonstration as an episode lays it out: [(text, is_action)], each action (`<act>...</act>`, a
  policy turn) and each observation apart, as the collector tokenises them (one at a time). The layout says
  whether its keys are hidden."""
  from rlkit.agents.keydoor import KeyDoor
  text = KeyDoor(n_rooms=n_rooms, max_actions=max(MAX_ACTIONS, 3 * (n_rooms - 1))).demonstration(row)
  return [(part, bool(ACTION.fullmatch(part))) for part in ACTION.split(text) if part]


def blind_take(action: str, layout: dict) -> bool:
  """Whether `action` (`<act>take C key</act>`) takes the key of a door further east than the room it lies in
  (keys[i] < i): a colour no observation shows before it is taken where the keys are hidden."""
  m = re.fullmatch(r"<act>take (\w+) key</act>", action)
  door = layout["doors"].index(m[1]) if m and m[1] in layout["doors"] else None
  return door is not None and layout["keys"][door] < door


def token_sizes(tokenizer, turn_tokens: int = None) -> dict:
  """The sizes configs/srd.py states, measured with `tokenizer` over every layout: the longest prompt (with BOS,
  as the data pipeline counts it), action, demonstration (its segments tokenised apart), successful episode of at
  most MAX_ACTIONS actions (actions as the tokenizer spells them, and every turn at `turn_tokens`), MAX_ACTIONS-
  action episode with its final observation, and hindsight block."""
  from rlkit.agents.keydoor import COLOURS, GOAL, NOTHING, STOP, act, describe, shortest_way, state_from_layout
  from rlkit.data.pipeline import token_lengths
  from rlkit.train.srd import episode_text
  c = get_config("srd")
  turn_tokens = turn_tokens or c.rl.multi_turn.turn_tokens
  n = functools.lru_cache(None)(lambda text: len(tokenizer.encode(text)))
  rows = world_rows()
  actions = ["go east", "go west"] + [f"{v} {c_} {o}" for v, o in (("take", "key"), ("open", "door")) for c_ in COLOURS]

  def spelt(a):
    return n(f"<act>{a}{STOP}")

  def final(state):
    return f"<obs>Out of time. The way was: {', '.join(shortest_way(state))}.</obs>"

  def longest(layout, act_len, succeed: bool) -> int:
    @functools.lru_cache(None)
    def best(state, left):                # the most tokens from `state` with `left` actions to go
      out = -10 ** 9
      for a in actions:
        new = act(state, a)
        cost = turn_tokens if new is None else act_len(a)
        if new is not None and new.success:
          out = max(out, cost + n(GOAL))
        elif left == 1:                   # the last action: out of time (a success only counts above)
          out = max(out, -10 ** 9 if succeed else cost + n(final(state if new is None else new)))
        else:
          out = max(out, cost + n(NOTHING if new is None else describe(new)) + best(state if new is None else new,
                                                                                    left - 1))
      return out
    return best(state_from_layout(layout), MAX_ACTIONS)

  prompts, _ = token_lengths([{"prompt": r["prompt"], "answer": r["answer"]} for r in rows], tokenizer)
  block = c.rl.srd.template
  return {"prompt": max(prompts), "prompt_min": min(prompts), "action": max(spelt(a) for a in actions),
          "demonstration": max(sum(n(s) for s, _ in segments(r)) for r in rows),
          "success": max(longest(r["layout"], lambda a: turn_tokens, True) for r in rows),
          "success_spelt": max(longest(r["layout"], spelt, True) for r in rows),
          "episode": max(longest(r["layout"], spelt, False) for r in rows),
          "hindsight": max(n(block.format(hindsight=episode_text(_with_episode(r), c.rl.srd.field))) for r in rows)}


def arm_rows(seeds=SEEDS) -> list:
  """The worlds the arms play: every layout in some seed's split of the task (train and held-out prompts), as
  `world_rows` writes them, in `layouts` order."""
  from rlkit.data.splits import generate_splits
  from rlkit.train.config import task_kwargs
  from rlkit.agents.keydoor import KeyDoor
  task = KeyDoor(**task_kwargs(get_config("srd")))
  seen = {_key(json.loads(r["fields"])["layout"])
          for seed in seeds for split in generate_splits(task, NUM_TRAIN, NUM_TEST, seed).values() for r in split}
  return [r for r in world_rows() if _key(r["layout"]) in seen]


def _key(layout: dict) -> str:
  return json.dumps(layout, sort_keys=True)


def hindsight_block(way: str) -> str:
  """The block the SRD teacher reads (rl.srd.template of `way`'s episode_text), as rlkit/train/srd.py writes it."""
  from rlkit.train.srd import episode_text
  c = get_config("srd")
  return c.rl.srd.template.format(hindsight=episode_text(_with_episode({"answer": way, "layout": {}}), c.rl.srd.field))


def demonstration_rows(rows: list, n_rooms: int, hindsight: bool, kind: str) -> list:
  """SFT rows (JSONL: prompt, answer, solution = the demonstration) of task rows of `n_rooms` rooms; `hindsight`
  puts the block of the row's way after the prompt, as the SRD teacher reads it."""
  from rlkit.agents.keydoor import KeyDoor
  task = KeyDoor(n_rooms=n_rooms, max_actions=max(MAX_ACTIONS, 3 * (n_rooms - 1)))   # the layout says hidden
  return [{"prompt": r["prompt"] + (hindsight_block(r["answer"]) if hindsight else ""), "answer": r["answer"],
           "solution": task.demonstration(r), "kind": kind} for r in rows]


def two_room_rows(split: str, hidden_keys: bool = HIDDEN_KEYS, seed: int = 0) -> list:
  """The 2-room task's rows of `split` (3 train, 1 test) as `world_rows` writes them."""
  from rlkit.agents.keydoor import KeyDoor
  from rlkit.data.splits import generate_splits
  return [{"prompt": r["prompt"], "answer": r["answer"], "layout": json.loads(r["fields"])["layout"]}
          for r in generate_splits(KeyDoor(n_rooms=2, hidden_keys=hidden_keys), 3, 1, seed)[split]]


def sft_rows() -> list:
  """The `sft` preset's rows (configs/srd.py SFT): PLAIN_COPIES copies of the plain demonstrations of 3 of the 4
  two-room layouts (to act), then every layout of the arms' task that no arm plays (`arm_rows`) with the hindsight
  block in the prompt (to read it)."""
  played = {_key(r["layout"]) for r in arm_rows()}
  unseen = [r for r in world_rows() if _key(r["layout"]) not in played]
  return (demonstration_rows(two_room_rows("train"), 2, False, "plain") * PLAIN_COPIES
          + demonstration_rows(unseen, N_ROOMS, True, "hindsight"))


def write_sft_rows(path: str, rows: list = None) -> str:
  """`sft_rows()` (or `rows`) as a JSONL file at `path`; returns `path`. Beside it, `<path>.test.jsonl`: the
  held-out 2-room layout's plain demonstration, the SFT run's one-row evaluation (it exists only because a
  finished run is recognised by its last evaluation, as the arms' one-prompt evaluation)."""
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  for name, out in ((path, sft_rows() if rows is None else rows),
                    (eval_rows_path(path), demonstration_rows(two_room_rows("test"), 2, False, "plain"))):
    with open(name, "w") as f:
      f.writelines(json.dumps(r) + "\n" for r in out)
  return path


def eval_rows_path(rows_path: str) -> str:
  return rows_path[:-len(".jsonl")] + ".test.jsonl" if rows_path.endswith(".jsonl") else rows_path + ".test.jsonl"


def _with_episode(row: dict) -> dict:
  """The row as the hindsight scorer sees it after an episode: its answer, and the environment's summary, whose
  "solution" is the shortest way (KeyDoorEnv.summary), i.e. the answer."""
  return {"answer": row["answer"], "fields": {"layout": row["layout"], "episode": {"solution": row["answer"]}}}


# ---------------------------------------------------------------------------------------------------------------
# G2: does the base read the hindsight?

def hindsight_gain(model_path: str, hidden_keys: bool = HIDDEN_KEYS, rows: list = None,
                   n_rooms: int = N_ROOMS) -> dict:
  """The base scoring every layout's demonstration teacher-forced, as the student (prompt, then the episode) and
  as the SRD teacher (prompt, the hindsight block `rl.srd.template` of the episode's way, then the episode: the
  layout rlkit/train/srd.py's scorer builds), at temperature 1: the mean log-prob per action token (the tokens a
  policy samples; observations are context only) of each, and `gain` = teacher - student, pooled over every
  action token of every layout (nats per token); `layouts_gaining`: the share of layouts whose own mean gain is
  positive. Also (not a gate criterion) `blind_gain`: the mean gain summed over each `blind_take` action's
  tokens (nats an action), over `blind_actions` of them: where the keys are hidden (`hidden_keys`, the task's
  variant), the choices only the hindsight informs. `rows` (worlds of `n_rooms` rooms; default every layout of the
  gate's task, `world_rows`) scores others (the probes' 4-room layouts)."""
  import jax
  import jax.numpy as jnp

  from rlkit.data.pipeline import prompt_batch, token_lengths
  from rlkit.models.tokenizer import bucket_length, pad_left
  from rlkit.rollout.scoring import score_response
  from rlkit.train.models import load_model
  from rlkit.train.srd import episode_text, teacher_prompts
  c = get_config("srd")
  module, params, tok = load_model(model_path, dtype=c.model.dtype, param_dtype=c.model.param_dtype)
  rows = world_rows(hidden_keys=hidden_keys) if rows is None else rows
  records = [{"prompt": r["prompt"], "answer": r["answer"]} for r in rows]
  batch = prompt_batch(records, tok, max(c.data.max_prompt_len, *token_lengths(records, tok)[0]))
  mask = np.asarray(batch["prompt_mask"], bool)
  student = [np.asarray(batch["prompt_tokens"])[i][mask[i]].tolist() for i in range(len(rows))]
  texts = [episode_text(_with_episode(r), c.rl.srd.field) for r in rows]
  teacher, _ = teacher_prompts(np.asarray(batch["prompt_tokens"]), mask, texts, c.rl.srd.template, tok)
  episodes = [[(tok.encode(text), is_act, blind_take(text, r["layout"])) for text, is_act in segments(r, n_rooms)]
              for r in rows]
  width = max(sum(len(ids) for ids, _, _ in e) for e in episodes)
  response = np.full((len(rows), width), tok.pad_id, np.int32)
  attend, acts = np.zeros((len(rows), width), bool), np.zeros((len(rows), width), bool)
  blind = []                                   # (row, token slice) of every blind take
  for i, e in enumerate(episodes):
    at = 0
    for ids, is_act, is_blind in e:
      response[i, at:at + len(ids)], attend[i, at:at + len(ids)], acts[i, at:at + len(ids)] = ids, True, is_act
      blind += [(i, slice(at, at + len(ids)))] if is_blind else []
      at += len(ids)

  forward = jax.jit(lambda p, tokens, attention: score_response(module, p, tokens, attention, width, None))

  def score(prompts) -> np.ndarray:
    prompt, prompt_mask = pad_left(prompts, bucket_length(max(map(len, prompts))), tok.pad_id)
    tokens = jnp.asarray(np.concatenate([prompt, response], 1))
    attention = jnp.asarray(np.concatenate([prompt_mask, attend], 1))
    return np.asarray(forward(params, tokens, attention), np.float64)

  s, t = score(student), score(teacher)
  per_layout = ((t - s) * acts).sum(1) / acts.sum(1)
  per_blind = [float((t - s)[i, span].sum()) for i, span in blind]
  return {"gain": float(((t - s) * acts).sum() / acts.sum()), "student_logp": float((s * acts).sum() / acts.sum()),
          "teacher_logp": float((t * acts).sum() / acts.sum()), "action_tokens": int(acts.sum()),
          "layouts": len(rows), "layouts_gaining": float(np.mean(per_layout > 0)),
          "blind_gain": float(np.mean(per_blind)) if per_blind else math.nan, "blind_actions": len(per_blind)}


# ---------------------------------------------------------------------------------------------------------------
# The gate and the budget.

def gate_measure(paths, model_path: str) -> dict:
  """The gate's numbers, pooled over its runs' training iterations (each a batch of PROMPTS x GROUP episodes of the
  SFT policy, frozen): the success rate (reward/success), the share of zero-variance groups (1 -
  informative_groups), the scorer's srd/gap and srd/zero_variance_frac, turns per episode, invalid actions; the
  median seconds of an iteration, each run's first (which compiles) left out; and `hindsight_gain` of the policy
  at `model_path` on the arms' layouts (`arm_rows`; hindsight_<key>). NaN where no run logged it."""
  train, _, later = pooled_rows(paths)

  def mean(key):
    values = [r[key] for r in train if key in r]
    return float(np.mean(values)) if values else math.nan
  turns, episodes = (sum(r.get(k, 0) for r in train) for k in ("collect/turns", "collect/episodes"))
  measured = {"success": mean(SUCCESS), "zero_variance_share": 1.0 - mean("informative_groups"),
              "srd_gap": mean("srd/gap"), "srd_zero_variance_frac": mean("srd/zero_variance_frac"),
              "turns_per_episode": turns / episodes if episodes else math.nan,
              "invalid_actions": mean("reward/invalid_actions"), "iterations": len(train),
              "iteration_s": float(np.median(later)) if later else math.nan}
  measured.update({f"hindsight_{k}": v for k, v in hindsight_gain(model_path, rows=arm_rows()).items()})
  return measured


def gate_checks(measured: dict) -> list:
  """G1-G3 (configs/srd.py GATE, README "Third design"); a value that was not measured is NaN and fails."""
  return [check("G1 success rate of the SFT policy (mean reward/success)", measured.get("success", math.nan),
                high=GATE["success_max"]),
          check("G2 hindsight gain on the blind takes of the arms' layouts (nats an action)",
                measured.get("hindsight_blind_gain", math.nan), low=GATE["blind_gain_min"]),
          check("G3 policy turns per episode", measured.get("turns_per_episode", math.nan), low=GATE["turns_min"])]


def budget(root: str, iteration_s: float, steps: int = STEPS) -> dict:
  """The whole set's projected wall in minutes (the gate's runs as measured, plus every arm of GATE["seeds"], each
  as long as a gate run plus its extra iterations at `iteration_s`, the gate's, whose scorer runs the SRD teacher:
  an upper bound for the grpo arm, and its extra checkpoints at CHECKPOINT_S) and the largest STEPS, a multiple of
  WINDOW, that fits BUDGET_MINUTES (experiments/gate.py's `budget_projection`)."""
  def extra_s(n: int) -> float:
    return (math.ceil(n / WINDOW) - 1) * CHECKPOINT_S
  return budget_projection(root, gate_paths(root), len(ARMS) * len(GATE["seeds"]), GATE["steps"], iteration_s, steps,
                           BUDGET_MINUTES, WINDOW, extra_s=extra_s, max_steps=STEPS)


def main(argv=None, launch_fn=None) -> int:
  launch_fn = launch_fn or launch          # looked up at call time (tests patch the module's launch)
  own = argparse.ArgumentParser(add_help=False)
  own.add_argument("--model", default="")
  own.add_argument("--sizes", action="store_true")
  flags, rest = own.parse_known_args(argv)
  if flags.sizes:
    from rlkit.train.models import tokenizer_from_spec
    print(token_sizes(tokenizer_from_spec({"kind": "hf", "path": flags.model or BASE_MODEL})))
    return 0
  args = parse_driver_args(__doc__, "/tmp/srd", ARMS, ARCHIVE, rest, budget=True)
  use_compilation_cache(args.root)
  rev = commit()
  sft = os.path.join(args.root, "sft_s0")
  rows = os.path.join(args.root, "sft_rows.jsonl")
  if not args.dry_run:
    write_sft_rows(rows)
  if launch_fn(args.root, sft, f"{CONFIG}:sft", ["--config.seed=0", f"--config.data.train_jsonl={rows}",
                                                 f"--config.data.test_jsonl={eval_rows_path(rows)}",
                                                 *([f"--config.model.path={flags.model}"] if flags.model else [])],
               args.lock, args.dry_run, TAG, name="sft", seed=0, commit=rev):
    return report(TAG, [sft])
  return gate_then_arms(args, tag=TAG, config=CONFIG, gate_seeds=GATE["seeds"], gate_paths=gate_paths(args.root),
                        measure=lambda paths: gate_measure(paths, sft), checks=gate_checks, budget=budget,
                        steps=STEPS, arm_runs=len(ARMS) * len(GATE["seeds"]), budget_minutes=BUDGET_MINUTES,
                        keys=ARCHIVE_KEYS, extra=[f"--config.model.path={sft}"], ignore_budget=args.ignore_budget,
                        launch_fn=launch_fn, rev=rev)


if __name__ == "__main__":
  sys.exit(main())
