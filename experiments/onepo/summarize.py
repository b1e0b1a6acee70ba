"""Summarise experiments/onepo from its archive: the calibration gate, the verdicts of the pre-registered
predictions per seed, the results tables (markdown, printed) and a PNG of the accuracy curves.

  python experiments/onepo/summarize.py [--root=experiments/onepo/runs] [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads ROOT/gate.json (the gate run.py recorded, experiments/gate.py) and every ROOT/<arm>_s<seed> that exists
(config.json, metrics.jsonl: the archive run.py writes, or the driver's own workdirs). Per arm, over the seeds
found: held-out greedy accuracy on the hard task (4 digits), the step below (3 digits) and the shifted split (5
digits) at the start and at every evaluation; the training token entropy over the first and last tenth of the
iterations; teacher rows and tokens trained on and the policy's mean probability of the teacher's tokens; the RL
training time (the sum of the iterations' `step_s`, evaluations excluded). The verdict rules are README.md's
("Predictions"). Writes the plot to ROOT/accuracy.png, or into --out.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.onepo import ANNEAL, ARMS, HARD_DIGITS, STEPS  # noqa: E402
from experiments.arm_tables import load_from_start, over_seeds, save_figure  # noqa: E402
from experiments.driver import load_runs, spread, summary_path  # noqa: E402
from experiments.gate import parse_summary_args  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

SETS = {"hard": "eval/accuracy", "below": "eval/below/accuracy", "long": "eval/long/accuracy"}
SET_NAMES = {"hard": f"hard ({HARD_DIGITS} digits)", "below": f"step below ({HARD_DIGITS - 1} digits)",
             "long": f"shifted ({HARD_DIGITS + 1} digits)"}
# What this summary reads of a workdir's metrics: run.py archives these (experiments/archive.py keys; a key
# ending in '/' is a prefix).
ARCHIVE_KEYS = ["stage", "step", "step_s", "at_stage_start", "eval/", "entropy", "reward", "accuracy", "shaped/",
                "floored/", "rows/", "schedule/"]
TEACHER_TERMS = ("shaped", "floored")    # the loss terms that train teacher rows (ours, the release's)
STALL = 0.10       # prediction 1: plain GRPO's hard-task accuracy stays below this
LIFT = 0.05        # predictions 2-3: a guided arm ends at least this far above plain GRPO
MARGIN = 0.02      # predictions 4-6: closer than this is a tie (10 of 500 problems)
KEEP = 0.10        # prediction 7: the most step-below accuracy an arm may lose


def load_arm(path: str) -> dict:
  run = load_from_start(path, list(SETS.values()))
  run["acc"] = {name: run["values"][key] for name, key in SETS.items()}
  rows = [r for r in read_metrics(os.path.join(path, "metrics.jsonl")) if "step_s" in r]
  tenth = max(1, len(rows) // 10)
  entropy = [r.get("entropy", np.nan) for r in rows]
  tokens = sum(r.get(f"{t}/teacher_tokens", 0.0) for r in rows for t in TEACHER_TERMS)
  p_sum = sum(r.get(f"{t}/teacher_p_sum", 0.0) for r in rows for t in TEACHER_TERMS)
  run.update(entropy_first=float(np.nanmean(entropy[:tenth])) if rows else np.nan,
             entropy_last=float(np.nanmean(entropy[-tenth:])) if rows else np.nan,
             teacher_tokens=float(tokens), teacher_p=float(p_sum / tokens) if tokens else np.nan,
             teacher_rows=float(sum(r.get(f"{t}/teacher_rows", 0.0) for r in rows for t in TEACHER_TERMS)),
             reward=[r.get("reward", np.nan) for r in rows])
  return run


def acc(run, name: str, step: int) -> float:
  """The arm's accuracy on set `name` at RL iteration `step` (0: the start), NaN if it was not evaluated."""
  return run["acc"][name][run["steps"].index(step)] if step in run["steps"] else np.nan


def _majority(cells: list, yes: str, seeds: list) -> str:
  """A prediction's verdict from its per-seed cells: `yes` on more than half of the seeds."""
  if len(cells) < len(seeds) or any(c == "-" for c in cells):
    return "incomplete"
  if sum(c == yes for c in cells) * 2 > len(cells):
    return "supported"
  if sum(c == "n/a" for c in cells) * 2 > len(cells):
    return "no evidence (never lifted)"
  return "not supported"


def _three_way(cells: list, seeds: list) -> str:
  """A directional comparison's verdict: higher on most seeds, lower on most seeds, or neither (ties)."""
  if len(cells) < len(seeds) or any(c == "-" for c in cells):
    return "incomplete"
  for word, verdict in (("higher", "supported"), ("lower", "contradicted")):
    if sum(c == word for c in cells) * 2 > len(cells):
      return verdict
  return "no evidence (ties)"


def _compare(d: float, margin: float = MARGIN) -> str:
  return "-" if np.isnan(d) else "higher" if d >= margin else "lower" if d <= -margin else "tie"


def verdicts(runs: dict, seeds: list) -> list:
  """[(prediction, {seed: cell}, verdict)]: README.md's prediction rules on each seed's final evaluations."""
  def end(arm, seed, name="hard"):
    run = runs.get(arm, {}).get(seed)
    return np.nan if run is None or not run["done"] else acc(run, name, STEPS)

  def cell(ok, value=np.nan):
    return "-" if ok is None else ("yes" if ok else "no") + ("" if np.isnan(value) else f" ({value:+.3f})")

  out = []
  stall = {s: cell(None if np.isnan(end("grpo", s)) else end("grpo", s) < STALL) for s in seeds}
  out.append((f"1. plain GRPO stalls (hard < {STALL})", stall, _majority([c.split()[0] for c in stall.values()],
                                                                            "yes", seeds)))
  for n, arm in ((2, "annealed"), (3, "huatuo")):
    d = {s: end(arm, s) - end("grpo", s) for s in seeds}
    cells = {s: cell(None if np.isnan(v) else v >= LIFT, v) for s, v in d.items()}
    out.append((f"{n}. {arm} ends >= {LIFT} above grpo (hard)", cells,
                _majority([c.split()[0] for c in cells.values()], "yes", seeds)))
  d = {s: end("huatuo", s) - end("annealed", s) for s in seeds}
  cells = {s: f"{_compare(v)}" + ("" if np.isnan(v) else f" ({v:+.3f})") for s, v in d.items()}
  out.append(("4. huatuo ends above annealed (hard)", cells, _three_way([c.split()[0] for c in cells.values()],
                                                                        seeds)))
  for arm in ("annealed", "huatuo"):
    cells = {}
    for s in seeds:
      run = runs.get(arm, {}).get(s)
      at, last = (np.nan, np.nan) if run is None or not run["done"] else (acc(run, "hard", ANNEAL), end(arm, s))
      cells[s] = ("-" if np.isnan(last) or np.isnan(at) else "n/a" if at < MARGIN else
                  cell(last >= at - MARGIN, last - at))
    out.append((f"5. {arm} holds after the teacher retires (hard at {STEPS} >= at {ANNEAL} - {MARGIN})", cells,
                _majority([c.split()[0] for c in cells.values()], "yes", seeds)))
  d = {s: end("annealed", s, "long") - end("permanent", s, "long") for s in seeds}
  cells = {s: f"{_compare(v)}" + ("" if np.isnan(v) else f" ({v:+.3f})") for s, v in d.items()}
  out.append(("6. annealed ends above permanent (shifted split)", cells,
              _three_way([c.split()[0] for c in cells.values()], seeds)))
  for arm in ARMS:
    cells = {}
    for s in seeds:
      run = runs.get(arm, {}).get(s)
      loss = np.nan if run is None or not run["done"] else acc(run, "below", STEPS) - acc(run, "below", 0)
      cells[s] = cell(None if np.isnan(loss) else loss >= -KEEP, loss)
    out.append((f"7. {arm} keeps the step below (loses <= {KEEP})", cells,
                _majority([c.split()[0] for c in cells.values()], "yes", seeds)))
  return out


def main(argv=None) -> None:
  args, seeds = parse_summary_args(__doc__, "experiments/onepo/runs", argv)
  runs = load_runs(args.root, ARMS, seeds, load_arm)
  print("Predictions, per seed (README.md's rules; cells: the rule's outcome and the difference it reads):\n")
  print("| prediction | " + " | ".join(f"seed {s}" for s in seeds) + " | verdict |\n|---|" + "---|" * (len(seeds) + 1))
  for name, cells, verdict in verdicts(runs, seeds):
    print(f"| {name} | " + " | ".join(cells[s] for s in seeds) + f" | {verdict} |")
  print("\nAt the start and after the last RL iteration (mean and min-max over seeds):\n\n| arm | seeds | "
        + " | ".join(f"{SET_NAMES[s]}, start -> end" for s in SETS) + " | entropy, first -> last tenth | "
        "teacher rows | teacher tokens | mean p of teacher tokens | RL train time (s) |\n|---|---|"
        + "---|" * (len(SETS) + 5))
  for arm, by_seed in runs.items():
    rs = [r for r in by_seed.values() if r["steps"]]
    done = "" if all(r["done"] for r in rs) else " (unfinished)"
    cells = [f"{spread([acc(r, s, 0) for r in rs])} -> {spread([r['acc'][s][-1] for r in rs])}" for s in SETS]
    counts = [spread([r[k] for r in rs], "{:.0f}") for k in ("teacher_rows", "teacher_tokens")]
    print(f"| {arm}{done} | {','.join(map(str, by_seed))} | " + " | ".join(cells) +
          f" | {spread([r['entropy_first'] for r in rs])} -> {spread([r['entropy_last'] for r in rs])}"
          f" | {' | '.join(counts)} | {spread([r['teacher_p'] for r in rs])} | "
          f"{spread([r['train_s'] for r in rs], '{:.0f}')} |")
  print("\nHeld-out greedy accuracy at each RL evaluation (mean over seeds; 0: the base, before any update):\n")
  steps = max((r["steps"] for by in runs.values() for r in by.values()), key=len, default=[])
  print("| arm | set | " + " | ".join(map(str, steps)) + " |\n|---|---|" + "---|" * len(steps))
  for arm, by_seed in runs.items():
    for s in SETS:
      mean, _, _ = over_seeds([[acc(r, s, step) for r in by_seed.values()] for step in steps])
      print(f"| {arm} | {s} | " + " | ".join(f"{c:.3f}" for c in mean) + " |")
  plot(runs, summary_path(args.out, args.root, "accuracy.png"))


def plot(runs: dict, out: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 4, figsize=(18, 4.2))
  colors = dict(zip(ARMS, ("tab:gray", "tab:red", "tab:blue", "tab:green")))
  for ax, s in zip(axes, SETS):
    for arm, by_seed in runs.items():
      rs = [r for r in by_seed.values() if r["steps"]]
      if not rs:
        continue
      steps = sorted({step for r in rs for step in r["steps"]})
      mean, lo, hi = over_seeds([[acc(r, s, step) for r in rs] for step in steps])
      ax.plot(steps, mean, marker="o", ms=3, color=colors[arm], label=arm)
      if len(rs) > 1:
        ax.fill_between(steps, lo, hi, color=colors[arm], alpha=0.15)
    ax.axvline(ANNEAL, color="tab:blue", ls=":", lw=1)
    ax.set(title=SET_NAMES[s], xlabel=f"RL iteration (dotted: {ANNEAL}, annealed and huatuo retire)")
    ax.grid(alpha=0.3)
  for arm, by_seed in runs.items():
    rs = [r for r in by_seed.values() if r["reward"]]
    if rs:
      m = min(len(r["reward"]) for r in rs)
      axes[3].plot(np.arange(1, m + 1), over_seeds(np.array([r["reward"][:m] for r in rs]).T)[0],
                   color=colors[arm], label=arm)
  axes[3].set(title="training reward (the policy's samples)", xlabel="RL iteration")
  axes[3].grid(alpha=0.3)
  seeds = sorted({s for by in runs.values() for s in by})
  axes[0].set_ylabel(f"held-out greedy accuracy (seeds {','.join(map(str, seeds))}; bands min-max)")
  axes[0].legend(fontsize=8)
  save_figure(fig, out)


if __name__ == "__main__":
  main()
