"""Driver of experiments/tips: per seed, the supervised verifier, the format-only start and the outcome-only RL
verifier from it, and the final-answer baseline scored on the same held-out chains.

  python experiments/tips/run.py --root=/tmp/tips                         # 3 seeds x 3 runs + the baseline
  python experiments/tips/run.py --root=DIR --seeds=0 --arms=supervised
  python experiments/tips/summarize.py --root=DIR                         # the tables and plot

Each run is one `launch.py` subprocess (configs/tips.py) into DIR/<arm>_s<seed>; `outcome` starts from
DIR/format_s<seed> with the same seed. Finished workdirs are skipped, unfinished ones resumed
(experiments/driver.py); DIR/runs.jsonl gets each command's wall time. `--lock=PATH` runs every launch under
`flock PATH`. The final-answer baseline needs no model: DIR/final_answer_s<seed>.json holds its eval metrics on
the first eval.num_examples chains of the seed's test split, the chains every arm is evaluated on.
"""
import json
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.tips import get_config  # noqa: E402
from experiments.driver import launch, parse_args  # noqa: E402

ARMS = ("supervised", "format", "outcome")


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


def main(argv=None) -> int:
  args = parse_args(__doc__, "/tmp/tips", ARMS, argv)
  os.makedirs(args.root, exist_ok=True)
  failed = []
  for seed in args.seeds:
    path = os.path.join(args.root, f"final_answer_s{seed}.json")
    if not args.dry_run and not os.path.exists(path):
      with open(path + ".tmp", "w") as f:
        json.dump(final_answer_metrics(seed), f, indent=1)
      os.replace(path + ".tmp", path)
    for arm in args.arms:
      workdir = os.path.join(args.root, f"{arm}_s{seed}")
      extra = [f"--config.model.path={os.path.join(args.root, f'format_s{seed}')}"] if arm == "outcome" else []
      if launch(args.root, workdir, f"configs/tips.py:{arm}", [f"--config.seed={seed}", *extra], args.lock,
                args.dry_run, "tips", name=arm, seed=seed):
        failed.append(workdir)
  if failed:
    print(f"[tips] failed: {', '.join(failed)}", flush=True)
  return 1 if failed else 0


if __name__ == "__main__":
  sys.exit(main())
