"""Builds the pretrained base (experiments/base/README.md): tokenizer, pretraining, export, skill table.

  python experiments/base/build.py --workdir=/tmp/base [--preset=base] [--out=experiments/base/model]

1. tokenizer: byte-level BPE (rlkit/models/bpe.py, digits split) trained on `--tokenizer_rows` examples drawn
   from the corpus's own mixture with a seed stream of their own -> WORKDIR/tokenizer.
2. pretraining: `launch.py --config=experiments/base/config.py:PRESET --workdir=WORKDIR/run` with that
   tokenizer, in a child process. Rerunning the build resumes it from its newest checkpoint (the run's own
   resume: the same rows, bit for bit, as an uninterrupted run), so the build may span several sessions.
3. export: the final checkpoint's weights in bfloat16 as a Hugging Face folder with the tokenizer (`--out`),
   and OUT/../<name>.json: the SHA-256 of every file of the folder, the commit, this command, the parameter
   count and the held-out accuracy per skill from the run's final evaluation.

Every step is a pure function of the commit and the preset: the same command on the same commit rebuilds the
same bytes on CPU (tests/experiments/test_base_build.py rebuilds the `tiny` preset twice and compares the
hashes).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

VOCAB_SIZE = 1024          # a ceiling: the corpus's words run out of merges below it


def corpus_texts(config, count: int) -> list[str]:
  """`count` examples of the config's mixture as pretraining text (prompt + demonstration), drawn from a
  seed stream the data splits never use ([seed, 2]; rlkit.data.splits uses [seed, 0] and [seed, 1])."""
  import numpy as np

  import rlkit.data  # noqa: F401  (registers the tasks)
  from rlkit.data.tasks import make_task

  task = make_task(config.task.name, **config.task.kwargs.to_dict())
  rng = np.random.default_rng([config.seed, 2])
  texts = []
  for _ in range(count):
    example = task.make_example(rng)
    texts.append(example["prompt"] + task.demonstration(example))
  return texts


def build_tokenizer(config, folder: str, rows: int) -> str:
  """Trains the BPE on `rows` corpus examples into `folder` (skipped when the folder is complete: it is
  deterministic)."""
  from rlkit.models.bpe import save_tokenizer_folder, train_bpe

  if os.path.exists(os.path.join(folder, "tokenizer_config.json")):
    return folder
  tok = train_bpe(corpus_texts(config, rows), VOCAB_SIZE, split_digits=True)
  tmp = folder + ".tmp"
  save_tokenizer_folder(tok, tmp)
  os.replace(tmp, folder)
  return folder


def build_commit(workdir: str) -> str:
  """The commit the build started from, kept in WORKDIR/commit: a build resumed in a later session, after
  more commits, still names the code that ran it (rebuild from that commit)."""
  from benchmarks._common import commit

  path = os.path.join(workdir, "commit")
  if not os.path.exists(path):
    with open(path, "w") as f:
      f.write(commit() + "\n")
  with open(path) as f:
    return f.read().strip()


def pretrain(preset: str, workdir: str, tokenizer: str, extra: list[str]) -> None:
  cmd = [sys.executable, os.path.join(ROOT, "launch.py"), f"--config={ROOT}/experiments/base/config.py:{preset}",
         f"--workdir={workdir}", f"--config.tokenizer.path={tokenizer}", *extra]
  print("+", " ".join(cmd), flush=True)
  subprocess.run(cmd, check=True)


def final_eval(workdir: str) -> dict:
  with open(os.path.join(workdir, "metrics.jsonl")) as f:
    rows = [json.loads(line) for line in f if line.strip()]
  evals = [r for r in rows if "eval/accuracy" in r]
  if not evals:
    raise SystemExit(f"build: {workdir}/metrics.jsonl has no evaluation; the pretraining did not finish.")
  return evals[-1]


def export(workdir: str, tokenizer: str, out: str, command: str, commit: str) -> dict:
  """The run's final weights in bf16 as a Hugging Face folder `out`, and its record (module docstring)."""
  import jax
  import jax.numpy as jnp

  from rlkit.data.tfds_builders import file_sha256
  from rlkit.models import hf
  from rlkit.models.tokenizer import HFTokenizer
  from rlkit.models.transformer import num_params
  from rlkit.train.models import load_model

  module, params, _ = load_model(workdir)[:3]
  bf16 = jax.tree.map(lambda x: x.astype(jnp.bfloat16), params)
  hf.save(out, module.cfg.replace(param_dtype="bfloat16"), bf16, overwrite=True, tokenizer=HFTokenizer(tokenizer))
  last = final_eval(workdir)
  record = {
      "files": {name: file_sha256(os.path.join(out, name)) for name in sorted(os.listdir(out))},
      "commit": commit, "command": command, "params": int(num_params(params)), "step": last["step"],
      "skills": {k.split("/", 2)[2]: v for k, v in sorted(last.items()) if k.startswith("eval/accuracy/")},
      "accuracy": last["eval/accuracy"],
  }
  with open(out.rstrip("/") + ".json", "w") as f:
    json.dump(record, f, indent=1)
    f.write("\n")
  return record


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  p.add_argument("--workdir", required=True, help="tokenizer and pretraining run (resumed when it exists)")
  p.add_argument("--preset", default="base", help="experiments/base/config.py preset")
  p.add_argument("--out", default="", help="the exported Hugging Face folder (default WORKDIR/model)")
  p.add_argument("--tokenizer_rows", type=int, default=50_000, help="corpus examples the BPE is trained on")
  p.add_argument("--set", action="append", default=[], help="extra launch flag, e.g. --config.sft.steps=10")
  args = p.parse_args(argv)
  from experiments.base.config import get_config

  config = get_config(args.preset)
  os.makedirs(args.workdir, exist_ok=True)
  started_at = build_commit(args.workdir)
  tokenizer = build_tokenizer(config, os.path.join(args.workdir, "tokenizer"), args.tokenizer_rows)
  run = os.path.join(args.workdir, "run")
  pretrain(args.preset, run, tokenizer, args.set)
  command = " ".join(["python experiments/base/build.py", f"--preset={args.preset}", "--workdir=WORKDIR",
                      f"--tokenizer_rows={args.tokenizer_rows}",
                      *(f"--out={args.out}" for _ in [0] if args.out), *(f"--set={s}" for s in args.set)])
  record = export(run, tokenizer, args.out or os.path.join(args.workdir, "model"), command, started_at)
  print(json.dumps({k: record[k] for k in ("params", "step", "accuracy", "skills")}), flush=True)


if __name__ == "__main__":
  main()
