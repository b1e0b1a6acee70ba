"""Converts the official ProcessBench files to one rlkit JSONL file, served by the `processbench` task:

  python -m rlkit.data.processbench_convert --official=DIR --out=FILE.jsonl

DIR holds the Qwen/ProcessBench subsets as <subset>.json or <subset>.jsonl (e.g. written with
`datasets.load_dataset('Qwen/ProcessBench', split='gsm8k').to_json('gsm8k.jsonl')`), or is one such file. Each
output row is `load_processbench`'s example (rlkit/data/processbench.py), its `subset` (the file stem) included,
so an evaluation can report F1 per subset.

The command lives in its own module because rlkit/data/processbench.py registers tasks on import: run as
`__main__` it would be imported a second time and register them twice.
"""
from __future__ import annotations

import argparse
import json
import os
from typing import Optional, Sequence

from rlkit.data.processbench import load_processbench


def main(argv: Optional[Sequence[str]] = None) -> None:
  """Converts official ProcessBench files (a folder of <subset>.json(l), or one file) to one rlkit JSONL file."""
  parser = argparse.ArgumentParser(prog="python -m rlkit.data.processbench_convert", description=main.__doc__)
  parser.add_argument("--official", required=True, help="folder of gsm8k.json, math.json, ... or one such file")
  parser.add_argument("--out", required=True, help="the JSONL file to write")
  args = parser.parse_args(argv)
  try:
    examples = load_processbench(args.official)
  except (OSError, ValueError) as e:
    raise SystemExit(f"error: {e}") from None
  tmp = args.out + ".tmp"
  try:
    with open(tmp, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(e) + "\n" for e in examples)
    os.replace(tmp, args.out)       # never a half-written file under the real name
  except OSError as e:
    if os.path.exists(tmp):
      os.remove(tmp)
    raise SystemExit(f"error: cannot write {args.out}: {e}") from None
  print(f"wrote {len(examples)} examples ({', '.join(sorted({e['subset'] for e in examples}))}) to {args.out}")


if __name__ == "__main__":
  main()
