"""Driver of experiments/tips: the start policy, the final-answer baseline and the supervised verifier of every
seed (the calibration gate), then the outcome-only RL verifier of every seed.

  python experiments/tips/run.py --root=/tmp/tips                         # gate, then 3 seeds of outcome
  python experiments/tips/run.py --root=DIR --dry_run                     # print the commands only
  python experiments/tips/summarize.py --root=experiments/tips/runs       # the tables and plot, from the archive

Each run is one `launch.py` subprocess (configs/tips.py) into DIR/<arm>_s<seed>. In order:
1. DIR/start_s0: the start policy, SFT of the base on worked verdicts of running-sum chains (seed 0);
2. DIR/final_answer_s<seed>.json: the final-answer checker's eval metrics on the held-out chains of the seed
   (the first eval.num_examples of its test split, the chains every run is evaluated on); no model;
3. `supervised` of every seed, from DIR/start_s0: the gate's runs (also the upper-bound arm);
4. the gate (README): G0 the start policy's F1 on its own running-sum chains >= START_F1; G1 every seed's
   supervised F1 at least GATE_MARGIN above its final-answer baseline; G2 the supervised F1 at least GATE_MARGIN
   above the start policy's on the running-difference chains (each run's evaluation at its start), on the mean
   over seeds. DIR/gate.json records it; when it fails the driver stops here (exit 2);
5. `outcome` of every seed, from DIR/start_s0.
Finished workdirs are skipped, unfinished ones resumed (experiments/driver.py); DIR/runs.jsonl gets each
command's wall time; `--lock=PATH` runs every launch under `flock PATH`. At the end the finished workdirs (cut to
what summarize.py reads), the baselines and gate.json are archived into `--archive` (default
experiments/tips/runs; '' skips).
"""
import json
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.tips import get_config  # noqa: E402
from experiments.driver import launch, read_json, report  # noqa: E402
from experiments.gate import GATE_FAILED, archive_with_gate, check, parse_driver_args, record_gate  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

ARMS = ("supervised", "outcome")
START = "start_s0"         # the start policy's workdir under DIR (both arms start from it)
START_F1 = 50.0            # G0: the start policy verifies its own chains (the final-answer floor is ~30)
ARCHIVE = "experiments/tips/runs"
KEYS = ("stage", "step", "step_s", "at_stage_start", "eval/", "reward", "reward/", "informative_groups", "entropy",
        "response_len")
F1 = "eval/processbench/f1"
GATE_MARGIN = 10.0         # F1 points (ProcessBench's F1 is in percent)


def final_answer_metrics(seed: int) -> dict:
  """The final-answer checker's eval metrics on the held-out chains of `seed` (what run.py writes)."""
  from rlkit.data import make_task
  from rlkit.data.pipeline import decode_record
  from rlkit.data.processbench import final_answer_baseline
  from rlkit.data.splits import generate_splits
  c = get_config("supervised")
  task = make_task(c.task.name, **dict(c.task.kwargs))
  test = generate_splits(task, c.data.num_train, c.data.num_test, seed)["test"][:c.eval.num_examples]
  totals: dict = {}
  hits = 0.0
  for record in map(decode_record, test):
    verdict = final_answer_baseline({**record["fields"], **record})
    hits += task.verify(verdict, record["answer"])
    for name, value in task.eval_counts(record, verdict).items():
      totals[name] = totals.get(name, 0.0) + value
  return {"seed": seed, "num_examples": len(test), "eval/accuracy": hits / len(test),
          **{f"eval/{k}": v for k, v in task.eval_metrics(totals).items()}}


def f1_at(path: str, start: bool) -> float:
  """The run's ProcessBench F1 at its start (the base) or at its last evaluation; NaN without one."""
  evals = [r for r in read_metrics(os.path.join(path, "metrics.jsonl")) if F1 in r
           and bool(r.get("at_stage_start")) == start]
  return float(evals[-1][F1]) if evals else np.nan


def gate_checks(root: str, seeds) -> list:
  """G0 on the start policy, G1 per seed and G2 on the mean over seeds (module docstring)."""
  checks = [check("start policy's F1 on its running-sum chains", f1_at(os.path.join(root, START), False),
                  low=START_F1)]
  room = []
  for seed in seeds:
    path = os.path.join(root, f"supervised_s{seed}")
    baseline = os.path.join(root, f"final_answer_s{seed}.json")
    floor = read_json(baseline)[F1] if os.path.exists(baseline) else np.nan
    checks.append(check(f"s{seed}: supervised F1 - final-answer F1", f1_at(path, False) - floor, low=GATE_MARGIN))
    room.append(f1_at(path, False) - f1_at(path, True))
  checks.append(check("supervised F1 - the start's F1 (mean over seeds)", np.mean(room), low=GATE_MARGIN))
  return checks


def main(argv=None) -> int:
  args = parse_driver_args(__doc__, "/tmp/tips", ARMS, ARCHIVE, argv)
  failed = []

  start = os.path.join(args.root, START)

  def run(arm: str, seed: int) -> None:
    path = os.path.join(args.root, f"{arm}_s{seed}")
    extra = [] if arm == "start" else [f"--config.model.path={start}"]
    if launch(args.root, path, f"configs/tips.py:{arm}", [f"--config.seed={seed}", *extra], args.lock,
              args.dry_run, "tips", name=arm, seed=seed):
      failed.append(path)

  run("start", 0)
  if failed:
    return finish(args, failed)
  for seed in args.seeds:
    path = os.path.join(args.root, f"final_answer_s{seed}.json")
    if not args.dry_run and not os.path.exists(path):
      with open(path + ".tmp", "w") as f:
        json.dump(final_answer_metrics(seed), f, indent=1)
      os.replace(path + ".tmp", path)
    run("supervised", seed)               # the gate's runs, whatever --arms says
  if failed:
    return finish(args, failed)
  if args.dry_run:
    print("[tips] dry run: the gate is checked here", flush=True)
  elif not record_gate(args.root, "tips", gate_checks(args.root, args.seeds)):
    finish(args, failed)
    return GATE_FAILED
  if "outcome" in args.arms:
    for seed in args.seeds:
      run("outcome", seed)
  return finish(args, failed)


def finish(args, failed: list) -> int:
  if args.archive and not args.dry_run:
    names = archive_with_gate(args.root, args.archive, list(KEYS),
                              files=tuple(f"final_answer_s{s}.json" for s in args.seeds))
    print(f"[tips] archived {len(names)} workdir(s) into {args.archive}", flush=True)
  return report("tips", failed)


if __name__ == "__main__":
  sys.exit(main())
