"""What the experiments' calibration gates share (issue 31): a gate states the minimum capability a test needs, is
checked by the driver after the gate's runs and before any arm, is written to ROOT/gate.json, and stops the
driver (exit GATE_FAILED) when it fails; the archive keeps gate.json beside the runs, and the summary prints it.

  check(name, value, low=, high=)        one criterion: value >= low and/or <= high (NaN fails)
  record_gate(root, tag, checks, ...)    prints the checks, writes ROOT/gate.json, returns whether it passed
  read_gate(root), gate_table(root)      gate.json back, and as markdown lines for a summary
  projected_minutes(root, runs, more)    the measured wall of `runs` plus `more[name]` more runs as long as each
  archive_with_gate(root, dest, keys)    experiments/archive.py, then gate.json (and `files`) beside the runs
  parse_driver_args(doc, root, arms, archive)   experiments/driver.py's command line plus --archive
"""
import argparse
import json
import math
import os
import shutil
from typing import NamedTuple, Optional

from experiments.archive import archive
from experiments.driver import command_walls, parse_args, read_json

GATE_FAILED = 2               # a driver's exit status when its gate failed (1: a run failed)
GATE_FILE = "gate.json"


class Check(NamedTuple):
  name: str
  value: float
  low: Optional[float]
  high: Optional[float]
  passed: bool


def check(name: str, value, low: Optional[float] = None, high: Optional[float] = None) -> Check:
  """One criterion of a gate: passed when `value` is a number at least `low` and at most `high` (each optional);
  a NaN (a run that did not report) fails."""
  value = float(value)
  passed = not math.isnan(value) and (low is None or value >= low) and (high is None or value <= high)
  return Check(name, value, low, high, passed)


def bound(c) -> str:
  """">= 0.1", "<= 135" or ">= 0.1, <= 0.9" of a check (a Check or its gate.json dict)."""
  low, high = (c.low, c.high) if isinstance(c, Check) else (c.get("low"), c.get("high"))
  return ", ".join(([f">= {low:.4g}"] if low is not None else []) + ([f"<= {high:.4g}"] if high is not None else []))


def check_line(c: Check) -> str:
  return f"{c.name} = {c.value:.4g} ({bound(c)}): {'ok' if c.passed else 'FAIL'}"


def record_gate(root: str, tag: str, checks, passed: Optional[bool] = None, **extra) -> bool:
  """Prints every check, writes ROOT/gate.json ({"passed", "checks", **extra}) and says whether the gate passed
  (`passed`, default: every check did)."""
  checks = list(checks)
  passed = all(c.passed for c in checks) if passed is None else bool(passed)
  for c in checks:
    print(f"[{tag}] gate: {check_line(c)}", flush=True)
  gate = {"passed": passed, "checks": [c._asdict() for c in checks], **extra}
  tmp = os.path.join(root, GATE_FILE + ".tmp")
  with open(tmp, "w") as f:
    json.dump(gate, f, indent=1)
    f.write("\n")
  os.replace(tmp, os.path.join(root, GATE_FILE))
  print(f"[{tag}] calibration gate {'passed' if passed else 'FAILED: no arm runs'} "
        f"({os.path.join(root, GATE_FILE)})", flush=True)
  return passed


def read_gate(root: str):
  """ROOT/gate.json, or None where the gate was not checked."""
  path = os.path.join(root, GATE_FILE)
  return read_json(path) if os.path.exists(path) else None


def gate_table(root: str) -> list:
  """The gate as markdown lines: its outcome, then one row per check."""
  gate = read_gate(root)
  if gate is None:
    return ["Calibration gate: not checked (no gate.json)"]
  lines = [f"Calibration gate: **{'passed' if gate['passed'] else 'failed'}**", "",
           "| check | value | bound | outcome |", "|---|---|---|---|"]
  for c in gate.get("checks", []):
    lines.append(f"| {c['name']} | {c['value']:.4g} | {bound(c)} | {'ok' if c['passed'] else 'FAIL'} |")
  return lines


def projected_minutes(root: str, runs, more: Optional[dict] = None) -> float:
  """Minutes of a whole set, from the gate's runs: the measured command walls (ROOT/runs.jsonl) of `runs` (names
  under ROOT), plus `more[name]` further runs as long as run `name` each. NaN when a wall is missing."""
  walls = command_walls(root)

  def wall(name):
    return walls.get(os.path.join(root, name), math.nan)
  total = sum(wall(name) for name in runs) + sum(n * wall(name) for name, n in (more or {}).items())
  return total / 60.0


def archive_with_gate(root: str, dest: str, keys, files=()) -> list:
  """experiments/archive.py's `archive` of ROOT into DEST, then ROOT/gate.json and each of `files` (names under
  ROOT) copied beside the runs; returns the workdirs archived now."""
  names = archive(root, dest, list(keys))
  for name in (GATE_FILE, *files):
    if os.path.exists(os.path.join(root, name)):
      shutil.copy(os.path.join(root, name), os.path.join(dest, name))
  return names


def parse_driver_args(doc: str, root: str, arms, archive_dest: str, argv=None) -> argparse.Namespace:
  """experiments/driver.py's `parse_args` (--root, --seeds, --arms, --lock, --dry_run) plus `--archive` (default
  `archive_dest`, given relative to the repository root as the summary will read it; '' archives nothing)."""
  pre = argparse.ArgumentParser(add_help=False)
  pre.add_argument("--archive", default=archive_dest)
  known, rest = pre.parse_known_args(argv)
  args = parse_args(doc + f"\n\n--archive=DIR archives the finished runs there (default {archive_dest}; '' none).",
                    root, arms, rest)
  args.archive = known.archive
  return args
