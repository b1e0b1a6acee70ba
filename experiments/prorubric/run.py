"""Driver of experiments/prorubric: one SFT run (the base policy) per seed, then every arm from its checkpoint.

  python experiments/prorubric/run.py --root=/tmp/prorubric                # 3 seeds x 6 arms
  python experiments/prorubric/run.py --root=DIR --seeds=0 --arms=additive_w1.0,gated_w1.0
  python experiments/prorubric/summarize.py --root=DIR                     # the tables and plot

Each run is one `launch.py` subprocess (configs/prorubric.py) into its own workdir: DIR/sft_s<seed> and
DIR/<arm>_s<seed>, started from DIR/sft_s<seed> with the same seed. Finished workdirs are skipped, unfinished
ones resumed (experiments/driver.py); DIR/runs.jsonl gets each command's wall time. `--lock=PATH` runs every
launch under `flock PATH`.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.prorubric import ARMS  # noqa: E402
from experiments.driver import parse_args, run_from_sft  # noqa: E402


def main(argv=None) -> int:
  return run_from_sft(parse_args(__doc__, "/tmp/prorubric", ARMS, argv), "prorubric", "configs/prorubric.py")


if __name__ == "__main__":
  sys.exit(main())
