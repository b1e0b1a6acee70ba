"""Driver of experiments/baselines: one SFT run per seed, then every variant's RL from that seed's checkpoint.

  python experiments/baselines/run.py --root=/tmp/baselines                      # full: 3 seeds x 11 variants
  python experiments/baselines/run.py --root=/tmp/baselines --quick --seeds=0    # quick preset, seed 0
  python experiments/baselines/run.py --root=DIR --seeds=0 --variants=grpo,dapo  # a subset
  python experiments/baselines/run.py --root=DIR --seeds=0 --sft_only            # the SFT run alone
  python experiments/baselines/summarize.py --root=DIR [--quick]                 # the table and plot

Each run is one `launch.py` subprocess (configs/baselines.py) into its own workdir: DIR/sft_s<seed>, and
DIR/<variant>_s<seed> (DIR/<variant>_quick_s<seed> with --quick) started from DIR/sft_s<seed> with the same
seed. Finished workdirs are skipped (a workdir is finished when its metrics.jsonl has the evaluation of the
stage's last step); an unfinished one is rerun with the same command, which resumes it from its newest
checkpoint. Each run's command wall time and exit status are appended to DIR/runs.jsonl. `--lock=PATH` runs
every launch under `flock PATH` (on a shared machine; do not also hold that lock around this driver).
"""
import argparse
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.baselines import VARIANTS  # noqa: E402
from experiments.driver import launch as run_launch  # noqa: E402


def workdir(root: str, name: str, seed: int, quick: bool = False) -> str:
  return os.path.join(root, f"{name}{'_quick' if quick and name != 'sft' else ''}_s{seed}")


def launch(root: str, name: str, seed: int, preset: str, extra: list, lock: str, dry_run: bool) -> int:
  path = workdir(root, name, seed, preset.endswith(":quick"))
  return run_launch(root, path, f"configs/baselines.py:{preset}", [f"--config.seed={seed}"] + extra, lock,
                    dry_run, "baselines", name=name, seed=seed, preset=preset)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="/tmp/baselines", help="folder of every workdir (and runs.jsonl)")
  p.add_argument("--quick", action="store_true", help="the <variant>:quick presets (fewer RL iterations)")
  p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
  p.add_argument("--variants", default=",".join(VARIANTS), help="comma-separated names of VARIANTS")
  p.add_argument("--sft_only", action="store_true", help="only the SFT run of each seed")
  p.add_argument("--lock", default="", help="run every launch.py under `flock LOCK`")
  p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  args = p.parse_args(argv)
  variants = [v for v in args.variants.split(",") if v]
  unknown = [v for v in variants if v not in VARIANTS]
  if unknown:
    p.error(f"unknown variants {unknown}; known: {', '.join(VARIANTS)}")
  os.makedirs(args.root, exist_ok=True)
  failed = []
  for seed in [int(s) for s in args.seeds.split(",")]:
    sft = workdir(args.root, "sft", seed)
    if launch(args.root, "sft", seed, "sft", [], args.lock, args.dry_run):
      failed.append(sft)
      continue
    for v in [] if args.sft_only else variants:
      preset = f"{v}:quick" if args.quick else v
      if launch(args.root, v, seed, preset, [f"--config.model.path={sft}"], args.lock, args.dry_run):
        failed.append(workdir(args.root, v, seed, args.quick))
  if failed:
    print(f"[baselines] failed: {', '.join(failed)}", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
