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
  gate_then_arms(...)                    a whole driver: the gate's runs from the base, the gate, the budget
                                         projection (`budget_projection`), every arm, the archive (slca_grpo, srd)
  pooled_rows(paths)                     the gate runs' training rows, start evaluations and iteration seconds
  pooled_means(paths, means)             a frozen gate's measure: metric means over pooled_rows, start accuracy,
                                         median iteration seconds
  results_head(name, root)               results.md's opening: commits, walls, regenerate command, gate table
  gate_summary_lines(root)               a summary's gate section: the table, the measured numbers, the budget
  parse_summary_args(doc, archive, ...)  a summary's --root (default the archive), --seeds, --out; prints the gate
"""
import argparse
import json
import math
import os
import shutil
from typing import Callable, NamedTuple, Optional

import numpy as np

from experiments.archive import archive
from experiments.driver import (add_summary_args, command_walls, commits, finished, launch, parse_args, read_json,
                                report)

GATE_FAILED = 2               # a driver's exit status when its gate failed (1: a run failed)
BUDGET_EXCEEDED = 3           # gate_then_arms's exit status when the gate's timing projects the set past its budget
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


def parse_driver_args(doc: str, root: str, arms, archive_dest: str, argv=None,
                      budget: bool = False) -> argparse.Namespace:
  """experiments/driver.py's `parse_args` (--root, --seeds, --arms, --lock, --dry_run) plus `--archive` (default
  `archive_dest`, given relative to the repository root as the summary will read it; '' archives nothing) and,
  with `budget` (a driver with a budget rule: `gate_then_arms`), `--ignore_budget` (args.ignore_budget)."""
  pre = argparse.ArgumentParser(add_help=False)
  pre.add_argument("--archive", default=archive_dest)
  if budget:
    pre.add_argument("--ignore_budget", action="store_true")
  known, rest = pre.parse_known_args(argv)
  args = parse_args(doc + f"\n\n--archive=DIR archives the finished runs there (default {archive_dest}; '' none).",
                    root, arms, rest)
  args.archive = known.archive
  args.ignore_budget = bool(getattr(known, "ignore_budget", False))
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


# ---------------------------------------------------------------------------------------------------------------
# A gate of frozen runs from the base, a budget projected from their timing, then the arms (slca_grpo, srd).

def pooled_rows(paths) -> tuple[list, list, list]:
  """(every training row of the workdirs `paths`, their start evaluations' eval/accuracy, the seconds of every
  iteration but each run's first, which compiles)."""
  from rlkit.train.metrics import read_metrics
  from rlkit.train.stages import AT_STAGE_START
  train, starts, later = [], [], []
  for path in paths:
    rows = read_metrics(os.path.join(path, "metrics.jsonl"))
    its = [r for r in rows if "step_s" in r]
    train += its
    later += [r["step_s"] for r in its[1:]]
    starts += [r["eval/accuracy"] for r in rows if r.get(AT_STAGE_START) and "eval/accuracy" in r]
  return train, starts, later


def pooled_means(paths, means: dict, start: str = "start_accuracy") -> dict:
  """A frozen gate's measure over its runs' `pooled_rows`: {name: the mean of metric key over the training rows
  that have it, for each of `means` ({name: key}); iterations; `start` (the start evaluations' mean accuracy, where
  the runs evaluated at their start); iteration_s (the median iteration, each run's first left out)}; NaN where
  nothing was measured."""
  train, starts, later = pooled_rows(paths)
  out = {}
  for name, key in means.items():
    values = [r[key] for r in train if key in r]
    out[name] = float(np.mean(values)) if values else math.nan
  out["iterations"] = len(train)
  if starts:
    out[start] = float(np.mean(starts))
  out["iteration_s"] = float(np.median(later)) if later else math.nan
  return out


def budget_projection(root: str, gate_paths, arm_runs: int, gate_steps: int, iteration_s: float, steps: int,
                      budget_minutes: float, window: int, extra_s: Optional[Callable[[int], float]] = None,
                      max_steps: Optional[int] = None) -> dict:
  """The whole set's projected wall in minutes: the gate's runs (`gate_paths`) as measured (ROOT/runs.jsonl), plus
  `arm_runs` arm runs, each as long as a gate run plus its `steps - gate_steps` more iterations at `iteration_s`
  and `extra_s(steps)` more seconds (evaluations, checkpoints); and the largest STEPS, a multiple of `window` below
  100 x `max_steps` (default `steps`), that fits `budget_minutes` (0: not even 2 x window fits, the verdicts need
  a first and a last window apart; None: not measured, a gate run has no wall record or no iteration time)."""
  walls = command_walls(root)
  gate = [walls.get(path, math.nan) for path in gate_paths]
  cap = steps if max_steps is None else max_steps

  def minutes(n: int) -> float:
    arm = float(np.mean(gate)) + (n - gate_steps) * iteration_s + (extra_s(n) if extra_s else 0.0)
    return (sum(gate) + arm_runs * arm) / 60.0

  fit = None
  if math.isfinite(minutes(cap)):
    fit = 0
    while fit < 100 * cap and minutes(fit + window) <= budget_minutes:
      fit += window
    fit = fit if fit >= 2 * window else 0
  return {"minutes": minutes(steps), "budget_minutes": budget_minutes, "steps": steps, "iteration_s": iteration_s,
          "steps_that_fit": fit}


def finish_driver(args, tag: str, keys, failed: list, files=()) -> int:
  """A driver's end: the archive (`args.archive`, unless '' or a dry run; with `files`, names under ROOT copied
  beside the runs), then its exit status (`report`)."""
  if args.archive and not args.dry_run:
    names = archive_with_gate(args.root, args.archive, keys, files)
    print(f"[{tag}] archived {len(names)} workdir(s) into {args.archive}: {', '.join(names) or '-'}", flush=True)
  return report(tag, failed)


def gate_then_arms(args, *, tag: str, config: str, gate_seeds, gate_paths, measure, checks, budget, steps: int,
                   arm_runs: int, budget_minutes: float, keys, extra=(), ignore_budget: bool = False,
                   launch_fn=launch, rev: str = "") -> int:
  """The driver of an experiment whose arms start from the base and whose gate is a frozen preset of its own:
  1. `CONFIG:gate` into each of `gate_paths` with its seed of `gate_seeds` (whatever --seeds says: the gate is
     pooled over those); a failed launch stops here. On a dry run the gate and the budget are not checked.
  2. The gate: `checks(measure(gate_paths))` recorded in ROOT/gate.json with the measured numbers and
     `budget(root, measured["iteration_s"])`; a failed gate stops before any arm (GATE_FAILED).
  3. The budget: past `budget_minutes` (the projection's "minutes") no arm runs (BUDGET_EXCEEDED) unless
     `ignore_budget`; the STEPS that would fit is printed.
  4. Every arm of `args.arms`, seed by seed, into ROOT/<arm>_s<seed>; then the archive (`finish_driver`).
  `extra`: arguments of every launch (e.g. --config.model.path); `launch_fn`: experiments/driver.py's `launch`
  (a test passes its guard); `rev`: the commit recorded with each launch."""
  failed = []

  def run(path, preset, seed, name):
    if launch_fn(args.root, path, f"{config}:{preset}", [f"--config.seed={seed}", *extra], args.lock, args.dry_run,
                 tag, name=name, seed=seed, commit=rev):
      failed.append(path)

  for seed, path in zip(gate_seeds, gate_paths):
    run(path, "gate", seed, "gate")
  if failed:
    return finish_driver(args, tag, keys, failed)
  if args.dry_run:
    print(f"[{tag}] dry run: the gate and the budget are checked here", flush=True)
  elif not all(finished(path) for path in gate_paths):
    return finish_driver(args, tag, keys, [path for path in gate_paths if not finished(path)])
  else:
    measured = measure(gate_paths)
    projection = budget(args.root, measured["iteration_s"])
    if not record_gate(args.root, tag, checks(measured), measured=measured, budget=projection):
      finish_driver(args, tag, keys, [])
      return GATE_FAILED
    print(f"[{tag}] budget: the gate and {arm_runs} arm runs of {steps} iterations "
          f"(~{projection['iteration_s']:.2f} s each) project to {projection['minutes']:.0f} of {budget_minutes} "
          f"minutes; STEPS that fit: {projection['steps_that_fit']}", flush=True)
    if projection["minutes"] > budget_minutes and not ignore_budget:
      print(f"[{tag}] over budget: no arm runs. README 'Budget': lower STEPS in {config} to "
            f"{projection['steps_that_fit']}, record the change, rerun (or pass --ignore_budget)", flush=True)
      finish_driver(args, tag, keys, [])
      return BUDGET_EXCEEDED
  for seed in args.seeds:
    for arm in args.arms:
      run(os.path.join(args.root, f"{arm}_s{seed}"), arm, seed, arm)
  return finish_driver(args, tag, keys, failed)


def results_head(name: str, root: str, wall_note: str = "") -> list:
  """The opening lines of experiments/<name>/results.md: the pre-registration commit (the one that added its
  README.md), the runs' commits, commands and wall minutes (`wall_note` after the minutes), the command that
  regenerates it, the gate table, then the verdicts' heading."""
  pre, ran, minutes, n = commits(root, f"experiments/{name}/README.md")
  return [f"# {name}: results", "",
          f"Pre-registration `{pre}`; runs at {ran}; {n} commands, {minutes:.0f} wall minutes{wall_note}. Regenerate: "
          f"`python experiments/{name}/summarize.py --root=experiments/{name}/runs --out=experiments/{name}`.", "",
          *gate_table(root), "", "## Verdicts", ""]


def gate_summary_lines(root: str) -> list:
  """A summary's gate section: `gate_table`, then the numbers the gate measured and its budget projection, where
  gate.json has them."""
  gate = read_gate(root)
  lines = [*gate_table(root), ""]
  measured = (gate or {}).get("measured") or {}
  if measured:
    lines += ["Measured on the base (the gate's runs pooled): " + ", ".join(
        f"{k} {v:.4g}" if isinstance(v, (int, float)) else f"{k} {v}" for k, v in measured.items()), ""]
  if (gate or {}).get("budget"):
    b = gate["budget"]
    lines += [f"Budget projection from the gate: {b['minutes']:.0f} of {b['budget_minutes']} minutes for "
              f"{b['steps']} iterations per arm ({b['iteration_s']:.2f} s an iteration); STEPS that fit: "
              f"{b['steps_that_fit']}", ""]
  return lines
