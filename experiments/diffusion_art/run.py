"""Driver of experiments/diffusion_art (README.md is the pre-registration): the seed-0 reference generator and
the pilot, the calibration gate and the budget, then every seed's reference and arms, each run's final samples,
then the archive.

  python experiments/diffusion_art/run.py --root=/tmp/diffusion_art [--lock=/tmp/cpu.lock]
  python experiments/diffusion_art/summarize.py --root=experiments/diffusion_art/runs --out=experiments/diffusion_art

Each training run is one `launch.py` subprocess (configs/diffusion_art.py): ROOT/pretrain_s<seed> and
ROOT/<arm>_s<seed> (from pretrain_s<seed>'s generator through `rl.expert_path`); after each, one
experiments/diffusion_art/samples.py subprocess writes ROOT/samples_<name>.json (archived beside the runs).
Finished workdirs and written samples are skipped, unfinished runs resumed (experiments/driver.py).
"""
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.diffusion_art import ARMS  # noqa: E402
from benchmarks._common import commit  # noqa: E402
from experiments.driver import finished, launch, read_json, run_script, use_compilation_cache  # noqa: E402
from experiments.gate import GATE_FAILED, check, finish_driver, parse_driver_args, projected_minutes  # noqa: E402
from experiments.gate import record_gate  # noqa: E402

CONFIG = "configs/diffusion_art.py"
TAG = "diffusion_art"
ARCHIVE = os.path.join("experiments", "diffusion_art", "runs")
ARCHIVE_KEYS = ["stage", "step", "step_s", "reward", "true_reward", "nfe", "opt_mmd", "loss", "art/", "eval/"]
PILOT = "art"
BUDGET_MINUTES = 90
REF_MMD_MAX = 0.1               # G1: the reference fits its data (squared MMD to fresh draws)
ROOM_MIN = 1.0                  # G2: the optimum's true reward above the reference's by at least this


def samples(args, name: str, seed: int) -> int:
  out = os.path.join(args.root, f"samples_{name}_s{seed}.json")
  return run_script(out, "experiments/diffusion_art/samples.py",
                    [f"--workdir={os.path.join(args.root, f'{name}_s{seed}')}", f"--seed={seed}", f"--out={out}"],
                    args.lock, args.dry_run, TAG)


def gate(args) -> bool:
  """G1-G3 (README) on the seed-0 reference's samples, the optimum and the walls, written to ROOT/gate.json."""
  ref = read_json(os.path.join(args.root, "samples_pretrain_s0.json"))
  optimum = read_json(os.path.join(args.root, "samples_optimum.json"))
  runs = {"pretrain_s0": len(args.seeds) - 1, f"{PILOT}_s0": len(args.arms) * len(args.seeds) - 1}
  minutes = projected_minutes(args.root, list(runs), runs)
  checks = [check("G1 the reference's squared MMD to its data", ref["data_mmd"], high=REF_MMD_MAX),
            check("G2 the optimum's true reward minus the reference's", optimum["true_reward"] - ref["true_reward"],
                  low=ROOM_MIN),
            check("G3 projected minutes", minutes, high=BUDGET_MINUTES)]
  return record_gate(args.root, TAG, checks, measured={"reference": {k: v for k, v in ref.items() if k != "samples"},
                                                       "optimum_true_reward": optimum["true_reward"]})


def optimum(args) -> int:
  """ROOT/samples_optimum.json: the exact optimum's true reward (experiments/diffusion_art/optimum.py)."""
  out = os.path.join(args.root, "samples_optimum.json")
  return run_script(out, "experiments/diffusion_art/optimum.py", [f"--out={out}"], args.lock, args.dry_run, TAG)


def main(argv=None) -> int:
  args = parse_driver_args(__doc__, "/tmp/diffusion_art", list(ARMS), ARCHIVE, argv)
  use_compilation_cache(args.root)
  failed, rev = [], commit()

  def train(seed, preset):
    path = os.path.join(args.root, f"{preset}_s{seed}")
    extra = [] if preset == "pretrain" else [f"--config.rl.expert_path={os.path.join(args.root, f'pretrain_s{seed}')}"]
    if launch(args.root, path, f"{CONFIG}:{preset}", [f"--config.seed={seed}", *extra], args.lock, args.dry_run,
              TAG, name=preset, seed=seed, commit=rev):
      failed.append(path)
    elif not args.dry_run and finished(path) and samples(args, preset, seed):
      failed.append(os.path.join(args.root, f"samples_{preset}_s{seed}.json"))
    return path

  if optimum(args):
    failed.append(os.path.join(args.root, "samples_optimum.json"))
  gate_runs = [train(0, "pretrain"), train(0, PILOT)]
  if not failed and not args.dry_run and not (all(finished(p) for p in gate_runs) and gate(args)):
    return finish(args, failed) or GATE_FAILED
  for seed in args.seeds:
    train(seed, "pretrain")
    for arm in args.arms:
      train(seed, arm)
  return finish(args, failed)


def finish(args, failed) -> int:
  names = sorted(n for n in os.listdir(args.root) if n.startswith("samples_") and n.endswith(".json"))
  return finish_driver(args, TAG, ARCHIVE_KEYS, failed, names)


if __name__ == "__main__":
  sys.exit(main())
