"""Summarise experiments/slca_grpo from its archive: results.md (the calibration gate, the three pre-registered
verdicts computed from the numbers, the per-arm tables, mean and per seed, the commits) and calls.png (call
accuracy and summary rule rate against the iteration, one panel per judge noise).

  python experiments/slca_grpo/summarize.py [--root=experiments/slca_grpo/runs] [--seeds=0,1,2] [--out=DIR]

Reads ROOT/gate.json (run.py's record, experiments/gate.py), ROOT/runs.jsonl (the commands' wall times and
commits), ROOT/changes.md if present (changes after the pre-registration, written by hand beside the runs) and
every ROOT/<arm>_s<seed> that exists (config.json, metrics.jsonl). Per run, from its training rows: the call
accuracy (reward/execution: the first call is the gold call and ran) and the summary rule rate
(reward/summary_rule: the summary states the right value, the judge's noiseless part), first and final = their
means over the first and the last WINDOW iterations, gain = final - first; the judge's score (reward/summary);
the held-out greedy call accuracy (eval/accuracy) at the start and the end. The verdict rules are README.md's
("Hypotheses"). Writes results.md and calls.png into --out (default: ROOT; pass experiments/slca_grpo to refresh
the committed ones on purpose) and prints results.md.
"""
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from configs.slca_grpo import ARMS, NOISES, STEPS, WINDOW, arm_name  # noqa: E402
from experiments.arm_tables import over_seeds, save_figure  # noqa: E402
from experiments.driver import (write_results, changes_lines, commits, load_runs, nan_mean, read_json, smooth, spread,  # noqa: E402
                                stage_done, summary_path)
from experiments.gate import gate_summary_lines, parse_summary_args, read_gate  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

CALL, SUMMARY_RULE, JUDGE = "reward/execution", "reward/summary_rule", "reward/summary"
# What this summary and run.py's gate read of a workdir's metrics: run.py archives these (experiments/archive.py
# keys; a key ending in '/' is a prefix).
ARCHIVE_KEYS = ["stage", "step", "step_s", "at_stage_start", "eval/", "reward", "reward/", "accuracy",
                "informative_groups", "collect/", "entropy", "response_len"]
README = "experiments/slca_grpo/README.md"
NOT_TESTED = "not tested (the gate failed: no arm ran)"


def load_run(path: str) -> dict:
  """One workdir: its per-iteration call accuracy, summary rule rate and judge score, its held-out evaluations
  (step 0: the start), the training time and whether it finished."""
  config = read_json(os.path.join(path, "config.json"))
  rows = read_metrics(os.path.join(path, "metrics.jsonl"))
  train = [r for r in rows if "step_s" in r]
  evals = [r for r in rows if "eval/accuracy" in r]
  series = {key: np.array([r.get(key, np.nan) for r in train], float) for key in (CALL, SUMMARY_RULE, JUDGE)}
  return {"series": series, "steps": [0 if r.get("at_stage_start") else r["step"] for r in evals],
          "eval": [r["eval/accuracy"] for r in evals], "train_s": float(sum(r["step_s"] for r in train)),
          "done": stage_done(config, rows)}


def window(run: dict, key: str, last: bool) -> float:
  """The mean of `key` over the run's first (or last) WINDOW iterations; NaN for an unfinished run's final."""
  if last and not run["done"]:
    return math.nan
  x = run["series"][key]
  return _mean(x[-WINDOW:] if last else x[:WINDOW])


def numbers(run: dict) -> dict:
  first, final = window(run, CALL, False), window(run, CALL, True)
  return {"first": first, "final": final, "gain": final - first, "summary_final": window(run, SUMMARY_RULE, True),
          "judge_final": window(run, JUDGE, True), "eval_start": run["eval"][0] if run["steps"][:1] == [0] else
          math.nan, "eval_end": run["eval"][-1] if run["done"] and run["eval"] else math.nan}


def per_seed(runs: dict, seeds: list) -> dict:
  """{arm: {seed: numbers}} for every arm and seed (NaN numbers where a run is missing)."""
  missing = dict.fromkeys(("first", "final", "gain", "summary_final", "judge_final", "eval_start", "eval_end"),
                          math.nan)
  return {arm: {s: numbers(runs[arm][s]) if s in runs.get(arm, {}) else dict(missing) for s in seeds}
          for arm in ARMS}


def _values(nums: dict, arm: str, key: str) -> np.ndarray:
  return np.array([n[key] for n in nums[arm].values()], float)


def verdicts(nums: dict) -> list:
  """[(hypothesis, the numbers it reads, verdict)]: README.md's rules. Incomplete where a value is missing."""
  out = []
  hi, lo = arm_name("slca", NOISES[-1]), arm_name("grpo", NOISES[-1])
  d = _values(nums, hi, "final") - _values(nums, lo, "final")
  cells = ", ".join(f"{x:+.3f}" for x in d)
  verdict = ("incomplete" if np.isnan(d).any() else
             "supported" if (d > 0).sum() >= 2 and d.mean() > 0 else "not supported")
  out.append((f"H1: at noise {NOISES[-1]:g}, SLCA's final call accuracy exceeds GRPO's in >= 2 of 3 seeds and on "
              "the mean", f"SLCA - GRPO per seed {cells}; mean {d.mean():+.3f}", verdict))
  s0, g0 = _values(nums, arm_name("slca", NOISES[0]), "final"), _values(nums, arm_name("grpo", NOISES[0]), "final")
  gap = abs(s0.mean() - g0.mean())
  verdict = ("incomplete" if np.isnan(np.r_[s0, g0]).any() else
             "supported" if gap <= max(np.ptp(s0), np.ptp(g0)) else "not supported")
  out.append((f"H2 (control): at noise {NOISES[0]:g}, the arms' mean final call accuracies differ by at most the "
              "larger arm's seed range", f"SLCA {s0.mean():.3f} - GRPO {g0.mean():.3f} = {s0.mean() - g0.mean():+.3f}"
              f"; seed ranges SLCA {np.ptp(s0):.3f}, GRPO {np.ptp(g0):.3f}", verdict))
  gains = {arm: float(np.mean(_values(nums, arm, "gain"))) for arm in ARMS}
  grpo = [gains[arm_name("grpo", n)] for n in NOISES]
  slca0, slca_hi = gains[arm_name("slca", NOISES[0])], gains[arm_name("slca", NOISES[-1])]
  falls = all(a > b for a, b in zip(grpo, grpo[1:]))
  holds = slca_hi >= 0.5 * slca0
  if any(np.isnan(_values(nums, arm, "gain")).any() for arm in ARMS):
    verdict = "incomplete"
  elif grpo[0] <= 0 or slca0 <= 0:
    verdict = "no evidence (no gain at noise 0)"
  else:
    verdict = "supported" if falls and holds else "not supported"
  out.append(("H3: GRPO's gain falls as the noise grows (" + " > ".join(f"n{n:g}" for n in NOISES) + ", seed "
              f"means) while SLCA's falls less (its n{NOISES[-1]:g} gain >= 0.5 x its n{NOISES[0]:g} gain)",
              "GRPO gains " + ", ".join(f"{g:+.3f}" for g in grpo) + f" ({'falls' if falls else 'does not fall'});"
              " SLCA gains " + ", ".join(f"{gains[arm_name('slca', n)]:+.3f}" for n in NOISES) +
              f" ({'holds' if holds else 'does not hold'} >= half)", verdict))
  return out


def render(root: str, seeds: list, runs: dict, plot_name: str) -> list:
  """results.md's lines."""
  prereg, ran, minutes, commands = commits(root, README)
  gate = read_gate(root)
  lines = ["# slca_grpo: results", "",
           f"Written by `python experiments/slca_grpo/summarize.py --root={root} --seeds={','.join(map(str, seeds))} "
           f"--out=experiments/slca_grpo`; do not edit by hand (changes after the pre-registration go into the "
           "archive's `changes.md`).", "",
           f"- Pre-registration: commit `{prereg}` (the commit that added README.md)",
           f"- Runs: commit(s) `{ran}`; {commands} command(s), {minutes:.1f} wall minutes in all",
           f"- Seeds: {', '.join(map(str, seeds))}; {STEPS} iterations per arm; first and final: the means over the "
           f"first and the last {WINDOW} iterations", "", "## Calibration gate", "", *gate_summary_lines(root)]
  lines += ["## Verdicts", "", "| hypothesis | numbers | verdict |", "|---|---|---|"]
  nums = per_seed(runs, seeds)
  for name, detail, verdict in verdicts(nums):
    lines.append(f"| {name} | {detail} | **{NOT_TESTED if gate and not gate['passed'] else verdict}** |")
  lines += ["", "## Call accuracy per arm (mean and min-max over seeds)", "",
            "| arm | seeds | call accuracy, first | final | gain | summary rule rate, final | judge score, final | "
            "held-out call accuracy, start -> end | RL train time (s) |", "|---|---|---|---|---|---|---|---|---|"]
  for arm in ARMS:
    have = [s for s in seeds if s in runs.get(arm, {})]
    if not have:
      continue
    done = "" if all(runs[arm][s]["done"] for s in have) else " (unfinished)"
    col = {k: [nums[arm][s][k] for s in have] for k in nums[arm][have[0]]}
    lines.append(f"| {arm}{done} | {','.join(map(str, have))} | " + " | ".join(
        spread(col[k]) for k in ("first", "final", "gain", "summary_final", "judge_final")) +
        f" | {spread(col['eval_start'])} -> {spread(col['eval_end'])} | "
        f"{spread([runs[arm][s]['train_s'] for s in have], '{:.0f}')} |")
  lines += ["", "## Per seed", "", "| arm | seed | call accuracy, first | final | gain | summary rule rate, final | "
            "held-out call accuracy, end |", "|---|---|---|---|---|---|---|"]
  for arm in ARMS:
    for s in seeds:
      if s in runs.get(arm, {}):
        n = nums[arm][s]
        lines.append(f"| {arm} | {s} | " + " | ".join(f"{n[k]:.3f}" for k in ("first", "final", "gain",
                                                                              "summary_final", "eval_end")) + " |")
  every = list(range(WINDOW, STEPS + 1, WINDOW))
  lines += ["", f"## Call accuracy every {WINDOW} iterations (the mean of the {WINDOW} iterations up to it, mean "
            "over seeds)", "", "| arm | " + " | ".join(map(str, every)) + " |", "|---|" + "---|" * len(every)]
  for arm in ARMS:
    rs = [runs[arm][s] for s in seeds if s in runs.get(arm, {})]
    if rs:
      cells = [over_seeds([[_mean(r["series"][CALL][i - WINDOW:i]) for r in rs]])[0][0] for i in every]
      lines.append(f"| {arm} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
  lines += changes_lines(root)
  return lines + ["", f"![call accuracy and summary rule rate]({plot_name})", ""]


_mean = nan_mean   # the mean of the values that are not NaN (experiments/driver.py)


def plot(runs: dict, out: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(2, len(NOISES), figsize=(5 * len(NOISES), 7.5), sharey="row", squeeze=False)
  colors = {"grpo": "tab:gray", "slca": "tab:blue"}
  for col, noise in enumerate(NOISES):
    for row, (key, label) in enumerate(((CALL, "call accuracy (reward/execution)"),
                                        (SUMMARY_RULE, "summary rule rate (reward/summary_rule)"))):
      ax = axes[row][col]
      for kind, color in colors.items():
        rs = list(runs.get(arm_name(kind, noise), {}).values())
        if not rs:
          continue
        n = min(len(r["series"][key]) for r in rs)
        mean, lo, hi = over_seeds(np.array([smooth(r["series"][key][:n]) for r in rs]).T)
        steps = np.arange(1, n + 1)
        ax.plot(steps, mean, color=color, label=f"{kind.upper()} ({len(rs)} seed{'s' * (len(rs) > 1)})")
        if len(rs) > 1:
          ax.fill_between(steps, lo, hi, color=color, alpha=0.15)
      ax.set(title=f"judge noise {noise:g}" if row == 0 else "", xlabel="RL iteration" if row == 1 else "",
             ylabel=label if col == 0 else "")
      ax.grid(alpha=0.3)
  if axes[0][0].get_legend_handles_labels()[0]:
    axes[0][0].legend(fontsize=8)
  fig.suptitle("SLCA vs GRPO from the base: 5-iteration trailing means, mean over seeds, bands min-max")
  save_figure(fig, out)


def main(argv=None) -> None:
  args, seeds = parse_summary_args(__doc__, "experiments/slca_grpo/runs", argv, one_plot=False)
  runs = load_runs(args.root, ARMS, seeds, load_run)
  png = summary_path(args.out, args.root, "calls.png")
  md = write_results(args.out, args.root, "\n".join(render(args.root, seeds, runs, os.path.basename(png))))
  print(f"wrote {md}")
  plot(runs, png)


if __name__ == "__main__":
  main()
