"""Driver of experiments/trace_fp4 (README.md is the pre-registration): the calibration gate (a frozen fp4_rtn run
from the base, seed 0), the budget, then every arm of every seed, then the archive.

  python experiments/trace_fp4/run.py --root=/tmp/trace_fp4 [--lock=/tmp/cpu.lock] [--ignore_budget]
  python experiments/trace_fp4/summarize.py --root=experiments/trace_fp4/runs

Each run is one `launch.py` subprocess (configs/trace_fp4.py) into its own workdir: the gate's ROOT/gate_s0 and
ROOT/<arm>_s<seed>. Finished workdirs are skipped, unfinished ones resumed (experiments/driver.py); the gate's
numbers go to ROOT/gate.json.
"""
import math
import os
import sys


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks._common import commit  # noqa: E402
from configs.trace_fp4 import ARMS, EVAL_EVERY, GATE_STEPS, STEPS  # noqa: E402
from experiments.driver import launch, use_compilation_cache  # noqa: E402
from experiments.gate import budget_projection, check, gate_then_arms, parse_driver_args, pooled_means  # noqa: E402

CONFIG = "configs/trace_fp4.py"
TAG = "trace_fp4"
ARCHIVE = os.path.join("experiments", "trace_fp4", "runs")
ARCHIVE_KEYS = ["stage", "step", "step_s", "reward", "accuracy", "mismatch/", "moe/", "eval/"]
BUDGET_MINUTES = 80
GATE_SEEDS = (0,)
WINDOW = 20                 # the last-window means of README's H3
MISMATCH_MIN = 0.01         # G1
ACCURACY = (0.2, 0.8)       # G2
EVAL_S = 15.0               # one evaluation of 256 prompts, estimated


def gate_paths(root: str) -> list:
  return [os.path.join(root, f"gate_s{seed}") for seed in GATE_SEEDS]


def gate_measure(paths) -> dict:
  """The frozen runs' mean full-code mismatch (moe/codeword_mismatch), their start accuracy and the median
  iteration seconds (`pooled_means`)."""
  return pooled_means(paths, {"mismatch": "moe/codeword_mismatch"})


def gate_checks(measured: dict) -> list:
  return [check("G1 full-code mismatch of fp4_rtn (mean moe/codeword_mismatch)", measured.get("mismatch", math.nan),
                low=MISMATCH_MIN),
          check("G2 held-out accuracy of the starting policy", measured.get("start_accuracy", math.nan),
                *ACCURACY)]


def budget(root: str, iteration_s: float, steps: int = STEPS) -> dict:
  return budget_projection(root, gate_paths(root), len(ARMS) * 3, GATE_STEPS, iteration_s, steps, BUDGET_MINUTES,
                           WINDOW, extra_s=lambda n: EVAL_S * (1 + n // EVAL_EVERY), max_steps=STEPS)


def main(argv=None, launch_fn=launch) -> int:
  args = parse_driver_args(__doc__, "/tmp/trace_fp4", ARMS, ARCHIVE, argv, budget=True)
  use_compilation_cache(args.root)
  return gate_then_arms(args, tag=TAG, config=CONFIG, gate_seeds=GATE_SEEDS, gate_paths=gate_paths(args.root),
                        measure=gate_measure, checks=gate_checks, budget=budget, steps=STEPS,
                        arm_runs=len(ARMS) * 3, budget_minutes=BUDGET_MINUTES, keys=ARCHIVE_KEYS,
                        ignore_budget=args.ignore_budget, launch_fn=launch_fn, rev=commit())


if __name__ == "__main__":
  sys.exit(main())
