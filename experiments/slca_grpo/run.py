"""Driver of experiments/slca_grpo: the calibration gate, the budget check, then every arm of every seed from the
base, then the archive.

  python experiments/slca_grpo/run.py --root=/tmp/slca_grpo                   # gate, 3 seeds x 6 arms, archive
  python experiments/slca_grpo/run.py --root=DIR --seeds=0 --arms=grpo_n1.5,slca_n1.5
  python experiments/slca_grpo/run.py --root=DIR --dry_run                    # print the commands only
  python experiments/slca_grpo/summarize.py --out=experiments/slca_grpo      # results.md and the plot

Besides the shared flags (--root, --seeds, --arms, --lock, --dry_run, --archive: experiments/gate.py),
--model=PATH starts every run from that base instead of experiments/base/model (a smoke run on a stand-in), and
--ignore_budget runs the arms even when the gate's timing projects them past the budget.

1. The gate (README "Calibration gate"): `configs/slca_grpo.py:gate` into DIR/gate_s<seed> for each of
   GATE["seeds"] (whatever --seeds says: the gate is pooled over those), then `gate_checks` of their training rows
   pooled, recorded in DIR/gate.json with the measured numbers and the budget projection (experiments/gate.py).
   A failed gate stops the driver before any arm (exit GATE_FAILED), after archiving the gate's runs.
2. The budget (README "Budget"): the gate's wall times and iteration times project the whole set (the gate and
   every arm of GATE["seeds"]); past BUDGET_MINUTES the driver stops before any arm (exit BUDGET_EXCEEDED) and
   prints the STEPS that would fit: the README's rule is to lower STEPS, record the change, and rerun.
3. The arms: `configs/slca_grpo.py:<arm>` into DIR/<arm>_s<seed>, seed by seed.
4. The archive (`--archive`, default experiments/slca_grpo/runs; '' none): each finished workdir's config.json and
   its metrics cut to what summarize.py reads (`ARCHIVE_KEYS`), the wall records (each with the commit it ran
   at), and gate.json.

Finished workdirs are skipped, unfinished ones resumed (experiments/driver.py); DIR/runs.jsonl gets each
command's wall time and commit. Every launch shares one persistent XLA compilation cache, DIR/jax_cache
(unless JAX_COMPILATION_CACHE_DIR is set).
"""
import argparse
import math
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks._common import commit  # noqa: E402
from configs.slca_grpo import ARMS, BUDGET_MINUTES, EVAL_EVERY, GATE, STEPS, WINDOW  # noqa: E402
from experiments.driver import command_walls, finished, launch, report  # noqa: E402
from experiments.gate import GATE_FAILED, archive_with_gate, check, parse_driver_args, record_gate  # noqa: E402
from experiments.slca_grpo.summarize import ARCHIVE_KEYS, CALL, SUMMARY_RULE  # noqa: E402

CONFIG = "configs/slca_grpo.py"
TAG = "slca_grpo"
ARCHIVE = os.path.join("experiments", "slca_grpo", "runs")
BUDGET_EXCEEDED = 3      # the exit status when the gate's timing projects the set past BUDGET_MINUTES
EVAL_S = 5.0             # an arm's evaluation (500 prompts) and checkpoint beyond the gate's two, in seconds: an
                         # estimate from the base's figures (README "Budget"), as the runs do not log it


def gate_paths(root: str) -> list:
  return [os.path.join(root, f"gate_s{seed}") for seed in GATE["seeds"]]


def gate_measure(paths) -> dict:
  """The gate's numbers, pooled over its runs' training iterations (each a batch of PROMPTS x GROUP episodes of
  the base, frozen): mean call accuracy (reward/execution), summary rule rate (reward/summary_rule), the judge's
  score, penalty and informative groups; the base's held-out greedy call accuracy (its start evaluations); the
  median seconds of an iteration, each run's first (which compiles) left out. NaN where no run logged it."""
  from rlkit.train.metrics import read_metrics
  from rlkit.train.stages import AT_STAGE_START
  train, starts, later = [], [], []
  for path in paths:
    rows = read_metrics(os.path.join(path, "metrics.jsonl"))
    its = [r for r in rows if "step_s" in r]
    train += its
    later += [r["step_s"] for r in its[1:]]
    starts += [r["eval/accuracy"] for r in rows if r.get(AT_STAGE_START) and "eval/accuracy" in r]

  def mean(key):
    values = [r[key] for r in train if key in r]
    return float(np.mean(values)) if values else math.nan
  return {"call_accuracy": mean(CALL), "summary_rule": mean(SUMMARY_RULE), "judge_score": mean("reward/summary"),
          "penalty": mean("reward/penalty"), "informative_groups": mean("informative_groups"),
          "iterations": len(train), "base_eval_accuracy": float(np.mean(starts)) if starts else math.nan,
          "iteration_s": float(np.median(later)) if later else math.nan}


def gate_checks(measured: dict) -> list:
  """G1-G2 (configs/slca_grpo.py GATE, README "Calibration gate"); a value the runs did not log is NaN and fails."""
  return [check("G1 call accuracy of the base (mean reward/execution)", measured.get("call_accuracy", math.nan),
                low=GATE["call_low"], high=GATE["call_high"]),
          check("G2 summary rule rate of the base (mean reward/summary_rule)", measured.get("summary_rule", math.nan),
                low=GATE["summary_min"])]


def budget(root: str, iteration_s: float, steps: int = STEPS) -> dict:
  """The whole set's projected wall in minutes (the gate's runs as measured, plus every arm of GATE["seeds"], each
  as long as a gate run plus its extra iterations at `iteration_s` and its extra evaluations at EVAL_S) and the
  largest STEPS, a multiple of WINDOW, that fits BUDGET_MINUTES (0: not even 2 x WINDOW fits; None: not measured,
  a gate run has no wall record or no iteration time)."""
  walls = command_walls(root)
  gate = [walls.get(path, math.nan) for path in gate_paths(root)]
  runs = len(ARMS) * len(GATE["seeds"])

  def minutes(n: int) -> float:
    extra_evals = math.ceil(n / EVAL_EVERY) - 1           # an arm evaluates at its start, every EVAL_EVERY, its end
    arm = float(np.mean(gate)) + (n - GATE["steps"]) * iteration_s + extra_evals * EVAL_S
    return (sum(gate) + runs * arm) / 60.0

  fit = None
  if math.isfinite(minutes(STEPS)):
    fit = 0
    while fit < 100 * STEPS and minutes(fit + WINDOW) <= BUDGET_MINUTES:
      fit += WINDOW
    fit = fit if fit >= 2 * WINDOW else 0               # the verdicts need a first and a last window apart
  return {"minutes": minutes(steps), "budget_minutes": BUDGET_MINUTES, "steps": steps, "iteration_s": iteration_s,
          "steps_that_fit": fit}


def main(argv=None) -> int:
  own = argparse.ArgumentParser(add_help=False)
  own.add_argument("--model", default="")
  own.add_argument("--ignore_budget", action="store_true")
  flags, rest = own.parse_known_args(argv)
  args = parse_driver_args(__doc__, "/tmp/slca_grpo", ARMS, ARCHIVE, rest)
  extra = [f"--config.model.path={flags.model}"] if flags.model else []
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(args.root, "jax_cache"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))     # a size limit turns on its file lock
  rev = commit()
  failed = []

  def run(path, preset, seed, name):
    if launch(args.root, path, f"{CONFIG}:{preset}", [f"--config.seed={seed}", *extra], args.lock, args.dry_run,
              TAG, name=name, seed=seed, commit=rev):
      failed.append(path)

  for seed, path in zip(GATE["seeds"], gate_paths(args.root)):
    run(path, "gate", seed, "gate")
  if failed:
    return finish(args, failed)
  if args.dry_run:
    print(f"[{TAG}] dry run: the gate and the budget are checked here", flush=True)
  elif not all(finished(path) for path in gate_paths(args.root)):
    return finish(args, [path for path in gate_paths(args.root) if not finished(path)])
  else:
    measured = gate_measure(gate_paths(args.root))
    projection = budget(args.root, measured["iteration_s"])
    if not record_gate(args.root, TAG, gate_checks(measured), measured=measured, budget=projection):
      finish(args, [])
      return GATE_FAILED
    print(f"[{TAG}] budget: the gate and {len(ARMS) * len(GATE['seeds'])} arm runs of {STEPS} iterations "
          f"(~{projection['iteration_s']:.2f} s each) project to {projection['minutes']:.0f} of {BUDGET_MINUTES} "
          f"minutes; STEPS that fit: {projection['steps_that_fit']}", flush=True)
    if projection["minutes"] > BUDGET_MINUTES and not flags.ignore_budget:
      print(f"[{TAG}] over budget: no arm runs. README 'Budget': lower STEPS in configs/slca_grpo.py to "
            f"{projection['steps_that_fit']}, record the change, rerun (or pass --ignore_budget)", flush=True)
      finish(args, [])
      return BUDGET_EXCEEDED
  for seed in args.seeds:
    for arm in args.arms:
      run(os.path.join(args.root, f"{arm}_s{seed}"), arm, seed, arm)
  return finish(args, failed)


def finish(args, failed: list) -> int:
  if args.archive and not args.dry_run:
    names = archive_with_gate(args.root, args.archive, ARCHIVE_KEYS)
    print(f"[{TAG}] archived {len(names)} workdir(s) into {args.archive}: {', '.join(names) or '-'}", flush=True)
  return report(TAG, failed)


if __name__ == "__main__":
  sys.exit(main())
