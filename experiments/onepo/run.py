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
from experiments.driver import launch, parse_args  # noqa: E402


def main(argv=None) -> int:
  args = parse_args(__doc__, "/tmp/onepo", ARMS, argv)
  failed = []
  for seed in args.seeds:
    sft = os.path.join(args.root, f"sft_s{seed}")
    if launch(args.root, sft, "configs/onepo.py:sft", [f"--config.seed={seed}"], args.lock, args.dry_run, "onepo",
              name="sft", seed=seed):
      failed.append(sft)
      continue
    for arm in args.arms:
      path = os.path.join(args.root, f"{arm}_s{seed}")
      if launch(args.root, path, f"configs/onepo.py:{arm}", [f"--config.seed={seed}", f"--config.model.path={sft}"],
                args.lock, args.dry_run, "onepo", name=arm, seed=seed):
        failed.append(path)
  if failed:
    print(f"[onepo] failed: {', '.join(failed)}", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
