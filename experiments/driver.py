"""What the experiment drivers and summarisers share: one `launch.py` subprocess per run, each into its own
workdir, skipped when finished and resumed when not, with its wall time and exit status appended to
ROOT/runs.jsonl (`command_walls` reads them back); `spread` formats a mean and min-max over seeds.

A workdir is finished when its last stage evaluated its last step (an SFT stage, which may stop early: its
only evaluation, at the end). An unfinished one is rerun with the same command, which resumes it from its
newest checkpoint. With a lock, a command's wall time includes its wait for the lock.
"""
import json
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def finished(path: str) -> bool:
  try:
    config = json.load(open(os.path.join(path, "config.json")))
    rows = [json.loads(line) for line in open(os.path.join(path, "metrics.jsonl")) if '"eval/accuracy"' in line]
  except (OSError, ValueError):
    return False
  stage = config["stages"][-1]
  last = [r for r in rows if r.get("stage") == stage]
  end = sum(config[s]["steps"] for s in config["stages"])       # global steps: the stages' configured lengths
  return bool(last) and (config[stage].get("kind") == "sft" or last[-1]["step"] == end)


def launch(root: str, path: str, config: str, args: list, lock: str, dry_run: bool, tag: str, **record) -> int:
  """Runs `launch.py --config=<config> --workdir=<path> <args>` unless `path` is finished; `record` goes into
  ROOT/runs.jsonl with the wall time. `lock`: run under `flock LOCK` (do not also hold it around the driver)."""
  if finished(path):
    print(f"[{tag}] {path}: finished, skipped", flush=True)
    return 0
  cmd = [sys.executable, "launch.py", f"--config={config}", f"--workdir={path}"] + list(args)
  if lock:
    cmd = ["flock", lock] + cmd
  print(f"[{tag}] " + " ".join(cmd), flush=True)
  if dry_run:
    return 0
  t0 = time.time()
  rc = subprocess.call(cmd, cwd=REPO)
  wall = time.time() - t0
  with open(os.path.join(root, "runs.jsonl"), "a") as f:
    f.write(json.dumps({**record, "workdir": path, "rc": rc, "wall_s": round(wall, 1), "finished": finished(path),
                        "time": time.time()}) + "\n")
  print(f"[{tag}] {path}: exit {rc} after {wall:.0f} s", flush=True)
  return rc


def command_walls(root: str) -> dict:
  """{workdir: its commands' wall seconds} from ROOT/runs.jsonl (a resumed run's parts add up)."""
  walls = {}
  try:
    for line in open(os.path.join(root, "runs.jsonl")):
      r = json.loads(line)
      walls[r["workdir"]] = walls.get(r["workdir"], 0.0) + r["wall_s"]
  except OSError:
    pass
  return walls


def spread(xs, fmt="{:.3f}") -> str:
  """One value as it is; several as "mean (min-max)"."""
  if len(xs) == 1:
    return fmt.format(xs[0])
  return f"{fmt.format(np.mean(xs))} ({fmt.format(min(xs))}-{fmt.format(max(xs))})"
