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


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks._common import commit  # noqa: E402
from configs.slca_grpo import ARMS, BUDGET_MINUTES, EVAL_EVERY, GATE, STEPS, WINDOW  # noqa: E402
from experiments.driver import finished, launch, use_compilation_cache  # noqa: E402,F401  (tests patch launch)
from experiments.gate import (BUDGET_EXCEEDED, GATE_FAILED, budget_projection, check, gate_then_arms,  # noqa: E402,F401
                              parse_driver_args, pooled_means, record_gate)
from experiments.slca_grpo.summarize import ARCHIVE_KEYS, CALL, SUMMARY_RULE  # noqa: E402

CONFIG = "configs/slca_grpo.py"
TAG = "slca_grpo"
ARCHIVE = os.path.join("experiments", "slca_grpo", "runs")
# BUDGET_EXCEEDED (experiments/gate.py): the exit status when the gate's timing projects the set past BUDGET_MINUTES
EVAL_S = 5.0             # an arm's evaluation (500 prompts) and checkpoint beyond the gate's two, in seconds: an
                         # estimate from the base's figures (README "Budget"), as the runs do not log it


def gate_paths(root: str) -> list:
  return [os.path.join(root, f"gate_s{seed}") for seed in GATE["seeds"]]


def gate_measure(paths) -> dict:
  """The gate's numbers, pooled over its runs' training iterations (each a batch of PROMPTS x GROUP episodes of
  the base, frozen): mean call accuracy (reward/execution), summary rule rate (reward/summary_rule), the judge's
  score, penalty and informative groups; the base's held-out greedy call accuracy (its start evaluations); the
  median seconds of an iteration, each run's first (which compiles) left out. NaN where no run logged it."""
  return pooled_means(paths, {"call_accuracy": CALL, "summary_rule": SUMMARY_RULE, "judge_score": "reward/summary",
                              "penalty": "reward/penalty", "informative_groups": "informative_groups"},
                      start="base_eval_accuracy")


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
  a gate run has no wall record or no iteration time): experiments/gate.py's `budget_projection`."""
  def extra_s(n: int) -> float:
    return (math.ceil(n / EVAL_EVERY) - 1) * EVAL_S       # an arm evaluates at its start, every EVAL_EVERY, its end
  return budget_projection(root, gate_paths(root), len(ARMS) * len(GATE["seeds"]), GATE["steps"], iteration_s, steps,
                           BUDGET_MINUTES, WINDOW, extra_s=extra_s, max_steps=STEPS)


def main(argv=None) -> int:
  own = argparse.ArgumentParser(add_help=False)
  own.add_argument("--model", default="")
  flags, rest = own.parse_known_args(argv)
  args = parse_driver_args(__doc__, "/tmp/slca_grpo", ARMS, ARCHIVE, rest, budget=True)
  use_compilation_cache(args.root)
  return gate_then_arms(args, tag=TAG, config=CONFIG, gate_seeds=GATE["seeds"], gate_paths=gate_paths(args.root),
                        measure=gate_measure, checks=gate_checks, budget=budget, steps=STEPS,
                        arm_runs=len(ARMS) * len(GATE["seeds"]), budget_minutes=BUDGET_MINUTES, keys=ARCHIVE_KEYS,
                        extra=[f"--config.model.path={flags.model}"] if flags.model else [],
                        ignore_budget=args.ignore_budget, launch_fn=launch, rev=commit())


if __name__ == "__main__":
  sys.exit(main())
