"""What the experiment drivers and summarisers share: one `launch.py` subprocess per run, each into its own
workdir, skipped when finished and resumed when not, with its wall time and exit status appended to
ROOT/runs.jsonl (`command_walls` reads them back); `spread` formats a mean and min-max over seeds (`arm_rows`: an arms table's
rows of them). A summariser
writes its plots into the run root unless `--out` says otherwise (`summary_path`), and prints "smoke run" where
a verdict would be for quick runs (`verdict_or_smoke`). A pre-registered summary names the commit that added
its README and the runs' commits (`commits`) and prints the changes recorded after it (`changes_lines`);
`nan_mean` and `smooth` are its NaN-aware means. `use_compilation_cache` points a driver's launches at one
persistent XLA cache.

A workdir is finished when its last stage evaluated its last step, or the step where an SFT stage stopped
early (`stop_at_loss`; `stage_done`). An unfinished one is rerun with the same command, which resumes it from
its newest checkpoint. With a lock, a command's wall time includes its wait for the lock.
"""
import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SMOKE_RUN = "smoke run"      # what a summary of quick runs prints where a verdict would be


def read_json(path: str):
  """The JSON document at `path` (closed at once: an open file left to the garbage collector is a ResourceWarning)."""
  with open(path) as f:
    return json.load(f)


def is_evaluation(row: dict) -> bool:
  """Whether a metrics row is a held-out evaluation (any stage's: eval/accuracy, an embodied stage's eval/success)."""
  return any(k.startswith("eval/") for k in row)


def stage_done(config: dict, rows: list) -> bool:
  """Whether the last stage of a run (its config.json, its metrics.jsonl rows) ended: its last evaluation is at
  the stage's last configured step, or at the step where the stage stopped early because its loss average fell
  below `stop_at_loss` (an SFT stage's only early end). An SFT stage that evaluates along the way
  (`eval_every`) and was interrupted has evaluations too, at neither."""
  stage = config["stages"][-1]
  end = sum(config[s]["steps"] for s in config["stages"])       # global steps: the stages' configured lengths
  evals = [r for r in rows if r.get("stage") == stage and is_evaluation(r)]
  if not evals:
    return False
  step, threshold = evals[-1]["step"], config[stage].get("stop_at_loss", 0.0)
  return step == end or (bool(threshold) and any(
      r.get("stage") == stage and r.get("step") == step and r.get("loss_ema", threshold) < threshold for r in rows))


def finished(path: str) -> bool:
  try:
    config = read_json(os.path.join(path, "config.json"))
    with open(os.path.join(path, "metrics.jsonl")) as f:
      rows = [json.loads(line) for line in f if line.strip()]
  except (OSError, ValueError):
    return False
  return stage_done(config, rows)


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


def run_script(out: str, script: str, args: list, lock: str, dry_run: bool, tag: str) -> int:
  """`python SCRIPT ARGS` from the repository root (under `flock LOCK`), unless its output OUT exists (a driver's
  measurement step between runs, e.g. an analysis of finished workdirs); its exit status."""
  if os.path.exists(out):
    return 0
  cmd = (["flock", lock] if lock else []) + [sys.executable, script, *args]
  print(f"[{tag}] " + " ".join(cmd), flush=True)
  if dry_run:
    return 0
  t0 = time.time()
  rc = subprocess.call(cmd, cwd=REPO)
  print(f"[{tag}] {script}: exit {rc} after {time.time() - t0:.0f} s", flush=True)
  return rc


def command_walls(root: str) -> dict:
  """{workdir: its commands' wall seconds} from ROOT/runs.jsonl (a resumed run's parts add up)."""
  walls = {}
  try:
    with open(os.path.join(root, "runs.jsonl")) as f:
      for line in f:
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


def arm_rows(runs: dict, arms, columns) -> list:
  """A summary's arms table body: one markdown row per arm of `arms` that has runs ({arm: {seed: values}}), its
  seed count, then `spread` over its seeds of each column of `columns` ([(key, fmt)])."""
  rows = []
  for arm in arms:
    rs = runs.get(arm, {})
    if rs:
      cells = [spread([r[key] for r in rs.values()], fmt) for key, fmt in columns]
      rows.append("| " + " | ".join([arm, str(len(rs)), *cells]) + " |")
  return rows


def parse_args(doc: str, root: str, arms, argv=None) -> argparse.Namespace:
  """A driver's command line: --root, --seeds, --arms (names of `arms`, in `args.arms` as a list), --lock,
  --dry_run."""
  p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
  p.add_argument("--root", default=root, help="folder of every workdir (and runs.jsonl)")
  p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
  p.add_argument("--arms", default=",".join(arms), help="comma-separated names of " + ", ".join(arms))
  p.add_argument("--lock", default="", help="run every launch.py under `flock LOCK`")
  p.add_argument("--dry_run", action="store_true", help="print the commands, run nothing")
  args = p.parse_args(argv)
  args.arms = [a for a in args.arms.split(",") if a]
  if any(a not in arms for a in args.arms):
    p.error(f"unknown arms {[a for a in args.arms if a not in arms]}; known: {', '.join(arms)}")
  args.seeds = [int(x) for x in args.seeds.split(",")]
  os.makedirs(args.root, exist_ok=True)
  return args


def run_from_sft(args: argparse.Namespace, tag: str, config: str, arm_args=None) -> int:
  """The loop of an experiment whose arms share one base policy per seed: `<config>:sft` into ROOT/sft_s<seed>,
  then each of `args.arms` (`<config>:<arm>`) into ROOT/<arm>_s<seed> from that checkpoint with the same seed
  (so every arm sees the same data split), plus `arm_args(arm, sft_workdir)` on its command line if given.
  Returns 1 if any run failed (the failed workdirs are printed)."""
  failed = []
  for seed in args.seeds:
    sft = os.path.join(args.root, f"sft_s{seed}")
    if launch(args.root, sft, f"{config}:sft", [f"--config.seed={seed}"], args.lock, args.dry_run, tag, name="sft",
              seed=seed):
      failed.append(sft)
      continue
    for arm in args.arms:
      path = os.path.join(args.root, f"{arm}_s{seed}")
      extra = list(arm_args(arm, sft)) if arm_args else []
      if launch(args.root, path, f"{config}:{arm}", [f"--config.seed={seed}", f"--config.model.path={sft}", *extra],
                args.lock, args.dry_run, tag, name=arm, seed=seed):
        failed.append(path)
  return report(tag, failed)


def report(tag: str, failed: list) -> int:
  """A driver's exit status: 1 with the failed workdirs printed, 0 when none failed."""
  if failed:
    print(f"[{tag}] failed: {', '.join(failed)}", flush=True)
  return 1 if failed else 0


def add_summary_args(p: argparse.ArgumentParser, quick: str = "", one_plot: bool = True) -> None:
  """A summariser's `--out` (see `summary_path`; a .png only where `one_plot`) and, given `quick` (what the flag
  selects), its `--quick`."""
  def folder(value: str) -> str:
    if value.endswith(".png") and not one_plot:
      raise argparse.ArgumentTypeError(f"{value!r}: this summary writes several plots; pass a folder")
    return value

  p.add_argument("--out", default="", type=folder, help="folder of the plots" + (", or the .png of the plot" if
                 one_plot else "") + " (default: the run root; pass experiments/<method> to refresh the committed "
                 "plots on purpose)")
  if quick:
    p.add_argument("--quick", action="store_true", help=f"{quick}: smoke runs, so '{SMOKE_RUN}' is printed "
                   "instead of verdicts")


def summary_path(out: str, root: str, name: str) -> str:
  """Where a summariser writes its plot `name`: into the folder `out`, or the run root `root` without one. Never
  into the repository by default: a summary of a smoke run, or of someone else's runs, must not overwrite the
  plot a committed results.md shows. An `out` ending in .png is the plot's own path (a one-plot summary)."""
  path = out if out.endswith(".png") else os.path.join(out or root, name)
  os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
  return path


def write_results(out: str, root: str, text: str) -> str:
  """Writes a summary's results.md (where `summary_path` puts it), prints it, and returns its path."""
  path = summary_path(out, root, "results.md")
  with open(path, "w") as f:
    f.write(text)
  print(text)
  return path


def verdict_or_smoke(verdict: str, smoke: bool) -> str:
  """A pre-registered verdict, or SMOKE_RUN for a smoke run: its sizes are too small for the rule to mean
  anything, and a verdict printed from one reads like a result."""
  return SMOKE_RUN if smoke else verdict


def last_eval(path: str):
  """The last held-out evaluation row of a workdir's metrics.jsonl, or None (no run there yet)."""
  from rlkit.train.metrics import read_metrics
  if not os.path.exists(os.path.join(path, "metrics.jsonl")):
    return None
  rows = [r for r in read_metrics(os.path.join(path, "metrics.jsonl")) if is_evaluation(r)]
  return rows[-1] if rows else None


def load_runs(root: str, arms, seeds, load) -> dict:
  """{arm: {seed: load(ROOT/<arm>_s<seed>)}} for the workdirs that exist."""
  runs = {}
  for arm in arms:
    for seed in seeds:
      path = os.path.join(root, f"{arm}_s{seed}")
      if os.path.exists(os.path.join(path, "metrics.jsonl")):
        runs.setdefault(arm, {})[seed] = load(path)
  return runs


def use_compilation_cache(root: str) -> None:
  """Every launch of this process shares one persistent XLA compilation cache, ROOT/jax_cache (unless
  JAX_COMPILATION_CACHE_DIR is set)."""
  os.environ.setdefault("JAX_COMPILATION_CACHE_DIR", os.path.join(root, "jax_cache"))
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.5")
  os.environ.setdefault("JAX_COMPILATION_CACHE_MAX_SIZE", str(2 << 30))     # a size limit turns on its file lock


def git(*args) -> str:
  """`git ARGS` in the repository, stripped; "" where git fails (no repository, no git)."""
  try:
    return subprocess.check_output(["git", *args], text=True, cwd=REPO, stderr=subprocess.DEVNULL).strip()
  except (OSError, subprocess.CalledProcessError):
    return ""


def commits(root: str, readme: str) -> tuple[str, str, float, int]:
  """(the pre-registration commit: the one that added `readme`, a path in the repository; the runs' commits, from
  ROOT/runs.jsonl; their wall minutes; the number of commands)."""
  added = git("log", "--diff-filter=A", "--format=%h", "--", readme).splitlines()
  records = []
  if os.path.exists(os.path.join(root, "runs.jsonl")):
    with open(os.path.join(root, "runs.jsonl")) as f:
      records = [json.loads(line) for line in f if line.strip()]
  ran = sorted({r.get("commit", "unknown") for r in records})
  return (added[-1] if added else "not committed yet", ", ".join(ran) or "-",
          sum(r.get("wall_s", 0.0) for r in records) / 60.0, len(records))


def changes_lines(root: str) -> list:
  """results.md's section of the changes after the pre-registration: ROOT/changes.md (written by hand beside the
  runs), or that none was recorded."""
  lines = ["", "## Changes after the pre-registration", ""]
  path = os.path.join(root, "changes.md")
  if os.path.exists(path):
    with open(path) as f:
      return lines + [f.read().strip()]
  return lines + ["None recorded (no `changes.md` beside the runs)."]


def nan_mean(x) -> float:
  """The mean of the values that are not NaN; NaN when there are none (where np.nanmean would warn)."""
  x = np.asarray(x, float)
  return float(np.nanmean(x)) if x.size and not np.all(np.isnan(x)) else float("nan")


def smooth(x, width: int = 5) -> np.ndarray:
  """The trailing mean over `width` iterations (fewer at the start), NaNs left out."""
  return np.array([nan_mean(x[max(0, i + 1 - width):i + 1]) for i in range(len(x))])
