"""Driver of experiments/drm: one `sft` run per seed (SFT, then the four reward heads on its frozen
embeddings), then each RL arm from its checkpoint with the head it names as the reward.

  python experiments/drm/run.py --root=/tmp/drm                           # 3 seeds x 2 RL arms
  python experiments/drm/run.py --root=DIR --seeds=0 --arms=rl_drm
  python experiments/drm/summarize.py --root=experiments/drm/runs        # the tables and plots, from the archive

Each run is one `launch.py` subprocess (configs/drm.py) into its own workdir: DIR/sft_s<seed> and
DIR/<arm>_s<seed>, started from DIR/sft_s<seed> with the same seed (the same data split); that workdir is also
the arm's frozen embedder (`models.embed.path`) and holds its head (DIR/sft_s<seed>/reward_model/rm_<head>).
Finished workdirs are skipped, unfinished ones resumed (experiments/driver.py); DIR/runs.jsonl gets each
command's wall time. `--lock=PATH` runs every launch under `flock PATH`. After the runs, each seed's heads are
scored (experiments/drm/heads.py: DIR/heads_s<seed>.json), and the finished workdirs, cut to what the summary
reads, and those files are archived into `--archive` (default experiments/drm/runs).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.drm import ARMS  # noqa: E402
from experiments.driver import run_from_sft, run_script  # noqa: E402
from experiments.drm.heads import heads_path  # noqa: E402
from experiments.gate import finish_driver, parse_driver_args  # noqa: E402

ARCHIVE = os.path.join("experiments", "drm", "runs")
ARCHIVE_KEYS = ["stage", "step", "step_s", "reward", "accuracy", "loss", "at_stage_start", "eval/"]


def head_args(arm: str, sft: str) -> list:
  return [f"--config.models.embed.path={sft}",
          f"--config.rl.reward.kwargs.path={os.path.join(sft, 'reward_model', 'rm_' + ARMS[arm]['head'])}"]


def main(argv=None) -> int:
  args = parse_driver_args(__doc__, "/tmp/drm", ARMS, ARCHIVE, argv)
  failed = [args.root] if run_from_sft(args, "drm", "configs/drm.py", head_args) else []   # it names the workdirs
  for seed in args.seeds:
    if run_script(heads_path(args.root, seed), "experiments/drm/heads.py", [f"--root={args.root}", f"--seed={seed}"],
                  args.lock, args.dry_run, "drm"):
      failed.append(heads_path(args.root, seed))
  return finish_driver(args, "drm", ARCHIVE_KEYS, failed,
                       [os.path.basename(heads_path(args.root, s)) for s in args.seeds])


if __name__ == "__main__":
  sys.exit(main())
