"""Driver of experiments/prorubric: the base policy per seed (SFT from the pretrained base), the calibration gate on
it, then every arm from its seed's checkpoint; the archive.

  python experiments/prorubric/run.py --root=/tmp/prorubric                 # 3 seeds: SFT, gate, 7 arms, archive
  python experiments/prorubric/run.py --root=DIR --arms=                    # the SFT runs and the gate only
  python experiments/prorubric/run.py --root=DIR --dry_run                  # print the commands only
  python experiments/prorubric/summarize.py --root=experiments/prorubric/runs   # the tables, from the archive

1. `configs/prorubric.py:sft` per seed into DIR/sft_s<seed>. 2. The calibration gate (`gate_checks`, README
"Calibration gate") on each seed's SFT policy: its greedy decision hit rate (its own final evaluation) and the
share of its samples (held-out sums) that outscore the bare right answer under the additive score at W = 1.0, at
temperature 1 and, failing that, 1.5; written to DIR/gate.json. If it fails, no arm runs and the driver exits
GATE_FAILED (2) after archiving what ran. 3. Every arm into DIR/<arm>_s<seed>, from DIR/sft_s<seed> with the same
seed, sampling at the gate's temperature (`rl.temperature`). 4. The archive
(experiments/archive.py; `--archive`, default experiments/prorubric/runs, '' for none, e.g. a smoke run): each
finished workdir's config.json and its metrics cut to KEYS, DIR/gate.json and the wall records.

Each run is one `launch.py` subprocess; finished workdirs are skipped, unfinished ones resumed
(experiments/driver.py); DIR/runs.jsonl gets each command's wall time. `--lock=PATH` runs every launch under
`flock PATH`. `--base=PATH` replaces the pretrained base the SFT runs start from (e.g. a stand-in for a smoke run).
"""
import argparse
import dataclasses
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.prorubric import ARMS, BASE, GATE, get_config  # noqa: E402
from experiments.gate import check, parse_driver_args, sft_gate_arms  # noqa: E402

CONFIG = "configs/prorubric.py"
ARCHIVE = "experiments/prorubric/runs"
# What summarize.py reads of a workdir (experiments/archive.py keys: a key ending in "/" is a prefix).
KEYS = ["stage", "step", "step_s", "at_stage_start", "eval/", "reward", "reward/", "accuracy", "response_len"]


def outscoring_share(task, examples, completions, w: float) -> float:
  """The share of `completions` (lists, one completion per example each) whose additive rubric score with advice
  points `w` beats the bare right answer's to the same prompt: a pile of digits or padding after the answer, what
  RL under additive scoring can reinforce."""
  task = dataclasses.replace(task, advice_points=w)
  bare = [task.eval_counts(e, e["answer"])["rubric/additive"] for e in examples]
  wins = [task.eval_counts(e, c)["rubric/additive"] > b + 1e-9
          for sample in completions for e, c, b in zip(examples, sample, bare)]
  return float(np.mean(wins))


def measure(sft: str, seed: int) -> dict:
  """The gate's numbers of one seed's SFT policy: greedy (its final evaluation, and the base's before its first
  step) and sampled (GATE["samples"] completions of each held-out sum within the arms' completion budget, at each
  of GATE["temperatures"]; the other sampled numbers at the first)."""
  from experiments.held_out import sample_held_out, start_and_end
  start, end = start_and_end(sft)
  task, examples, by_t = sample_held_out(sft, get_config("additive_w1.0").rl.max_new_tokens, samples=GATE["samples"],
                                         seed=seed, temperatures=GATE["temperatures"])
  first = by_t[GATE["temperatures"][0]]
  counts = [task.eval_counts(e, c) for sample in first for e, c in zip(examples, sample)]
  return {"accuracy": end["eval/accuracy"], "clean": end.get("eval/rubric/clean", np.nan),
          "base_accuracy": start.get("eval/accuracy", np.nan),
          **{f"outscoring_t{t}": outscoring_share(task, examples, by_t[t], GATE["pile_w"]) for t in by_t},
          "sampled_accuracy": float(np.mean([task.verify(c, e["answer"]) for sample in first
                                             for e, c in zip(examples, sample)])),
          "sampled_padded": float(np.mean([c["rubric/padded"] for c in counts])),
          "sampled_advice_met": float(np.mean([c["rubric/advice_met"] for c in counts]))}


def gate_checks(measured: dict) -> tuple[list, bool, float]:
  """The README's gate on every seed's measured numbers ({seed: `measure`'s dict}): (checks, passed, the arms'
  sampling temperature: the first of GATE["temperatures"] at which every seed's samples outscore often enough;
  None when none does)."""
  checks = [check(f"s{seed}: SFT decision hit rate (greedy)", m["accuracy"], low=GATE["min_accuracy"])
            for seed, m in measured.items()]
  temperature = None
  for t in GATE["temperatures"]:
    at_t = [check(f"s{seed}: samples outscoring the bare right answer (additive, W = {GATE['pile_w']}, T = {t})",
                  m[f"outscoring_t{t}"], low=GATE["min_outscoring"]) for seed, m in measured.items()]
    checks += at_t
    if all(c.passed for c in at_t):
      temperature = t
      break
  return checks, all(c.passed for c in checks[:len(measured)]) and temperature is not None, temperature


def main(argv=None, measure_fn=measure) -> int:
  p = argparse.ArgumentParser(add_help=False)
  p.add_argument("--base", default=BASE)
  known, rest = p.parse_known_args(argv)
  args = parse_driver_args(__doc__, "/tmp/prorubric", ARMS, ARCHIVE, rest)

  def gate(measured):
    checks, passed, temperature = gate_checks(measured)
    return checks, passed, {"temperature": temperature}
  # Every arm samples at the gate's temperature (on a dry run, the first).
  return sft_gate_arms("prorubric", args, CONFIG, KEYS, known.base, measure_fn, gate,
                       lambda arm, sft, extra: [f"--config.rl.temperature={extra['temperature']}"])


if __name__ == "__main__":
  sys.exit(main())
