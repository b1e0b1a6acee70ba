"""Driver of experiments/grpo_arith: the main job (configs/grpo_arith.py, preset cpu) for each seed, then the
archive.

  python experiments/grpo_arith/run.py --root=/tmp/grpo_arith [--seeds=0,1,2,3,4] [--lock=/tmp/cpu.lock]
  python experiments/grpo_arith/summarize.py --root=experiments/grpo_arith/runs --seeds=0,1,2,3,4

Each run is one `launch.py` subprocess into ROOT/cpu_s<seed>; finished workdirs are skipped, unfinished ones
resumed (experiments/driver.py); the finished workdirs, cut to what the summary reads, go to `--archive`
(default experiments/grpo_arith/runs) with ROOT/runs.jsonl's records (commit, wall).
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from benchmarks._common import commit  # noqa: E402
from experiments.driver import launch  # noqa: E402
from experiments.gate import finish_driver, parse_driver_args  # noqa: E402

ARCHIVE = os.path.join("experiments", "grpo_arith", "runs")
ARCHIVE_KEYS = ["stage", "step", "step_s", "loss", "loss_ema", "reward", "eval/"]


def main(argv=None) -> int:
  args = parse_driver_args(__doc__, "/tmp/grpo_arith", ["cpu"], ARCHIVE, argv)
  failed, rev = [], commit()
  for seed in args.seeds:
    path = os.path.join(args.root, f"cpu_s{seed}")
    if launch(args.root, path, "configs/grpo_arith.py:cpu", [f"--config.seed={seed}"], args.lock, args.dry_run,
              "grpo_arith", name="cpu", seed=seed, commit=rev):
      failed.append(path)
  return finish_driver(args, "grpo_arith", ARCHIVE_KEYS, failed)


if __name__ == "__main__":
  sys.exit(main())
