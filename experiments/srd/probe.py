"""Format-SFT probes for srd's next pre-registration (not pre-registered runs).

Round 1-2 (`sft2`, `sft2_long`): the base never writes an `<act>` turn on the key-door task (the gate's episodes
were all one action-less turn), so does a short SFT on 2-room layouts' demonstrations (act, observation, act, ...)
make it act on the experiment's 3-room layouts? It does (2.8 turns an episode), but the SFT model no longer reads
the hindsight block (G2 negative; probe_runs/README.md).

Round 4 (`sft_read`): the SFT also teaches reading the block. Its rows (a JSONL file, `write_rows`): the plain
2-room demonstrations as before (the student's format: prompt, then the episode), and hindsight-conditioned
4-room demonstrations (the teacher's format: prompt, the block `<hindsight>The way was: W</hindsight>\n`, then
the episode). 4-room layouts because there the prompt shows room 0 only, so the way is in the block and nowhere
else before the episode; and because the arms never see them (they play 3-room layouts, which no SFT row holds).

  python launch.py --config=experiments/srd/probe.py:sft2 --workdir=/tmp/srd_probe/sft2
  python experiments/srd/probe.py --rows=/tmp/srd_probe/read.jsonl          # writes sft_read's rows
  python launch.py --config=experiments/srd/probe.py:sft_read --workdir=/tmp/srd_probe/sft_read \
      --config.data.train_jsonl=/tmp/srd_probe/read.jsonl
  python launch.py --config=experiments/srd/probe.py:sft_turns ...          # round 5: the same, turn by turn
  python experiments/srd/probe.py --rows=R/hidden.jsonl --hidden           # round 7: rooms hide key colours
  python -c "from experiments.srd.probe import reading_check; print(reading_check('R/sft_hidden', True))"
  python launch.py --config=configs/srd.py:gate --workdir=/tmp/srd_probe/gate_s0 --config.seed=0 \
      --config.model.path=/tmp/srd_probe/sft2          # the gate's frozen 3-room episodes from the SFT model

2 rooms have 4 layouts (one door, its key in room 0): 3 train, 1 held out; PRESETS' steps of SFT_BATCH rows.
"""
import argparse
import os
import sys

import numpy as np

if __name__ == "__main__":
  sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from configs import srd  # noqa: E402
from rlkit.train.config import sft_defaults  # noqa: E402

SFT_BATCH = 16
# preset -> (SFT steps, peak learning rate, max_len); round 2 (`sft2_long`) after round 1's loss stayed at 2.8
# nats a token; round 4 (`sft_read`) with the hindsight rows (the longest row: 4-room prompt, block and
# demonstration, 823 tokens with BOS and EOS)
PRESETS = {"sft2": (60, 3e-4, 320), "sft2_long": (240, 1e-3, 320), "sft_read": (240, 1e-3, 832),
           "sft_turns": (240, 1e-3, 864), "sft_hidden": (240, 1e-3, 864)}
# Round 7 (`sft_hidden`): sft_turns on the hidden-keys variant's rows (`--hidden`): rooms show no key colours
# Round 5 (`sft_turns`): sft_read with every turn encoded apart (sft.turn_pattern), as the collector lays an
# episode out and the SRD teacher its block; round 4's whole-string encoding merged tokens across those boundaries
# (an act followed by its observation: the prompt's "Act with <act>go east</act>, ..." stays whole, as the
# collector encodes the prompt)
TURNS = "<act>[^<]*</act>(?=<obs>)|<hindsight>[^<]*</hindsight>\n"
READ_ROOMS, READ_ACTIONS = 4, 9    # the hindsight rows' layouts: 4 rooms, the shortest way's 9 actions
READ_LAYOUTS = 120                 # of the 144 4-room layouts (the other 24 held out)
PLAIN_COPIES = 40                  # each plain 2-room row repeated: 120 plain rows beside 120 hindsight rows


def get_config(arg=None):
  if arg not in PRESETS:
    raise ValueError(f"Unknown preset {arg!r} for the srd probe; choose one of {', '.join(PRESETS)}.")
  c = srd.get_config("grpo")
  c.stages = ("sft",)
  c.task.kwargs.update(n_rooms=2, max_actions=8, hidden_keys=False)   # the first design's task, on 2 rooms
  c.data.num_train, c.data.num_test = 3, 1
  c.sft = s = sft_defaults()
  s.steps, s.optimizer.lr, s.max_len = PRESETS[arg]
  s.batch_size, s.optimizer.warmup_steps, s.optimizer.schedule = SFT_BATCH, 5, "cosine"
  c.checkpoint.every = 0
  if arg in ("sft_read", "sft_turns", "sft_hidden"):   # rows from `write_rows`, as --config.data.train_jsonl
    c.task.name, c.task.kwargs = "jsonl", {}
    c.data.max_prompt_len = 0        # derived from the rows (the longest hindsight prompt: 318 tokens)
  if arg in ("sft_turns", "sft_hidden"):
    s.turn_pattern = TURNS
  return c


def read_rows(seed: int = 0, hidden_keys: bool = False) -> list:
  """`sft_read`'s rows: PLAIN_COPIES copies of each of the 3 training 2-room layouts' plain demonstrations (the
  2-room split of `sft2`), then READ_LAYOUTS 4-room layouts (a seeded shuffle) with the block in the prompt;
  `hidden_keys`: the task's variant whose rooms show no key colours (`sft_hidden`)."""
  from experiments.srd.run import demonstration_rows, two_room_rows, world_rows
  two = two_room_rows("train", hidden_keys, seed)
  four = world_rows(READ_ROOMS, READ_ACTIONS, hidden_keys=hidden_keys)
  chosen = [four[i] for i in np.random.default_rng(seed).permutation(len(four))[:READ_LAYOUTS]]
  return (demonstration_rows(two, 2, False, "plain") * PLAIN_COPIES
          + demonstration_rows(chosen, READ_ROOMS, True, "hindsight"))


def reading_check(model_path: str, hidden_keys: bool, seed: int = 0) -> dict:
  """`hindsight_gain` (G2's scoring, with `blind_gain`) of `model_path` on the 4-room layouts the reading rows
  hold (the first 24 of them) and on those they left out (the other 24), beside the arms' 3-room layouts: does
  the model read the block, or recall the ways it was trained on?"""
  from experiments.srd.run import hindsight_gain, world_rows
  four = world_rows(READ_ROOMS, READ_ACTIONS, hidden_keys=hidden_keys)
  order = np.random.default_rng(seed).permutation(len(four))
  return {"4-room, trained": hindsight_gain(model_path, hidden_keys, [four[i] for i in order[:24]], READ_ROOMS),
          "4-room, held out": hindsight_gain(model_path, hidden_keys, [four[i] for i in order[READ_LAYOUTS:]],
                                             READ_ROOMS),
          "3-room": hindsight_gain(model_path, hidden_keys, world_rows(3, 8, hidden_keys=hidden_keys), 3)}


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--rows", required=True, help="the JSONL file to write sft_read's rows to")
  parser.add_argument("--hidden", action="store_true", help="the hidden-keys variant's rows (sft_hidden)")
  args = parser.parse_args()
  from experiments.srd.run import write_sft_rows
  print(f"wrote {write_sft_rows(args.rows, read_rows(hidden_keys=args.hidden))}")
