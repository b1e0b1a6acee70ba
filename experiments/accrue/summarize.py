"""results.md of experiments/accrue (README.md is the pre-registration: arms, gate, hypotheses and rules).

  python experiments/accrue/summarize.py --root=experiments/accrue/runs [--out=DIR]

Reads ROOT/<arm>_s<seed>/metrics.jsonl and ROOT/gate.json; every number and verdict is computed here by README's
rules. Writes success.png (the current task's evaluated success against environment steps, seed means).
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs.accrue import ARMS, MEMORY, PER_TASK, TASKS  # noqa: E402
from experiments.driver import changes_lines, load_runs, spread, summary_path, write_results  # noqa: E402
from experiments.gate import parse_summary_args, results_head  # noqa: E402

THRESHOLD = 0.8                       # steps-to-threshold: the first evaluation of a task at or above it
ENV_STEPS_PER_ITERATION = 16 * 8 * 4  # environments x chunks x actions a chunk
FASTER = 0.2                          # H1: the seed-mean reduction of steps-to-threshold
FORGET_GAP = 0.05                     # H2
BC_GAP = 0.03                         # H3 (descriptive)
RL_GAIN = 0.1                         # H5 (descriptive)


def load(path: str) -> dict:
  """A run's evaluations [(step, task, success)] and its forgetting matrix: rows[k] = [S_j after task k]."""
  from rlkit.train.metrics import read_metrics
  rows = [r for r in read_metrics(os.path.join(path, "metrics.jsonl")) if r.get("stage") == "accrue"]
  evals = [(r["step"], int(r["eval/task"]), r["eval/success"]) for r in rows if "eval/success" in r]
  matrix = [[r[f"accrue/success_t{j}"] for j in range(len(TASKS))] for r in rows
            if f"accrue/success_t{len(TASKS) - 1}" in r]
  return {"evals": evals, "matrix": matrix, "final_row": matrix[-1] if matrix else [math.nan] * len(TASKS)}


def measures(run: dict) -> dict:
  """Steps-to-threshold per task (iterations into the task x environment steps; a task that never reaches it
  counts as its whole budget, and `censored` says how many), forgetting F_j = max_k S_j(k) - S_j(final) over the
  rows from task j's end on (j < last), and the average final success."""
  steps, censored = [], 0
  for t in range(1, len(TASKS)):
    hit = [step - t * PER_TASK for step, task, s in run["evals"] if task == t and s >= THRESHOLD]
    censored += not hit
    steps.append((min(hit) if hit else PER_TASK) * ENV_STEPS_PER_ITERATION)
  m = np.asarray(run["matrix"]) if run["matrix"] else np.full((len(TASKS), len(TASKS)), math.nan)
  forgetting = [float(np.max(m[j:, j]) - m[-1, j]) for j in range(len(TASKS) - 1)] if len(m) == len(TASKS) else []
  return {"steps": float(np.mean(steps)), "censored": censored,
          "forgetting": float(np.mean(forgetting)) if forgetting else math.nan,
          "final": float(np.mean(run["final_row"]))}


def _verdict(ok, detail: str) -> str:
  return f"{'not measured' if ok is None else 'supported' if ok else 'not supported'}: {detail}"


def _paired(runs, a: str, b: str):
  return sorted(set(runs.get(a, {})) & set(runs.get(b, {})))


def verdicts(runs: dict) -> dict:
  out = {}
  seeds = _paired(runs, "accrue", "fresh")
  faster = sum(runs["accrue"][s]["steps"] < runs["fresh"][s]["steps"] for s in seeds)
  cut = (1 - np.mean([runs["accrue"][s]["steps"] for s in seeds]) / np.mean([runs["fresh"][s]["steps"]
                                                                            for s in seeds])) if seeds else math.nan
  out["H1"] = _verdict(None if not seeds else faster >= 2 and cut >= FASTER,
                       f"accrue's mean steps-to-{THRESHOLD} on tasks 2-4 below fresh's in {faster} of {len(seeds)} "
                       f"seeds; seed-mean reduction {cut:+.0%} (needs >= 2 seeds and >= {FASTER:.0%})")
  seeds = _paired(runs, "accrue", "seqft")
  less = sum(runs["accrue"][s]["forgetting"] < runs["seqft"][s]["forgetting"] for s in seeds)
  gap = np.mean([runs["seqft"][s]["forgetting"] - runs["accrue"][s]["forgetting"] for s in seeds]) if seeds \
      else math.nan
  out["H2"] = _verdict(None if not seeds else less >= 2 and gap >= FORGET_GAP,
                       f"accrue's forgetting below seqft's in {less} of {len(seeds)} seeds, by {gap:+.3f} on average "
                       f"(needs >= 2 seeds and >= {FORGET_GAP})")
  parts = []
  for arm, ref in (("accrue_bc", "accrue"), ("replay", "accrue"), ("seqft", "fresh")):
    seeds = _paired(runs, arm, ref)
    if seeds:
      d = np.mean([runs[arm][s]["forgetting"] - runs[ref][s]["forgetting"] for s in seeds])
      f = np.mean([runs[arm][s]["final"] - runs[ref][s]["final"] for s in seeds])
      st = np.mean([runs[arm][s]["steps"] - runs[ref][s]["steps"] for s in seeds])
      parts.append(f"{arm} minus {ref}: forgetting {d:+.3f}, final success {f:+.3f}, steps-to-threshold {st:+.0f}")
  out["H3-H4"] = "descriptive: " + ("; ".join(parts) if parts else "no runs") + \
      f" (a forgetting difference <= -{BC_GAP} is read as the added part reducing forgetting)"
  base = runs.get("base", {})
  gains = [f"{arm} {np.mean([runs[arm][s]['final'] - base[s]['final'] for s in _paired(runs, arm, 'base')]):+.3f}"
           for arm in ARMS if arm != "base" and _paired(runs, arm, "base")]
  out["H5"] = "descriptive: average final success minus the base's: " + (", ".join(gains) or "no runs") + \
      f" (>= {RL_GAIN}: the arm learned)"
  return out


def table(runs: dict) -> list:
  lines = ["## Arms (seed mean, min-max)", "",
           f"Steps-to-threshold: environment steps into each of tasks 2-4 until an evaluation reaches {THRESHOLD} "
           f"(a task that never does counts as its budget, {PER_TASK * ENV_STEPS_PER_ITERATION}); forgetting: "
           "the mean over tasks 1-3 of the drop from a task's best to its final success; memory: decisions kept.", "",
           "| arm | seeds | steps-to-threshold | tasks never reached | forgetting | average final success | memory |",
           "|---|---|---|---|---|---|---|"]
  for arm, fields in ARMS.items():
    rs = runs.get(arm, {})
    if rs:
      memory = 0 if fields.get("p_mem", 1) == 0 or fields.get("critic_updates", 1) == 0 else \
          fields.get("per_task", MEMORY) * 8 * (len(TASKS) - 1)
      lines.append(f"| {arm} | {len(rs)} | {spread([r['steps'] for r in rs.values()], '{:.0f}')} | "
                   f"{sum(r['censored'] for r in rs.values())} | {spread([r['forgetting'] for r in rs.values()])} | "
                   f"{spread([r['final'] for r in rs.values()])} | {memory} |")
  lines += ["", "Forgetting matrices (seed mean; row k: every task's success after task k):", ""]
  for arm, rs in runs.items():
    ms = [np.asarray(r["matrix"]) for r in rs.values() if len(r["matrix"]) == len(TASKS)]
    if ms:
      mean = np.mean(ms, axis=0)
      lines.append(f"- {arm}: " + "; ".join(" ".join(f"{v:.2f}" for v in row) for row in mean))
  return lines


def plot(runs: dict, out: str, root: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from experiments.arm_tables import save_figure
  fig, ax = plt.subplots(figsize=(7, 3.5))
  for arm, rs in runs.items():
    steps = [step for step, _, _ in next(iter(rs.values()))["evals"]]
    mean = [np.mean([{st: s for st, _, s in r["evals"]}.get(step, math.nan) for r in rs.values()]) for step in steps]
    ax.plot([s * ENV_STEPS_PER_ITERATION for s in steps], mean, marker="o", markersize=2, label=arm)
  for t in range(1, len(TASKS)):
    ax.axvline(t * PER_TASK * ENV_STEPS_PER_ITERATION, color="grey", lw=0.5)
  ax.set_xlabel("environment steps (task boundaries in grey)")
  ax.set_ylabel("current task's success (seed mean)")
  ax.legend(fontsize=7)
  save_figure(fig, summary_path(out, root, "success.png"))


def load_all(root: str, seeds) -> dict:
  return {arm: {s: {**r, **measures(r)} for s, r in rs.items()}
          for arm, rs in load_runs(root, ARMS, seeds, load).items()}


def render(root: str, seeds) -> str:
  runs = load_all(root, seeds)
  text = results_head("accrue", root)
  text += [f"- **{h}**: {v}" for h, v in verdicts(runs).items()]
  text += ["", *table(runs)]
  text += changes_lines(root)
  return "\n".join(text) + "\n"


def main(argv=None):
  args, seeds = parse_summary_args(__doc__, "experiments/accrue/runs", argv, one_plot=False)
  write_results(args.out, args.root, render(args.root, seeds))
  runs = load_all(args.root, seeds)
  if runs:
    plot(runs, args.out, args.root)


if __name__ == "__main__":
  main()
