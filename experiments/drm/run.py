"""Driver of experiments/drm: one `sft` run per seed (SFT, then the four reward heads on its frozen
embeddings), then each RL arm from its checkpoint with the head it names as the reward.

  python experiments/drm/run.py --root=/tmp/drm                           # 3 seeds x 2 RL arms
  python experiments/drm/run.py --root=DIR --seeds=0 --arms=rl_drm
  python experiments/drm/summarize.py --root=DIR                          # the tables and plots

Each run is one `launch.py` subprocess (configs/drm.py) into its own workdir: DIR/sft_s<seed> and
DIR/<arm>_s<seed>, started from DIR/sft_s<seed> with the same seed (the same data split); that workdir is also
the arm's frozen embedder (`models.embed.path`) and holds its head (DIR/sft_s<seed>/reward_model/rm_<head>).
Finished workdirs are skipped, unfinished ones resumed (experiments/driver.py); DIR/runs.jsonl gets each
command's wall time. `--lock=PATH` runs every launch under `flock PATH`.
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.drm import ARMS  # noqa: E402
from experiments.driver import parse_args, run_from_sft  # noqa: E402


def head_args(arm: str, sft: str) -> list:
  return [f"--config.models.embed.path={sft}",
          f"--config.rl.reward.kwargs.path={os.path.join(sft, 'reward_model', 'rm_' + ARMS[arm]['head'])}"]


def main(argv=None) -> int:
  return run_from_sft(parse_args(__doc__, "/tmp/drm", ARMS, argv), "drm", "configs/drm.py", head_args)


if __name__ == "__main__":
  sys.exit(main())
