"""Driver of experiments/rquest: per seed, the solver's and the proposer's SFT runs, then every arm from both.

  python experiments/rquest/run.py --root=/tmp/rquest                      # 3 seeds x 2 arms
  python experiments/rquest/run.py --root=DIR --seeds=0 --arms=rquest
  python experiments/rquest/summarize.py --root=DIR                        # the tables and plot

Each run is one `launch.py` subprocess (configs/rquest.py) into its own workdir: DIR/solver_sft_s<seed>,
DIR/proposer_sft_s<seed> and DIR/<arm>_s<seed>, which starts its solver from the first (`model.path`) and its
proposer from the second (`models.proposer.path`) with the same seed. Finished workdirs are skipped, unfinished
ones resumed (experiments/driver.py); DIR/runs.jsonl gets each command's wall time. `--lock=PATH` runs every
launch under `flock PATH`.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.rquest import ARMS  # noqa: E402
from experiments.driver import launch, parse_args, report  # noqa: E402


def main(argv=None) -> int:
  args, failed = parse_args(__doc__, "/tmp/rquest", ARMS, argv), []
  for seed in args.seeds:
    base = {}
    for model in ("solver", "proposer"):
      base[model] = path = os.path.join(args.root, f"{model}_sft_s{seed}")
      if launch(args.root, path, f"configs/rquest.py:{model}_sft", [f"--config.seed={seed}"], args.lock,
                args.dry_run, "rquest", name=f"{model}_sft", seed=seed):
        failed.append(path)
    if len(base) != 2 or any(p in failed for p in base.values()):
      continue
    for arm in args.arms:
      path = os.path.join(args.root, f"{arm}_s{seed}")
      if launch(args.root, path, f"configs/rquest.py:{arm}", [f"--config.seed={seed}", f"--config.model.path="
                f"{base['solver']}", f"--config.models.proposer.path={base['proposer']}"], args.lock, args.dry_run,
                "rquest", name=arm, seed=seed):
        failed.append(path)
  return report("rquest", failed)


if __name__ == "__main__":
  sys.exit(main())
