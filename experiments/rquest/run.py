"""Driver of experiments/rquest: the proposer's SFT, the calibration gate's run (the base solver and the SFT
proposer, frozen, in the rquest stage), the gate, then every arm and seed.

  python experiments/rquest/run.py --root=/tmp/rquest                  # SFT, gate, then 4 arms x 3 seeds
  python experiments/rquest/run.py --root=DIR --seeds=0 --arms=rquest,rquest_checker
  python experiments/rquest/run.py --root=DIR --dry_run                # print the commands only
  python experiments/rquest/summarize.py --root=experiments/rquest/runs   # the tables and plot, from the archive

Each run is one `launch.py` subprocess (configs/rquest.py) into its own workdir; the solver is the base, the
proposer the seed's `proposer_sft` workdir. In order:
1. DIR/proposer_sft_s<first seed>: the base fine-tuned on the proposer's demonstrations;
2. DIR/gate_s<first seed>: `gate`, GATE_STEPS iterations of the stage with every weight frozen;
3. the gate (README): G1 the base solver's held-out accuracy, G2 the share of valid questions the SFT
   proposer writes in the stage, G3 the share of majority labels that are right (label noise to separate),
   G4 the projected minutes of the whole set from the SFT's and the gate's timing. DIR/gate.json records it;
   when it fails the driver stops here (exit 2);
4. per seed: DIR/proposer_sft_s<seed> (the first seed's is there), then every arm: DIR/<arm>_s<seed>.
Finished workdirs are skipped, unfinished ones resumed (experiments/driver.py); DIR/runs.jsonl gets each
command's wall time; `--lock=PATH` runs every launch under `flock PATH`. At the end the finished workdirs (cut to
what summarize.py reads) and gate.json are archived into `--archive` (default experiments/rquest/runs; ''
skips).
"""
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.rquest import ARMS, GATE_STEPS, STEPS  # noqa: E402
from experiments.driver import command_walls, last_eval, launch, report  # noqa: E402
from experiments.gate import GATE_FAILED, archive_with_gate, check, parse_driver_args, record_gate  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

ARCHIVE = "experiments/rquest/runs"
KEYS = ("stage", "step", "step_s", "at_stage_start", "eval/", "reward", "rquest/", "proposer/reward")
# The gate (README "Calibration gate").
SOLVER_RANGE = (0.15, 0.85)    # G1: room to improve, and majority labels not hopeless
VALID_MIN = 0.5                # G2
LABEL_CORRECT_MAX = 0.9        # G3: majority labels wrong often enough for the checker's to differ
BUDGET_MAX_MIN = 135.0         # G4: 1.5 x the 90-minute budget


def gate_measures(path: str, sft_path: str) -> dict:
  """What the gate reads of the gate's run: the base solver's held-out accuracy (the evaluation at the start),
  the valid share and majority-label accuracy over its iterations, and its timing (seconds per iteration: the
  median after the first, which compiles; the rest of the command's wall is the overhead a run pays once); of
  the proposer's SFT run, its greedy held-out valid share and its wall time."""
  rows = read_metrics(os.path.join(path, "metrics.jsonl"))
  start = next((r for r in rows if r.get("at_stage_start")), {})
  train = [r for r in rows if "step_s" in r]
  per_step = float(np.median([r["step_s"] for r in train[1:]])) if len(train) > 1 else np.nan
  walls = command_walls(os.path.dirname(path))
  return {"solver": start.get("eval/accuracy", np.nan),
          "proposer_greedy": (last_eval(sft_path) or {}).get("eval/accuracy", np.nan),
          "valid": 1.0 - np.mean([r["rquest/invalid"] for r in train]) if train else np.nan,
          "label_correct": np.mean([r["rquest/label_correct"] for r in train]) if train else np.nan,
          "step_s": per_step, "overhead_s": walls.get(path, np.nan) - (GATE_STEPS - 1) * per_step,
          "sft_s": walls.get(sft_path, np.nan)}


def gate_checks(m: dict, seeds: int, arms: int) -> list:
  """G1-G4 (README); G4 projects the gate's run, one proposer SFT per seed and `seeds` x `arms` arm runs."""
  arm_s = m["overhead_s"] + (STEPS - 1) * m["step_s"]
  whole_s = m["overhead_s"] + GATE_STEPS * m["step_s"] + seeds * (m["sft_s"] + arms * arm_s)
  return [check("base solver: held-out greedy accuracy", m["solver"], *SOLVER_RANGE),
          check("SFT proposer: valid share in the stage (temperature 1)", m["valid"], low=VALID_MIN),
          check("majority labels right (valid questions)", m["label_correct"], high=LABEL_CORRECT_MAX),
          check("projected minutes of the whole set", whole_s / 60, high=BUDGET_MAX_MIN)]


def main(argv=None) -> int:
  args = parse_driver_args(__doc__, "/tmp/rquest", ARMS, ARCHIVE, argv)
  failed = []

  def proposer(seed: int) -> str:
    return os.path.join(args.root, f"proposer_sft_s{seed}")

  def run(name: str, preset: str, seed: int) -> bool:
    path = os.path.join(args.root, name)
    flags = [f"--config.seed={seed}"] + ([] if preset == "proposer_sft" else
                                         [f"--config.models.proposer.path={proposer(seed)}"])
    if launch(args.root, path, f"configs/rquest.py:{preset}", flags, args.lock, args.dry_run, "rquest", name=name,
              seed=seed):
      failed.append(path)
      return False
    return True

  first = args.seeds[0]
  if not (run(f"proposer_sft_s{first}", "proposer_sft", first) and run(f"gate_s{first}", "gate", first)):
    return finish(args, failed)
  if args.dry_run:
    print("[rquest] dry run: the gate is checked here", flush=True)
  else:
    measures = gate_measures(os.path.join(args.root, f"gate_s{first}"), proposer(first))
    if not record_gate(args.root, "rquest", gate_checks(measures, len(args.seeds), len(args.arms)),
                       measures=measures):
      finish(args, failed)
      return GATE_FAILED
  for seed in args.seeds:
    if not run(f"proposer_sft_s{seed}", "proposer_sft", seed):
      continue                          # no proposer: this seed's arms cannot run
    for arm in args.arms:
      run(f"{arm}_s{seed}", arm, seed)
  return finish(args, failed)


def finish(args, failed: list) -> int:
  if args.archive and not args.dry_run:
    names = archive_with_gate(args.root, args.archive, list(KEYS))
    print(f"[rquest] archived {len(names)} workdir(s) into {args.archive}", flush=True)
  return report("rquest", failed)


if __name__ == "__main__":
  sys.exit(main())
