"""Driver of experiments/onepo: the calibration gate, then every arm of every seed from the base, then the archive.

  python experiments/onepo/run.py --root=/tmp/onepo                        # gate, 3 seeds x 4 arms, archive
  python experiments/onepo/run.py --root=DIR --seeds=0 --arms=grpo,huatuo
  python experiments/onepo/run.py --root=DIR --dry_run                     # print the commands only
  python experiments/onepo/summarize.py --root=experiments/onepo/runs      # the tables and plot, from the archive

Besides the shared flags (--root, --seeds, --arms, --lock, --dry_run, --archive: experiments/gate.py), --model=PATH
starts every run from that base instead of experiments/base/model (a smoke run on a stand-in).

1. The gate (README "Calibration gate"): `configs/onepo.py:gate` into DIR/gate with seed 0 (the base evaluated
   at its start, greedy and pass@k), then `gate_checks` of that evaluation and of the teacher's rows as the
   augmenters build them (`teacher_accuracy`), recorded in DIR/gate.json (experiments/gate.py). A failed gate
   stops the driver before any arm (exit GATE_FAILED), after archiving the gate.
2. The arms: `configs/onepo.py:<arm>` into DIR/<arm>_s<seed>, seed by seed.
3. The archive (`--archive`, default experiments/onepo/runs; '' none): each finished workdir's config.json and its
   metrics cut to what summarize.py reads (`ARCHIVE_KEYS`), the wall records, and gate.json.

Finished workdirs are skipped, unfinished ones resumed (experiments/driver.py); DIR/runs.jsonl gets each
command's wall time. Every launch shares one persistent XLA compilation cache, DIR/jax_cache (unless
JAX_COMPILATION_CACHE_DIR is set): arms and seeds compile the same programs, and a cache hit is the executable a
fresh compile gives.
"""
import argparse
import os
import sys

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs.onepo import ARMS, BASE_MODEL, GATE, get_config  # noqa: E402
from experiments.driver import launch, report  # noqa: E402
from experiments.gate import GATE_FAILED, archive_with_gate, check, parse_driver_args, record_gate  # noqa: E402
from experiments.onepo.summarize import ARCHIVE_KEYS  # noqa: E402

CONFIG = "configs/onepo.py"
ARCHIVE = os.path.join("experiments", "onepo", "runs")


def teacher_accuracy(model_path: str, seed: int = 0) -> float:
  """The share of the gate's held-out hard problems whose teacher row, as the augmenters build it (the
  demonstration in the base's tokens, cut to rl.max_new_tokens, then the end token), the task's verifier accepts."""
  from rlkit.data.splits import generate_test_split
  from rlkit.data.tasks import make_task
  from rlkit.models.tokenizer import decode_responses
  from rlkit.train.models import tokenizer_from_spec
  from rlkit.train.phases.augment import response_rows
  c = get_config("gate")
  task = make_task(c.task.name, **c.task.kwargs.to_dict())
  tok = tokenizer_from_spec({"kind": "hf", "path": model_path})
  problems = generate_test_split(task, c.eval.num_examples, seed)
  rows, mask = response_rows(tok, [task.demonstration(p) for p in problems], c.rl.max_new_tokens, tok.pad_id)
  texts = decode_responses(tok, rows, mask.sum(1))
  return float(np.mean([task.verify(t, p["answer"]) for t, p in zip(texts, problems)]))


def start_eval(path: str) -> dict:
  """The evaluation row a run logged at its start (the loaded base, before any update), or {}."""
  from rlkit.train.metrics import read_metrics
  from rlkit.train.stages import AT_STAGE_START
  if not os.path.exists(os.path.join(path, "metrics.jsonl")):
    return {}
  rows = [r for r in read_metrics(os.path.join(path, "metrics.jsonl")) if r.get(AT_STAGE_START)]
  return rows[0] if rows else {}


def gate_checks(start: dict, teacher: float) -> list:
  """G1-G3 (configs/onepo.py GATE, README "Calibration gate") from the base's start evaluation and the teacher's
  accuracy; a value the run did not log is NaN, which fails its check."""
  k = GATE["pass_k"]
  return [check("G1 the teacher's rows verify on the hard task", teacher, low=GATE["teacher_min"]),
          check(f"G2 the base's pass@{k} on the hard task", start.get(f"eval/pass@{k}", np.nan),
                high=GATE["base_pass_max"]),
          check("G3 the base's greedy accuracy one step below", start.get("eval/below/accuracy", np.nan),
                low=GATE["below_min"])]


def main(argv=None) -> int:
  own = argparse.ArgumentParser(add_help=False)
  own.add_argument("--model", default="")
  flags, rest = own.parse_known_args(argv)
  args = parse_driver_args(__doc__, "/tmp/onepo", ARMS, ARCHIVE, rest)
  extra = [f"--config.model.path={flags.model}"] if flags.model else []
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(args.root, "jax_cache"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))     # a size limit turns on its file lock
  gate = os.path.join(args.root, "gate")
  if launch(args.root, gate, f"{CONFIG}:gate", ["--config.seed=0", *extra], args.lock, args.dry_run, "onepo",
            name="gate", seed=0):
    return finish(args, [gate])
  if args.dry_run:
    print("[onepo] dry run: the gate is checked here", flush=True)
  else:
    base = start_eval(gate)
    if not record_gate(args.root, "onepo", gate_checks(base, teacher_accuracy(flags.model or BASE_MODEL)),
                       base={k: v for k, v in base.items() if k.startswith("eval/")}):
      finish(args, [])
      return GATE_FAILED
  failed = []
  for seed in args.seeds:
    for arm in args.arms:
      path = os.path.join(args.root, f"{arm}_s{seed}")
      if launch(args.root, path, f"{CONFIG}:{arm}", [f"--config.seed={seed}", *extra], args.lock, args.dry_run,
                "onepo", name=arm, seed=seed):
        failed.append(path)
  return finish(args, failed)


def finish(args, failed: list) -> int:
  if args.archive and not args.dry_run:
    names = archive_with_gate(args.root, args.archive, ARCHIVE_KEYS)
    print(f"[onepo] archived {len(names)} workdir(s) into {args.archive}: {', '.join(names) or '-'}", flush=True)
  return report("onepo", failed)


if __name__ == "__main__":
  sys.exit(main())
