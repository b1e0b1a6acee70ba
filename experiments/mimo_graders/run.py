"""Driver of experiments/mimo_graders (README.md is the pre-registration): the SFT policy from the base (seed 0),
the calibration gate on it, the budget, then every arm of every seed from it, then the archive.

  python experiments/mimo_graders/run.py --root=/tmp/mimo_graders [--lock=/tmp/cpu.lock] [--ignore_budget]
  python experiments/mimo_graders/summarize.py --root=experiments/mimo_graders/runs

Each run is one `launch.py` subprocess (configs/mimo_graders.py) into its own workdir: ROOT/sft_s0, the gate's
ROOT/gate_s<seed> (frozen, from ROOT/sft_s0) and ROOT/<arm>_s<seed> (from ROOT/sft_s0). Finished workdirs are
skipped, unfinished ones resumed (experiments/driver.py); the gate's numbers go to ROOT/gate.json.
"""
import math
import os
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks._common import commit  # noqa: E402
from configs.mimo_graders import ARMS, GATE, STEPS, WINDOW  # noqa: E402
from experiments.driver import launch, report, use_compilation_cache  # noqa: E402
from experiments.gate import (budget_projection, check, gate_then_arms, parse_driver_args,  # noqa: E402
                              pooled_means)

CONFIG = "configs/mimo_graders.py"
TAG = "mimo_graders"
ARCHIVE = os.path.join("experiments", "mimo_graders", "runs")
ARCHIVE_KEYS = ["stage", "step", "step_s", "at_stage_start", "reward", "accuracy", "response_len", "response_len_correct",
                "reward/", "informative_groups", "eval/"]
BUDGET_MINUTES = 78          # the gate and the arms; the SFT run before them takes ~12 of the ~90 CPU-minutes
GATE_SEEDS = (0, 1, 2)
EVAL_S = 60.0              # an arm's two evaluations of 200 prompts (greedy, each graded in the sandbox), estimated


def gate_paths(root: str) -> list:
  return [os.path.join(root, f"gate_s{seed}") for seed in GATE_SEEDS]


def gate_measure(paths) -> dict:
  """Pooled over the frozen gate runs' iterations: the pass rate of sampled solutions (reward/all_pass), their
  mean solution score (reward/quality), and the median iteration seconds (each run's first left out)."""
  return pooled_means(paths, {"pass_rate": "reward/all_pass", "quality": "reward/quality"}, start="sft_eval_accuracy")


def gate_checks(measured: dict) -> list:
  return [check("G1 pass rate of the SFT policy's samples (mean reward/all_pass)", measured.get("pass_rate", math.nan),
                low=GATE["pass_low"], high=GATE["pass_high"]),
          check("G2 mean solution score of its samples (mean reward/quality)", measured.get("quality", math.nan),
                high=GATE["quality_max"])]


def budget(root: str, iteration_s: float, steps: int = STEPS) -> dict:
  return budget_projection(root, gate_paths(root), len(ARMS) * len(GATE_SEEDS), GATE["steps"], iteration_s, steps,
                           BUDGET_MINUTES, WINDOW, extra_s=lambda n: EVAL_S, max_steps=STEPS)


def main(argv=None, launch_fn=launch) -> int:
  args = parse_driver_args(__doc__, "/tmp/mimo_graders", ARMS, ARCHIVE, argv, budget=True)
  use_compilation_cache(args.root)
  rev = commit()
  sft = os.path.join(args.root, "sft_s0")
  if launch_fn(args.root, sft, f"{CONFIG}:sft", ["--config.seed=0"], args.lock, args.dry_run, TAG, name="sft",
               seed=0, commit=rev):
    return report(TAG, [sft])
  return gate_then_arms(args, tag=TAG, config=CONFIG, gate_seeds=GATE_SEEDS, gate_paths=gate_paths(args.root),
                        measure=gate_measure, checks=gate_checks, budget=budget, steps=STEPS,
                        arm_runs=len(ARMS) * len(GATE_SEEDS), budget_minutes=BUDGET_MINUTES, keys=ARCHIVE_KEYS,
                        extra=[f"--config.model.path={sft}"], ignore_budget=args.ignore_budget, launch_fn=launch_fn,
                        rev=rev)


if __name__ == "__main__":
  sys.exit(main())
