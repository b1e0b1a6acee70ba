"""Driver of experiments/calif: the base policy per seed (SFT from the pretrained base), the calibration gate on it,
then every arm from its seed's checkpoint; the archive.

  python experiments/calif/run.py --root=/tmp/calif                       # 3 seeds: SFT, gate, 4 arms, archive
  python experiments/calif/run.py --root=DIR --arms=                      # the SFT runs and the gate only
  python experiments/calif/run.py --root=DIR --dry_run                    # print the commands only
  python experiments/calif/summarize.py --root=experiments/calif/runs     # the tables, from the archive

1. `configs/calif.py:sft` per seed into DIR/sft_s<seed>. 2. The calibration gate (`gate_checks`, README
"Calibration gate") on each seed's SFT policy: its greedy accuracy and instruction-following rate (its own final
evaluation) and its following rate when sampled at temperature 1 on the held-out prompts; written to
DIR/gate.json. If it fails, no arm runs and the driver exits GATE_FAILED (2) after archiving what ran. 3. Every arm
into DIR/<arm>_s<seed>, from DIR/sft_s<seed> with the same seed; the `calif` arm also gets it as its frozen
reference (`models.reference.path`). 4. The archive (experiments/archive.py; `--archive`, default
experiments/calif/runs, '' for none, e.g. a smoke run): each finished workdir's config.json and its metrics cut to
KEYS, DIR/gate.json and the wall records.

Each run is one `launch.py` subprocess; finished workdirs are skipped, unfinished ones resumed
(experiments/driver.py); DIR/runs.jsonl gets each command's wall time. `--lock=PATH` runs every launch under
`flock PATH`. `--base=PATH` replaces the pretrained base the SFT runs start from (e.g. a stand-in for a smoke run).
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.calif import ARMS, BASE, GATE, get_config  # noqa: E402
from experiments.gate import check, parse_driver_args, sft_gate_arms  # noqa: E402

CONFIG = "configs/calif.py"
ARCHIVE = "experiments/calif/runs"
# What summarize.py reads of a workdir (experiments/archive.py keys: a key ending in "/" is a prefix).
KEYS = ["stage", "step", "step_s", "at_stage_start", "eval/", "reward", "reward/", "accuracy", "response_len"]


def reference(arm: str, sft: str) -> list:
  """The `calif` arm's frozen reference: its seed's SFT policy."""
  return [f"--config.models.reference.path={sft}"] if arm == "calif" else []


def measure(sft: str, seed: int) -> dict:
  """The gate's numbers of one seed's SFT policy: greedy (its final evaluation, and the base's before its first
  step) and sampled (GATE["samples"] completions of each held-out prompt at temperature 1 within the arms'
  completion budget)."""
  from experiments.held_out import sample_held_out, start_and_end
  start, end = start_and_end(sft)
  task, examples, by_t = sample_held_out(sft, get_config("constraints").rl.max_new_tokens, samples=GATE["samples"],
                                         seed=seed)
  completions = by_t[1.0]
  counts = [task.eval_counts(e, c) for sample in completions for e, c in zip(examples, sample)]
  return {"accuracy": end["eval/accuracy"], "follow": end.get("eval/constraint/satisfied", np.nan),
          "base_accuracy": start.get("eval/accuracy", np.nan),
          "base_follow": start.get("eval/constraint/satisfied", np.nan),
          "sampled_follow": float(np.mean([c["constraint/satisfied"] for c in counts])),
          "sampled_accuracy": float(np.mean([task.verify(c, e["answer"]) for sample in completions
                                             for e, c in zip(examples, sample)])),
          "sampled_both": float(np.mean([c["constraint/both"] for c in counts]))}


def gate_checks(measured: dict) -> list:
  """The README's gate on every seed's measured numbers ({seed: `measure`'s dict})."""
  low, high = GATE["follow"]
  checks = []
  for seed, m in measured.items():
    checks += [check(f"s{seed}: SFT accuracy (greedy)", m["accuracy"], low=GATE["min_accuracy"]),
               check(f"s{seed}: SFT following rate (greedy)", m["follow"], high=GATE["max_greedy_follow"]),
               check(f"s{seed}: SFT following rate (sampled)", m["sampled_follow"], low=low, high=high)]
  return checks


def main(argv=None, measure_fn=measure) -> int:
  p = argparse.ArgumentParser(add_help=False)
  p.add_argument("--base", default=BASE)
  known, rest = p.parse_known_args(argv)
  args = parse_driver_args(__doc__, "/tmp/calif", ARMS, ARCHIVE, rest)
  return sft_gate_arms("calif", args, CONFIG, KEYS, known.base, measure_fn,
                       lambda measured: (gate_checks(measured), None, {}),
                       lambda arm, sft, extra: reference(arm, sft))


if __name__ == "__main__":
  sys.exit(main())
