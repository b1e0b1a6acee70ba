"""Driver of experiments/graft: per seed, the two SFT runs (A: additions, B: subtractions), then every arm.

  python experiments/graft/run.py --root=/tmp/graft                         # 3 seeds x 3 arms
  python experiments/graft/run.py --root=DIR --seeds=0 --arms=graft,naive   # a subset
  python experiments/graft/summarize.py --root=DIR                          # the table and plot

Each run is one `launch.py` subprocess (configs/graft.py) into its own workdir: DIR/sft_add_s<seed>,
DIR/sft_sub_s<seed>, and DIR/<arm>_s<seed>, the arm started from that seed's two SFT checkpoints (A the policy,
B the peer) with the same seed. Finished workdirs are skipped, unfinished ones resumed (experiments/driver.py);
DIR/runs.jsonl gets each command's wall time. `--lock=PATH` runs every launch under `flock PATH`.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.graft import ARMS, SFT_OPS  # noqa: E402
from experiments.driver import launch, parse_args  # noqa: E402


def workdir(root: str, name: str, seed: int) -> str:
  return os.path.join(root, f"{name}_s{seed}")


def main(argv=None) -> int:
  args = parse_args(__doc__, "/tmp/graft", ARMS, argv)
  failed = []
  for seed in args.seeds:
    sft = {name: workdir(args.root, name, seed) for name in SFT_OPS}
    bad = [path for name, path in sft.items()
           if launch(args.root, path, f"configs/graft.py:{name}", [f"--config.seed={seed}"], args.lock,
                     args.dry_run, "graft", name=name, seed=seed)]
    failed += bad
    for arm in [] if bad else args.arms:
      path = workdir(args.root, arm, seed)
      extra = [f"--config.seed={seed}", f"--config.model.path={sft['sft_add']}",
               f"--config.models.peer.path={sft['sft_sub']}"]
      if launch(args.root, path, f"configs/graft.py:{arm}", extra, args.lock, args.dry_run, "graft", name=arm,
                seed=seed):
        failed.append(path)
  if failed:
    print(f"[graft] failed: {', '.join(failed)}", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
