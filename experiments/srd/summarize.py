"""Summarise experiments/srd from its archive: results.md (the calibration gate, the three pre-registered verdicts
computed from the numbers, the per-arm tables, mean and per seed, the commits) and success.png (the success rate
against environment steps, and the share of zero-variance groups against the iteration, per arm).

  python experiments/srd/summarize.py [--root=experiments/srd/runs] [--seeds=0,1,2] [--out=DIR]

Reads ROOT/gate.json (run.py's record, experiments/gate.py), ROOT/runs.jsonl (the commands' wall times and
commits), ROOT/changes.md if present (changes after the pre-registration, written by hand beside the runs) and
every ROOT/<arm>_s<seed> that exists (config.json, metrics.jsonl). Per run, from its training rows (one an
iteration, PROMPTS x GROUP episodes): the success rate (reward/success: the episode reached the last room), first and final
= its means over the first and the last WINDOW iterations, gain = final - first; the share of zero-variance
groups (1 - informative_groups: groups whose 8 rewards are all equal, so GRPO's advantage is 0 on every token;
logged for every arm, where srd/zero_variance_frac exists only where the SRD scorer runs); the environment steps
(collect/turns: the policy turns played, each one call of the environment, summed over iterations); grad_norm
(before clipping) in the iterations where every group has zero variance; the SRD arms' srd/gap and srd/jsd. The
verdict rules are README.md's ("Hypotheses"). Writes results.md and success.png into --out (default: ROOT; pass
experiments/srd to refresh the committed ones on purpose) and prints results.md.
"""
import math
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, REPO)
from configs.srd import ARMS, GROUP, PROMPTS, STEPS, WINDOW  # noqa: E402
from experiments.arm_tables import over_seeds, save_figure  # noqa: E402
from experiments.driver import (write_results, changes_lines, commits, load_runs, nan_mean, read_json, smooth, spread,  # noqa: E402
                                stage_done, summary_path)
from experiments.gate import gate_summary_lines, parse_summary_args, read_gate  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

SUCCESS, INFORMATIVE, TURNS, GRAD = "reward/success", "informative_groups", "collect/turns", "grad_norm"
GAP, JSD, SRD_ZERO = "srd/gap", "srd/jsd", "srd/zero_variance_frac"
# What this summary and run.py's gate read of a workdir's metrics: run.py archives these (experiments/archive.py
# keys; a key ending in '/' is a prefix).
ARCHIVE_KEYS = ["stage", "step", "step_s", "at_stage_start", "eval/", "reward", "reward/", "accuracy",
                "informative_groups", "collect/", "grad_norm", "loss", "srd/", "entropy", "response_len"]
README = "experiments/srd/README.md"
NOT_TESTED = "not tested (the gate failed: no arm ran)"
ZERO_GRAD = 1e-10      # H3: a grad_norm at most this is zero (GRPO's is exactly 0.0 where every advantage is 0)
EVERY = 5              # the success table's columns: the mean of the EVERY iterations up to each
KEYS = (SUCCESS, INFORMATIVE, TURNS, GRAD, GAP, JSD, SRD_ZERO)


def load_run(path: str) -> dict:
  """One workdir: its per-iteration series (NaN where an iteration did not log a key), the training time and
  whether it finished."""
  config = read_json(os.path.join(path, "config.json"))
  rows = read_metrics(os.path.join(path, "metrics.jsonl"))
  train = [r for r in rows if "step_s" in r]
  series = {key: np.array([r.get(key, np.nan) for r in train], float) for key in KEYS}
  series["zero_var"] = 1.0 - series[INFORMATIVE]
  return {"series": series, "train_s": float(sum(r["step_s"] for r in train)), "done": stage_done(config, rows)}


def window(run: dict, key: str, last: bool) -> float:
  """The mean of `key` over the run's first (or last) WINDOW iterations; NaN for an unfinished run's final."""
  if last and not run["done"]:
    return math.nan
  x = run["series"][key]
  return nan_mean(x[-WINDOW:] if last else x[:WINDOW])


def zero_var_grads(run: dict) -> np.ndarray:
  """grad_norm of the run's iterations in which every group had zero variance (informative_groups == 0)."""
  s = run["series"]
  return s[GRAD][s[INFORMATIVE] == 0.0]


def numbers(run: dict) -> dict:
  first, final = window(run, SUCCESS, False), window(run, SUCCESS, True)
  turns = run["series"][TURNS]
  return {"first": first, "final": final, "gain": final - first, "zero_var_first": window(run, "zero_var", False),
          "zero_var_final": window(run, "zero_var", True), "env_steps": float(np.nansum(turns)) if run["done"] else
          math.nan, "gap_final": window(run, GAP, True), "jsd_final": window(run, JSD, True)}


MISSING = dict.fromkeys(("first", "final", "gain", "zero_var_first", "zero_var_final", "env_steps", "gap_final",
                         "jsd_final"), math.nan)


def per_seed(runs: dict, seeds: list) -> dict:
  """{arm: {seed: numbers}} for every arm and seed (NaN numbers where a run is missing)."""
  return {arm: {s: numbers(runs[arm][s]) if s in runs.get(arm, {}) else dict(MISSING) for s in seeds} for arm in ARMS}


def _values(nums: dict, arm: str, key: str) -> np.ndarray:
  return np.array([n[key] for n in nums[arm].values()], float)


def _paired(nums: dict, a: str, b: str):
  """(per-seed differences of final success a - b, their cells, the verdict of ">0 in >= 2 seeds and on the
  mean", or "incomplete")."""
  d = _values(nums, a, "final") - _values(nums, b, "final")
  verdict = ("incomplete" if np.isnan(d).any() or not d.size else
             "supported" if (d > 0).sum() >= 2 and d.mean() > 0 else "not supported")
  return d, ", ".join(f"{x:+.3f}" for x in d), verdict


def verdicts(nums: dict, runs: dict, seeds: list) -> list:
  """[(hypothesis, the numbers it reads, verdict)]: README.md's rules. Incomplete where a value is missing."""
  out = []
  d1, cells, h1 = _paired(nums, "srd", "grpo")
  out.append(("H1: SRD's final success exceeds GRPO's in >= 2 of 3 seeds and on the mean",
              f"SRD - GRPO per seed {cells}; mean {np.mean(d1):+.3f}", h1))
  d2 = _values(nums, "srd", "final") - _values(nums, "srd_shuffled", "final")
  h2 = ("incomplete" if np.isnan(d2).any() or not d2.size else
        "no evidence (H1 not supported: no SRD gain to attribute)" if h1 != "supported" else
        "supported" if (d2 > 0).sum() >= 2 else "not supported")
  if h1 == "incomplete" and h2 != "incomplete":
    h2 = "incomplete"
  out.append(("H2 (control): the shuffled arm's final success is below SRD's in >= 2 of 3 seeds",
              f"SRD - shuffled per seed {', '.join(f'{x:+.3f}' for x in d2)}", h2))
  complete = all(s in runs.get(arm, {}) and runs[arm][s]["done"] for arm in ("grpo", "srd") for s in seeds)
  grads = {arm: np.concatenate([zero_var_grads(runs[arm][s]) for s in seeds if s in runs.get(arm, {})] or
                               [np.zeros(0)]) for arm in ("grpo", "srd")}
  n_g, n_s = len(grads["grpo"]), len(grads["srd"])
  top, low = (np.max(grads["grpo"]) if n_g else math.nan), (np.min(grads["srd"]) if n_s else math.nan)
  detail = (f"all-zero-variance iterations: GRPO {n_g}, SRD {n_s}; GRPO's grad_norm there max {top:.3g}; SRD's min "
            f"{low:.3g}")
  if not complete:
    h3 = "incomplete"
  elif not n_g or not n_s:
    h3 = "no evidence (no all-zero-variance iteration in " + " and ".join(
        a.upper() for a, n in (("grpo", n_g), ("srd", n_s)) if not n) + ")"
  elif np.isnan(np.r_[grads["grpo"], grads["srd"]]).any():
    h3 = "incomplete"
  else:
    h3 = "supported" if (grads["grpo"] <= ZERO_GRAD).all() and (grads["srd"] > ZERO_GRAD).all() else "not supported"
  out.append((f"H3 (mechanical): in iterations where every group has zero variance, GRPO's grad_norm is 0 (<= "
              f"{ZERO_GRAD:g}) and SRD's is > 0, in every such iteration of every seed", detail, h3))
  return out


def _spread(xs, fmt: str) -> str:
  """`spread`, or "-" for a metric the arm does not log (srd/ in the grpo arm)."""
  return "-" if all(math.isnan(x) for x in xs) else spread(xs, fmt)


def render(root: str, seeds: list, runs: dict, plot_name: str) -> list:
  """results.md's lines."""
  prereg, ran, minutes, commands = commits(root, README)
  gate = read_gate(root)
  lines = ["# srd: results", "",
           f"Written by `python experiments/srd/summarize.py --root={root} --seeds={','.join(map(str, seeds))} "
           f"--out=experiments/srd`; do not edit by hand (changes after the pre-registration go into the "
           "archive's `changes.md`).", "",
           f"- Pre-registration: commit `{prereg}` (the commit that added README.md)",
           f"- Runs: commit(s) `{ran}`; {commands} command(s), {minutes:.1f} wall minutes in all",
           f"- Seeds: {', '.join(map(str, seeds))}; {STEPS} iterations of {PROMPTS} x {GROUP} episodes per arm; "
           f"first and final: the means over the first and the last {WINDOW} iterations", "",
           "## Calibration gate", "", *gate_summary_lines(root)]
  lines += ["## Verdicts", "", "| hypothesis | numbers | verdict |", "|---|---|---|"]
  nums = per_seed(runs, seeds)
  for name, detail, verdict in verdicts(nums, runs, seeds):
    lines.append(f"| {name} | {detail} | **{NOT_TESTED if gate and not gate['passed'] else verdict}** |")
  lines += ["", "## Success per arm (mean and min-max over seeds)", "",
            "| arm | seeds | success, first | final | gain | zero-variance groups, first | final | environment "
            "steps | srd/gap, final | srd/jsd, final | RL train time (s) |", "|---" * 11 + "|"]
  for arm in ARMS:
    have = [s for s in seeds if s in runs.get(arm, {})]
    if not have:
      continue
    done = "" if all(runs[arm][s]["done"] for s in have) else " (unfinished)"
    col = {k: [nums[arm][s][k] for s in have] for k in MISSING}
    lines.append(f"| {arm}{done} | {','.join(map(str, have))} | " + " | ".join(
        spread(col[k]) for k in ("first", "final", "gain", "zero_var_first", "zero_var_final")) +
        f" | {spread(col['env_steps'], '{:.0f}')} | {_spread(col['gap_final'], '{:.4f}')} | "
        f"{_spread(col['jsd_final'], '{:.4f}')} | "
        f"{spread([runs[arm][s]['train_s'] for s in have], '{:.0f}')} |")
  lines += ["", "## Per seed", "", "| arm | seed | success, first | final | gain | zero-variance groups, final | "
            "environment steps | all-zero-variance iterations | their grad_norm, min-max |", "|---" * 9 + "|"]
  for arm in ARMS:
    for s in seeds:
      if s in runs.get(arm, {}):
        n, g = nums[arm][s], zero_var_grads(runs[arm][s])
        lines.append(f"| {arm} | {s} | " + " | ".join(f"{n[k]:.3f}" for k in ("first", "final", "gain",
                                                                              "zero_var_final")) +
                     f" | {n['env_steps']:.0f} | {len(g)} | " +
                     (f"{np.min(g):.3g}-{np.max(g):.3g}" if len(g) else "-") + " |")
  every = list(range(EVERY, STEPS + 1, EVERY))
  lines += ["", f"## Success every {EVERY} iterations (the mean of the {EVERY} iterations up to it, mean over seeds)",
            "", "| arm | " + " | ".join(map(str, every)) + " |", "|---|" + "---|" * len(every)]
  for arm in ARMS:
    rs = [runs[arm][s] for s in seeds if s in runs.get(arm, {})]
    if rs:
      cells = [over_seeds([[nan_mean(r["series"][SUCCESS][i - EVERY:i]) for r in rs]])[0][0] for i in every]
      lines.append(f"| {arm} | " + " | ".join(f"{c:.3f}" for c in cells) + " |")
  lines += changes_lines(root)
  return lines + ["", f"![success against environment steps, zero-variance groups]({plot_name})", ""]


def plot(runs: dict, out: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.5))
  colors = {"grpo": "tab:gray", "srd": "tab:blue", "srd_shuffled": "tab:orange"}
  for arm, color in colors.items():
    rs = list(runs.get(arm, {}).values())
    if not rs:
      continue
    n = min(len(r["series"][SUCCESS]) for r in rs)
    label = f"{arm} ({len(rs)} seed{'s' * (len(rs) > 1)})"
    steps = np.mean([np.nancumsum(r["series"][TURNS][:n]) for r in rs], axis=0)
    mean, lo, hi = over_seeds(np.array([smooth(r["series"][SUCCESS][:n]) for r in rs]).T)
    left.plot(steps, mean, color=color, label=label)
    zmean, zlo, zhi = over_seeds(np.array([r["series"]["zero_var"][:n] for r in rs]).T)
    its = np.arange(1, n + 1)
    right.plot(its, zmean, color=color, label=label)
    if len(rs) > 1:
      left.fill_between(steps, lo, hi, color=color, alpha=0.15)
      right.fill_between(its, zlo, zhi, color=color, alpha=0.15)
  left.set(xlabel="environment steps (cumulative policy turns, mean over seeds)",
           ylabel="success rate (reward/success)", title="success, 5-iteration trailing mean")
  right.set(xlabel="RL iteration", ylabel="share of zero-variance groups", ylim=(-0.02, 1.02),
            title="groups whose 8 rewards are all equal")
  for ax in (left, right):
    ax.grid(alpha=0.3)
  if left.get_legend_handles_labels()[0]:
    left.legend(fontsize=8)
  fig.suptitle("SRD vs GRPO vs shuffled hindsight: mean over seeds, bands min-max")
  save_figure(fig, out)


def main(argv=None) -> None:
  args, seeds = parse_summary_args(__doc__, "experiments/srd/runs", argv, one_plot=False)
  runs = load_runs(args.root, ARMS, seeds, load_run)
  png = summary_path(args.out, args.root, "success.png")
  md = write_results(args.out, args.root, "\n".join(render(args.root, seeds, runs, os.path.basename(png))))
  print(f"wrote {md}")
  plot(runs, png)


if __name__ == "__main__":
  main()
