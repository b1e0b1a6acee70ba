"""Driver of experiments/logra: one SFT run (the base policy) per seed, then every arm from its checkpoint.

  python experiments/logra/run.py --root=/tmp/logra                        # 3 seeds x 6 arms
  python experiments/logra/run.py --root=DIR --seeds=0 --arms=adamw,logra_r16
  python experiments/logra/run.py --root=DIR --dry_run                     # print the commands only
  python experiments/logra/summarize.py --root=DIR                         # the tables and plot

Each run is one `launch.py` subprocess (configs/logra.py) into its own workdir: DIR/sft_s<seed> and
DIR/<arm>_s<seed>, started from DIR/sft_s<seed> with the same seed. Finished workdirs are skipped, unfinished
ones resumed (experiments/driver.py); DIR/runs.jsonl gets each command's wall time. `--lock=PATH` runs every
launch under `flock PATH` (do not also hold that lock around this driver).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.logra import ARMS  # noqa: E402
from experiments.driver import parse_args, run_from_sft  # noqa: E402


def main(argv=None) -> int:
  return run_from_sft(parse_args(__doc__, "/tmp/logra", ARMS, argv), "logra", "configs/logra.py")


if __name__ == "__main__":
  sys.exit(main())
