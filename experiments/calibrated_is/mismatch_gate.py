"""calibrated_is's calibration gate (README.md, fixed before any run): does the base give the test what it needs?

The gate reads the trainer's own metrics of two short GRPO runs from the base (configs/calibrated_is.py, presets
bf16 and fp8: the sampler on that weight copy; ROOT/gate_<copy>/metrics.jsonl), iterations 1 to ITERATIONS:

  capability  the mean training `reward` (temperature 1, verifier) within REWARD and the mean
              `informative_groups` (fraction of groups whose rewards differ) at least MIN_INFORMATIVE, pooled
              over both runs: otherwise GRPO's group advantages are mostly 0 and g* is mostly noise.
  mismatch    per copy, the mean of `mismatch/mean` (|trainer old_logp - sampler logp| over the policy's response
              tokens) at least MIN_MISMATCH: below it the corrections' weights are all within a few percent of 1 and
              any comparison of them ends in a tie that means nothing.

A copy passes if capability passes and its mismatch does; the arms run on the passing copies only, and on none
(the driver stops, saying so) when capability fails or no copy passes. `evaluate` is a pure function of the
metric rows; `checks` states it as experiments/gate.py's checks, which the driver records in ROOT/gate.json
(with the outcome's details), and summarize.py recomputes the outcome from the archived metrics.
"""
import json
import os

import numpy as np

from experiments.gate import check

ITERATIONS = 3
REWARD = (0.05, 0.95)
MIN_INFORMATIVE = 0.25
MIN_MISMATCH = 0.03
# What the archive keeps of a gate run's metrics.jsonl (experiments/archive.py keys; "x/" keeps the prefix).
KEYS = ["stage", "step", "reward", "informative_groups", "response_len", "mismatch/", "rollout_corr/", "eval/",
        "sync/committed", "step_s", "sample_s", "update_s"]
REPORTED = ("mismatch/mean", "mismatch/max", "rollout_corr/kl", "rollout_corr/k3_kl",
            "rollout_corr/rollout_is_ratio_fraction_high", "reward", "informative_groups")


def read_rows(path: str) -> list:
  """The rows of a workdir's metrics.jsonl ([] when it has none)."""
  try:
    with open(os.path.join(path, "metrics.jsonl")) as f:
      return [json.loads(line) for line in f if line.strip()]
  except OSError:
    return []


def first_iterations(rows: list) -> list:
  """The training rows of RL iterations 1..ITERATIONS (those that logged the mismatch)."""
  return [r for r in rows if "mismatch/mean" in r and 1 <= r.get("step", 0) <= ITERATIONS]


def _mean(rows, key):
  vals = [r[key] for r in rows if key in r]
  return float(np.mean(vals)) if vals else float("nan")


def evaluate(rows_by_copy: dict) -> dict:
  """The gate's outcome from {copy: metrics rows of its gate run} (module docstring): {"capability": {...,
  "pass"}, "copies": {copy: {the REPORTED means, "eval_accuracy", "iterations", "pass"}}, "arms_copies": the
  copies the arms run on, "passed": whether any does, "rule": the thresholds}."""
  copies, pooled = {}, []
  for copy, rows in rows_by_copy.items():
    first = first_iterations(rows)
    pooled += first
    evals = [r["eval/accuracy"] for r in rows if "eval/accuracy" in r]
    copies[copy] = {"iterations": len(first), **{k: _mean(first, k) for k in REPORTED},
                    "eval_accuracy": evals[-1] if evals else float("nan")}
  reward, informative = _mean(pooled, "reward"), _mean(pooled, "informative_groups")
  complete = bool(copies) and all(c["iterations"] == ITERATIONS for c in copies.values())
  capability = {"reward": reward, "informative_groups": informative, "complete": complete,
                "pass": complete and REWARD[0] <= reward <= REWARD[1] and informative >= MIN_INFORMATIVE}
  for c in copies.values():
    c["pass"] = capability["pass"] and c["mismatch/mean"] >= MIN_MISMATCH
  arms = [copy for copy, c in copies.items() if c["pass"]]
  return {"capability": capability, "copies": copies, "arms_copies": arms, "passed": bool(arms),
          "rule": {"iterations": ITERATIONS, "reward": list(REWARD), "min_informative": MIN_INFORMATIVE,
                   "min_mismatch": MIN_MISMATCH}}


def checks(outcome: dict) -> list:
  """The outcome's criteria as experiments/gate.py checks: capability (both), then each copy's mismatch. The gate
  passes when capability does and at least one copy does (not when every check does)."""
  cap = outcome["capability"]
  out = [check(f"capability: mean reward, iterations 1-{ITERATIONS} (pooled)", cap["reward"], *REWARD),
         check("capability: informative groups (pooled)", cap["informative_groups"], low=MIN_INFORMATIVE),
         check(f"capability: iterations logged (of {ITERATIONS} per copy)",
               min([c["iterations"] for c in outcome["copies"].values()] or [0]), low=ITERATIONS)]
  out += [check(f"{copy} copy: trainer's mismatch/mean", c["mismatch/mean"], low=MIN_MISMATCH)
          for copy, c in outcome["copies"].items()]
  return out
