"""Pre-registered predictions judged seed by seed and overall, as markdown (experiments/prorubric and
experiments/calif): each seed's final values are {run: {metric key: value}} (the SFT policy as "sft", each arm
by name); a prediction says whether it holds in one seed and, from every seed's values and those per-seed
outcomes, whether it is supported overall. A run a prediction reads that a seed lacks makes that seed "-".
"""
import os
from typing import Callable, NamedTuple

import numpy as np

from experiments.driver import last_eval


class Prediction(NamedTuple):
  name: str                                        # "P1"
  claim: str                                       # what it says, in a few words
  holds: Callable[[dict], bool]                    # one seed's final values -> holds in that seed
  overall: Callable[[list, list], bool]            # (every seed's values, their `holds`) -> supported
  rule: str                                        # the overall rule, in words


def final_values(root: str, runs, seeds) -> dict:
  """{seed: {run: its last evaluation}} for the workdirs ROOT/<run>_s<seed> that have one."""
  out = {}
  for seed in seeds:
    for run in runs:
      e = last_eval(os.path.join(root, f"{run}_s{seed}"))
      if e:
        out.setdefault(seed, {})[run] = e
  return out


def final_table(by_seed: dict, runs, key: str) -> list:
  """Markdown lines: one metric's final value per seed (rows) and run (columns, in the order of `runs`)."""
  lines = ["| seed | " + " | ".join(runs) + " |", "|---|" + "---|" * len(runs)]
  for seed, v in sorted(by_seed.items()):
    lines.append(f"| {seed} | " + " | ".join(f"{v[r][key]:.3f}" if r in v and key in v[r] else "-" for r in runs)
                 + " |")
  return lines


def mean_of(values: list, run: str, key: str) -> float:
  """The mean over seeds of one run's final `key`."""
  return float(np.mean([v[run][key] for v in values]))


def at_least(count: int) -> Callable[[list, list], bool]:
  """An overall rule: the prediction holds in at least `count` seeds."""
  return lambda values, holds: sum(holds) >= count


def verdict_table(predictions, by_seed: dict) -> list:
  """Markdown lines: one row per prediction, its outcome in each seed (yes / no / -) and overall (supported, not
  supported, or "-" when some seed lacks a run it reads)."""
  seeds = sorted(by_seed)
  lines = ["| prediction | " + " | ".join(f"seed {s}" for s in seeds) + " | overall | rule |",
           "|---|" + "---|" * (len(seeds) + 2)]
  for p in predictions:
    holds = {}
    for seed in seeds:
      try:
        holds[seed] = bool(p.holds(by_seed[seed]))
      except KeyError:                             # a run this prediction reads did not run in this seed
        holds[seed] = None
    cells = ["-" if holds[s] is None else ("yes" if holds[s] else "no") for s in seeds]
    if not seeds or any(h is None for h in holds.values()):
      overall = "-"
    else:
      overall = "supported" if p.overall([by_seed[s] for s in seeds], [holds[s] for s in seeds]) else "not supported"
    lines.append(f"| {p.name}: {p.claim} | " + " | ".join(cells) + f" | **{overall}** | {p.rule} |")
  return lines
