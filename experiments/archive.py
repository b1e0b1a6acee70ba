"""Keep what an experiment's summary reads of its finished workdirs, in the repository: an experiment longer
than one working session (the baselines table: about 70 CPU-minutes a seed) then gathers its seeds over
several sessions, whose /tmp does not survive.

  python experiments/archive.py --root=/tmp/baselines --dest=experiments/baselines/runs \
      --keys=stage,step,step_s,eval/,response_len_wrong,clip_frac,sampling_rounds

For every finished workdir ROOT/<name> (experiments/driver.py `finished`): DEST/<name>/config.json as it is,
and DEST/<name>/metrics.jsonl with each row cut to the keys that equal one of `--keys` or start with one
ending in "/" (rows left empty are dropped); ROOT/runs.jsonl's records of the archived workdirs go to
DEST/runs.jsonl with their workdir moved under DEST. A summary run with `--root=DEST` then reads the archive
as it would the workdirs (give DEST relative to the repository root, as the summary command will: the wall
records name the workdirs under DEST as given). An unfinished workdir is skipped (a resumed run would otherwise be archived half);
a name already archived is left as it is.
"""
import argparse
import json
import os
import shutil
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from experiments.driver import finished  # noqa: E402


def keep(row: dict, keys: list[str]) -> dict:
  """`row` cut to the keys that equal one of `keys` or start with one that ends in '/'."""
  return {k: v for k, v in row.items()
          if any(k == p or (p.endswith("/") and k.startswith(p)) for p in keys)}


def archive(root: str, dest: str, keys: list[str]) -> list[str]:
  """Archives every finished workdir of ROOT not yet in DEST (module docstring); returns the names archived."""
  os.makedirs(dest, exist_ok=True)
  done = []
  for name in sorted(os.listdir(root)):
    src, out = os.path.join(root, name), os.path.join(dest, name)
    if not os.path.isdir(src) or os.path.exists(out) or not finished(src):
      continue
    tmp = out + ".tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    shutil.copy(os.path.join(src, "config.json"), tmp)
    with open(os.path.join(src, "metrics.jsonl")) as f, open(os.path.join(tmp, "metrics.jsonl"), "w") as g:
      for line in f:
        row = keep(json.loads(line), keys) if line.strip() else {}
        if set(row) - {"stage", "step"}:
          g.write(json.dumps(row) + "\n")
    os.replace(tmp, out)                    # a half-copied workdir never looks archived
    done.append(name)
  runs = os.path.join(root, "runs.jsonl")
  if done and os.path.exists(runs):
    with open(runs) as f, open(os.path.join(dest, "runs.jsonl"), "a") as g:
      for line in f:
        record = json.loads(line)
        name = os.path.basename(os.path.normpath(record.get("workdir", "")))
        if name in done:
          g.write(json.dumps(dict(record, workdir=os.path.join(dest, name))) + "\n")
  return done


def main(argv=None) -> None:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", required=True, help="the driver's folder of workdirs")
  p.add_argument("--dest", required=True, help="the archive folder (in the repository)")
  p.add_argument("--keys", required=True, help="comma-separated metric keys; a key ending in '/' is a prefix")
  args = p.parse_args(argv)
  names = archive(args.root, args.dest, [k for k in args.keys.split(",") if k])
  print(f"archived {len(names)} workdir(s) into {args.dest}: {', '.join(names) or '-'}")


if __name__ == "__main__":
  main()
