"""What the summarisers of the arm experiments share (prorubric, calif, tips): each workdir's evaluations of its
last stage, the final table and the curves as markdown (mean and min-max over seeds), and one PNG panel per
metric. An experiment's summarize.py names its metrics and calls `summarize`.
"""
import os

import numpy as np

from experiments.driver import last_eval, load_runs, read_json, spread, stage_done
from rlkit.train.metrics import read_metrics


def load_arm(path: str, keys) -> dict:
  """The evaluations of the workdir's last stage: steps from that stage's start, each key's values, the sum of
  the training iterations' `step_s` and whether the stage reached its configured length."""
  config = read_json(os.path.join(path, "config.json"))
  stage = config["stages"][-1]
  offset = sum(config[s]["steps"] for s in config["stages"][:-1])
  every = read_metrics(os.path.join(path, "metrics.jsonl"))
  rows = [r for r in every if r.get("stage") == stage]
  evals = [r for r in rows if "eval/accuracy" in r]
  train = [r for r in rows if "step_s" in r]
  done = stage_done(config, every)
  return {"steps": [e["step"] - offset for e in evals], "values": {k: [e.get(k, np.nan) for e in evals] for k in keys},
          "train_s": float(sum(r["step_s"] for r in train)), "done": done}


def load_with_training(path: str, keys, last=()) -> dict:
  """`load_arm` for the `eval/` keys, and every other key a training metric shown at each evaluation step as its
  mean over the iterations since the previous evaluation (the keys in `last`: their value at the step, e.g. a
  running count)."""
  run = load_arm(path, [k for k in keys if k.startswith("eval/")])
  config = read_json(os.path.join(path, "config.json"))
  stage, offset = config["stages"][-1], sum(config[s]["steps"] for s in config["stages"][:-1])
  rows = [r for r in read_metrics(os.path.join(path, "metrics.jsonl")) if "step_s" in r and r.get("stage") == stage]
  for key in keys:
    if key.startswith("eval/"):
      continue
    values, start = [], 0
    for step in run["steps"]:
      window = [r[key] for r in rows if start < r["step"] - offset <= step and key in r]
      values.append((window[-1] if key in last else float(np.mean(window))) if window else np.nan)
      start = step
    run["values"][key] = values
  return run


def first_eval(path: str) -> float:
  """The held-out accuracy a run from a loaded model measured before its first update (its first eval row, marked
  `at_stage_start`), or nan (no such row: a run from scratch, or none yet)."""
  from rlkit.train.stages import AT_STAGE_START
  file = os.path.join(path, "metrics.jsonl")
  rows = [r for r in read_metrics(file) if "eval/accuracy" in r] if os.path.exists(file) else []
  return rows[0]["eval/accuracy"] if rows and rows[0].get(AT_STAGE_START) else np.nan


def load_from_start(path: str, keys, last=()) -> dict:
  """`load_with_training`, with the evaluation a run from a loaded model makes before its first update (its stage's
  first eval row, marked `at_stage_start` by rlkit.train.stages) at step 0: each curve then starts at the arm's
  own starting point. The training metrics have no value there (NaN)."""
  from rlkit.train.stages import AT_STAGE_START
  run = load_with_training(path, keys, last)
  config = read_json(os.path.join(path, "config.json"))
  stage, offset = config["stages"][-1], sum(config[s]["steps"] for s in config["stages"][:-1])
  first = next((r for r in read_metrics(os.path.join(path, "metrics.jsonl"))
                if r.get("stage") == stage and "eval/accuracy" in r), None)
  if first is not None and first.get(AT_STAGE_START) and run["steps"] and run["steps"][0] == first["step"] - offset:
    run["steps"][0] = 0
    for key in keys:
      if not key.startswith("eval/"):
        run["values"][key][0] = np.nan
  return run


def over_seeds(columns) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Per column (one value per seed, NaN where the seed has none): the mean, min and max over the seeds that have
  a value, and NaN for a column none has (a metric an arm does not log, an evaluation a seed has not reached yet),
  where numpy's nan-functions would warn about an all-NaN slice."""
  stats = []
  for column in columns:
    x = np.asarray(column, float)
    x = x[~np.isnan(x)]
    stats.append((x.mean(), x.min(), x.max()) if x.size else (np.nan,) * 3)
  return tuple(np.array([s[i] for s in stats], float) for i in range(3))


def summarize(root: str, arms, seeds, metrics: dict, out_png: str, title: str, base: str = "sft",
              load=load_arm) -> dict:
  """Prints the base policy's row (ROOT/<base>_s<seed>), every arm's last evaluation and each metric's curve;
  writes the PNG. `metrics`: label -> metrics.jsonl key; `load(path, keys)`: a workdir as `load_arm` gives it.
  Returns {arm: {seed: load(...)}}."""
  keys = list(metrics.values())
  if base:
    print(f"| {base} (seed) | step | " + " | ".join(metrics) + " |\n|---|---|" + "---|" * len(metrics))
    for seed in seeds:
      e = last_eval(os.path.join(root, f"{base}_s{seed}"))
      if e:
        print(f"| {seed} | {e['step']} | " + " | ".join(f"{e.get(k, np.nan):.3f}" for k in keys) + " |")
  runs = load_runs(root, arms, seeds, lambda path: load(path, keys))
  print("\nAt the last evaluation (mean and min-max over seeds):\n")
  print("| arm | seeds | " + " | ".join(metrics) + " | train time (s) |\n|---|---|" + "---|" * (len(metrics) + 1))
  for arm, by_seed in runs.items():
    rs = [r for r in by_seed.values() if r["steps"]]
    if not rs:
      continue
    done = "" if all(r["done"] for r in rs) else " (unfinished)"
    cells = [spread([r["values"][k][-1] for r in rs]) for k in keys]
    print(f"| {arm}{done} | {','.join(map(str, by_seed))} | " + " | ".join(cells) +
          f" | {spread([r['train_s'] for r in rs], '{:.0f}')} |")
  for label, key in metrics.items():
    steps = max((r["steps"] for by in runs.values() for r in by.values()), key=len, default=[])
    print(f"\n{label} at each evaluation (mean over seeds):\n")
    print("| arm | " + " | ".join(map(str, steps)) + " |\n|---|" + "---|" * len(steps))
    for arm, by_seed in runs.items():
      cells, _, _ = over_seeds([[r["values"][key][i] for r in by_seed.values() if i < len(r["steps"])]
                                for i in range(len(steps))])
      print(f"| {arm} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
  plot(runs, metrics, out_png, title)
  return runs


def plot(runs: dict, metrics: dict, out: str, title: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 4.0), squeeze=False)
  colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
  for ax, (label, key) in zip(axes[0], metrics.items()):
    for c, (arm, by_seed) in enumerate(runs.items()):
      rs = [r for r in by_seed.values() if r["steps"]]
      if not rs:
        continue
      n = min(len(r["steps"]) for r in rs)
      mean, lo, hi = over_seeds(np.array([r["values"][key][:n] for r in rs], float).T)
      ax.plot(rs[0]["steps"][:n], mean, marker="o", ms=3, color=colors[c % len(colors)], label=arm)
      if len(rs) > 1:
        ax.fill_between(rs[0]["steps"][:n], lo, hi, color=colors[c % len(colors)], alpha=0.15)
    ax.set(title=label, xlabel="step of the arm's last stage")
    ax.grid(alpha=0.3)
  axes[0][0].legend(fontsize=8)
  seeds = sorted({s for by in runs.values() for s in by})
  fig.suptitle(f"{title} (seeds {','.join(map(str, seeds))}; bands: min-max)")
  save_figure(fig, out)


def save_figure(fig, out: str) -> None:
  """Lays out, writes (100 dpi) and closes a summary figure, and says where it went."""
  import matplotlib.pyplot as plt
  fig.tight_layout()
  fig.savefig(out, dpi=100)
  plt.close(fig)
  print(f"\nwrote {out}")
