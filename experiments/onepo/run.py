"""Driver of experiments/onepo: one SFT run (the base policy) per seed, then every arm from its checkpoint.

  python experiments/onepo/run.py --root=/tmp/onepo                       # 3 seeds x 4 arms
  python experiments/onepo/run.py --root=DIR --seeds=0 --arms=grpo,annealed
  python experiments/onepo/summarize.py --root=DIR                        # the tables and plot

Each run is one `launch.py` subprocess (configs/onepo.py) into its own workdir: DIR/sft_s<seed> and
DIR/<arm>_s<seed>, started from DIR/sft_s<seed> with the same seed. Finished workdirs are skipped, unfinished
ones resumed (experiments/driver.py); DIR/runs.jsonl gets each command's wall time. `--lock=PATH` runs every
launch under `flock PATH`.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.onepo import ARMS  # noqa: E402
from experiments.driver import parse_args, run_from_sft  # noqa: E402


def main(argv=None) -> int:
  return run_from_sft(parse_args(__doc__, "/tmp/onepo", ARMS, argv), "onepo", "configs/onepo.py")


if __name__ == "__main__":
  sys.exit(main())
