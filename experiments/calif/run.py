"""Driver of experiments/calif: one SFT run (the base policy) per seed, then every arm from its checkpoint.

  python experiments/calif/run.py --root=/tmp/calif                       # 3 seeds x 3 arms
  python experiments/calif/run.py --root=DIR --seeds=0 --arms=calif
  python experiments/calif/summarize.py --root=DIR                        # the tables and plot

Each run is one `launch.py` subprocess (configs/calif.py) into its own workdir: DIR/sft_s<seed> and
DIR/<arm>_s<seed>, started from DIR/sft_s<seed> with the same seed; the `calif` arm also gets it as its frozen
reference (`models.reference.path`). Finished workdirs are skipped, unfinished ones resumed
(experiments/driver.py); DIR/runs.jsonl gets each command's wall time. `--lock=PATH` runs every launch under
`flock PATH`.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.calif import ARMS  # noqa: E402
from experiments.driver import parse_args, run_from_sft  # noqa: E402


def reference(arm: str, sft: str) -> list:
  return [f"--config.models.reference.path={sft}"] if arm == "calif" else []


def main(argv=None) -> int:
  return run_from_sft(parse_args(__doc__, "/tmp/calif", ARMS, argv), "calif", "configs/calif.py", reference)


if __name__ == "__main__":
  sys.exit(main())
