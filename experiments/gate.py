"""What the experiments' calibration gates share (issue 31): a gate states the minimum capability a test needs, is
checked by the driver after the gate's runs and before any arm, is written to ROOT/gate.json, and stops the
driver (exit GATE_FAILED) when it fails; the archive keeps gate.json beside the runs, and the summary prints it.

  check(name, value, low=, high=)        one criterion: value >= low and/or <= high (NaN fails)
  record_gate(root, tag, checks, ...)    prints the checks, writes ROOT/gate.json, returns whether it passed
  read_gate(root), gate_table(root)      gate.json back, and as markdown lines for a summary
  projected_minutes(root, runs, more)    the measured wall of `runs` plus `more[name]` more runs as long as each
  archive_with_gate(root, dest, keys)    experiments/archive.py, then gate.json (and `files`) beside the runs
  parse_driver_args(doc, root, arms, archive)   experiments/driver.py's command line plus --archive
  sft_gate_arms(...)                     a whole driver: SFT from the base per seed, the gate on it, every arm
  parse_summary_args(doc, archive, ...)  a summary's --root (default the archive), --seeds, --out; prints the gate
"""
import argparse
import json
import math
import os
import shutil
from typing import NamedTuple, Optional

from experiments.archive import archive
from experiments.driver import add_summary_args, command_walls, finished, launch, parse_args, read_json, report

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


def parse_summary_args(doc: str, archive_dest: str, argv=None, one_plot: bool = True):
  """A gated experiment's summary command line: --root (default `archive_dest`, the archive), --seeds (default
  0,1,2) and experiments/driver.py's --out; prints the gate's table first. Returns (args, seeds)."""
  p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
  p.add_argument("--root", default=archive_dest, help="the archive (default) or a run's root")
  p.add_argument("--seeds", default="0,1,2")
  add_summary_args(p, one_plot=one_plot)
  args = p.parse_args(argv)
  print("\n".join(gate_table(args.root)) + "\n")
  return args, [int(s) for s in args.seeds.split(",")]


def sft_gate_arms(tag: str, args, config: str, keys, base: str, measure_fn, gate_fn, arm_overrides) -> int:
  """The driver of an experiment whose arms start from one SFT policy per seed (calif, prorubric):
  1. `CONFIG:sft` per seed from `base` into ROOT/sft_s<seed>; 2. the gate: `measure_fn(sft_path, seed)` per seed
  (a rerun reads the numbers ROOT/gate.json kept), `gate_fn(measured)` -> (checks, passed or None, extra: dict
  recorded in gate.json and handed to the arms; `gate_fn({})` on a dry run gives the arms' defaults); on failure the
  runs are archived and GATE_FAILED returned; 3. every arm into ROOT/<arm>_s<seed> from its seed's SFT policy, with
  `arm_overrides(arm, sft_path, extra)` added; 4. the archive (`args.archive`, '' none). `args` is
  `parse_driver_args`'s. Returns the exit status (experiments/driver.py's `report`)."""
  failed = []

  def run(name, seed, preset, overrides):
    path = os.path.join(args.root, f"{name}_s{seed}")
    if launch(args.root, path, f"{config}:{preset}", [f"--config.seed={seed}", *overrides], args.lock,
              args.dry_run, tag, name=name, seed=seed):
      failed.append(path)

  def archive_runs():
    if args.archive and not args.dry_run:
      names = archive_with_gate(args.root, args.archive, keys)
      print(f"[{tag}] archived {len(names)} workdir(s) into {args.archive}", flush=True)

  for seed in args.seeds:
    run("sft", seed, "sft", [f"--config.model.path={base}"])
  if failed:
    return report(tag, failed)
  sfts = {seed: os.path.join(args.root, f"sft_s{seed}") for seed in args.seeds}
  if all(finished(path) for path in sfts.values()):
    kept = (read_gate(args.root) or {}).get("measured", {})      # a rerun reads the numbers it measured
    measured = {seed: kept[str(seed)] if str(seed) in kept else measure_fn(path, seed) for seed, path in sfts.items()}
    checks, passed, extra = gate_fn(measured)
    if not record_gate(args.root, tag, checks, passed=passed, measured=measured, **extra):
      archive_runs()
      return GATE_FAILED
  else:
    _, _, extra = gate_fn({})
    print(f"[{tag}] gate: not evaluated (dry run: its runs have not run){'; the arms get ' if extra else ''}"
          f"{', '.join(f'{k}={v}' for k, v in extra.items())}", flush=True)
  for seed in args.seeds:
    for arm in args.arms:
      run(arm, seed, arm, [f"--config.model.path={sfts[seed]}", *arm_overrides(arm, sfts[seed], extra)])
  archive_runs()
  return report(tag, failed)
