"""results.md of experiments/timestep_modules (README.md is the pre-registration: arms, gate, hypotheses, rules).

  python experiments/timestep_modules/summarize.py --root=experiments/timestep_modules/runs [--out=DIR]

Reads ROOT/analysis_s<seed>.json (experiments/timestep_modules/analyze.py), the arm runs' final evaluations
(ROOT/<arm>_<task>_s<seed>/metrics.jsonl) and ROOT/gate.json; every number and verdict is computed here by
README's rules. Writes steering.png (success along the timestep shift) and shares.png (each group's concentration).
"""
import json
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs.timestep_modules import ARMS, TASKS  # noqa: E402
from experiments.driver import changes_lines, last_eval, summary_path, write_results  # noqa: E402
from experiments.gate import parse_summary_args, results_head  # noqa: E402

MOST = 10 / 12               # H1, H2: the share of runs that must agree (10 of the 12 of an arm)
ERANK_MAX = 0.5              # H2
LEARNED = 0.2                # H3: runs whose full gain is at least this enter the recovered means
RECOVERED_MIN, OVER_RANDOM = 0.5, 0.3     # H3
RHO_MIN = 0.5                # H4
STEER_GAIN = 0.02            # H6


def load(root: str, seeds) -> tuple[dict, dict]:
  """({seed: analysis}, {arm: {task: {seed: final eval success}}}) of what exists under ROOT."""
  analyses = {}
  for seed in seeds:
    path = os.path.join(root, f"analysis_s{seed}.json")
    if os.path.exists(path):
      with open(path) as f:
        analyses[seed] = json.load(f)
  finals = {}
  for arm in ARMS:
    for task in TASKS:
      for seed in seeds:
        row = last_eval(os.path.join(root, f"{arm}_{task}_s{seed}"))
        if row is not None:
          finals.setdefault(arm, {}).setdefault(task, {})[seed] = row["eval/success"]
  return analyses, finals


def runs_of(analyses: dict, arm: str) -> list:
  """[(seed, task, row)] of every analysed run of a full fine-tuning arm."""
  return [(s, t, a["arms"][arm]["tasks"][t]) for s, a in sorted(analyses.items()) if arm in a["arms"]
          for t in a["tasks"]]


def ts_concentration(row: dict, which: str = "shares") -> float:
  shares = row.get(which)
  return shares["timestep"]["concentration"] if shares else math.nan


def erank_ratios(row: dict) -> tuple[float, float]:
  """(median erank / Gaussian erank over the timestep kernels, the same over the other kernels)."""
  ts = [k["erank_vs_gaussian"] for k in row["kernels"].values() if k["group"] == "timestep"]
  rest = [k["erank_vs_gaussian"] for k in row["kernels"].values() if k["group"] != "timestep"]
  return (float(np.median(ts)) if ts else math.nan, float(np.median(rest)) if rest else math.nan)


def recovered(row: dict, s0: float, key: str) -> float:
  gain = row["full"] - s0
  return (row[key] - s0) / gain if gain >= LEARNED else math.nan


def _verdict(ok, detail: str) -> str:
  return f"{'not measured' if ok is None else 'supported' if ok else 'not supported'}: {detail}"


def _count(values, test) -> tuple[int, int]:
  values = [v for v in values if not math.isnan(v)]
  return sum(1 for v in values if test(v)), len(values)


def concentration_verdict(values, label: str) -> str:
  """H1's rule: C_ts > 1 in at least MOST of the runs (supported), C_ts < 1 in as many (the opposite), else mixed."""
  above, n = _count(values, lambda v: v > 1)
  below, _ = _count(values, lambda v: v < 1)
  if n == 0:
    return _verdict(None, f"{label}: no runs")
  detail = f"{label}: C_ts > 1 in {above} of {n} runs (median {np.nanmedian(values):.2f})"
  if above >= MOST * n:
    return _verdict(True, detail)
  return _verdict(False, detail + (": the opposite, the timestep modules are under-represented" if below >= MOST * n
                                   else ": mixed"))


def transfer_rhos(analyses: dict, arm: str, which: str) -> dict:
  sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
  from analyze import transfer_correlation
  return {s: transfer_correlation(a["arms"][arm], a["tasks"], which) for s, a in sorted(analyses.items())
          if arm in a["arms"]}


def verdicts(analyses: dict, finals: dict, seeds) -> dict:
  out = {}
  adam, sgd = runs_of(analyses, "adam"), runs_of(analyses, "sgd")
  out["H1"] = "; ".join([concentration_verdict([ts_concentration(r) for _, _, r in adam], "adam, weight deltas"),
                         concentration_verdict([ts_concentration(r, "gradient_shares") for _, _, r in adam],
                                               "adam, squared gradients")])
  out["H1-SGD"] = concentration_verdict([ts_concentration(r) for _, _, r in sgd], "sgd, weight deltas")
  ratios = [erank_ratios(r) for _, _, r in adam]
  low, n = _count([ts if rest > ts else math.inf for ts, rest in ratios], lambda v: v <= ERANK_MAX)
  out["H2"] = _verdict(None if not ratios else low >= MOST * len(ratios),
                       f"timestep kernels' median erank / Gaussian <= {ERANK_MAX} and below the other kernels' in "
                       f"{low} of {len(ratios)} adam runs (medians: timestep "
                       f"{np.nanmedian([a for a, _ in ratios]) if ratios else math.nan:.2f}, other "
                       f"{np.nanmedian([b for _, b in ratios]) if ratios else math.nan:.2f})")
  rec = {key: [recovered(r, analyses[s]["s0"][t], key) for s, t, r in adam]
         for key in ("graft_timestep", "random_timestep", "graft_rest")}
  means = {k: float(np.nanmean(v)) if any(not math.isnan(x) for x in v) else math.nan for k, v in rec.items()}
  used = sum(1 for x in rec["graft_timestep"] if not math.isnan(x))
  ok = None if not used else means["graft_timestep"] >= RECOVERED_MIN and \
      means["graft_timestep"] - means["random_timestep"] >= OVER_RANDOM
  out["H3"] = _verdict(ok, f"recovered by the timestep deltas alone {means['graft_timestep']:.2f} (>= {RECOVERED_MIN}), "
                           f"random directions of the same sizes {means['random_timestep']:.2f} (at least "
                           f"{OVER_RANDOM} below), every other delta {means['graft_rest']:.2f}; {used} adam runs "
                           f"gained >= {LEARNED}")
  for h, which in (("H4", "cosine_weight"), ("H4-function", "cosine_function")):
    rhos = transfer_rhos(analyses, "adam", which)
    out[h] = _verdict(None if not rhos else all(r >= RHO_MIN for r in rhos.values()),
                      f"Spearman rho of {which.split('_')[1]}-space cosine with transfer, per seed: "
                      + ", ".join(f"s{s} {r:.2f}" for s, r in rhos.items()) + f" (each >= {RHO_MIN})")
  diffs, seed_wins = [], 0
  for seed in seeds:
    pairs = [(finals.get("lora_ts", {}).get(t, {}).get(seed), finals.get("lora_all", {}).get(t, {}).get(seed))
             for t in TASKS]
    pairs = [(a, b) for a, b in pairs if a is not None and b is not None]
    if pairs:
      diffs += [a - b for a, b in pairs]
      seed_wins += float(np.mean([a - b for a, b in pairs])) >= 0
  n_seeds = len({s for t in TASKS for s in finals.get("lora_ts", {}).get(t, {})})
  out["H5"] = _verdict(None if not diffs else np.mean(diffs) > 0 and seed_wins >= 2,
                       f"timestep LoRA - standard LoRA final success, mean over {len(diffs)} runs "
                       f"{np.mean(diffs) if diffs else math.nan:+.3f}; timestep LoRA ahead in {seed_wins} of "
                       f"{n_seeds} seeds' task means (needs > 0 and >= 2)")
  steer = steering_means(adam)
  if steer:
    best = max(steer.get("1.25", math.nan), steer.get("1.5", math.nan))
    out["H6"] = _verdict(best - steer["1.0"] >= STEER_GAIN,
                         f"mean success along the timestep shift: alpha 1.0 {steer['1.0']:.3f}, best of 1.25 / 1.5 "
                         f"{best:.3f} ({best - steer['1.0']:+.3f}; needs >= +{STEER_GAIN})")
  else:
    out["H6"] = _verdict(None, "no adam runs")
  return out


def steering_means(runs: list) -> dict:
  if not runs:
    return {}
  return {a: float(np.mean([r["steer"][a] for _, _, r in runs])) for a in runs[0][2]["steer"]}


def tables(analyses: dict, finals: dict) -> list:
  lines = ["## Runs (seed mean, min-max over the seeds; success rates of the paired evaluation)", "",
           "| arm | task | S0 | full | timestep graft | random graft | rest graft | C_ts delta | C_ts grad |",
           "|---|---|---|---|---|---|---|---|---|"]
  fmt = lambda xs: (f"{np.nanmean(xs):.3f} ({np.nanmin(xs):.3f}-{np.nanmax(xs):.3f})"       # noqa: E731
                    if any(not math.isnan(x) for x in xs) else "-")
  for arm in ("adam", "sgd"):
    for task in TASKS:
      rs = [(s, r) for s, t, r in runs_of(analyses, arm) if t == task]
      if not rs:
        continue
      col = lambda f: fmt([f(s, r) for s, r in rs])                                        # noqa: E731
      lines.append(f"| {arm} | {task} | {col(lambda s, r: analyses[s]['s0'][task])} | {col(lambda s, r: r['full'])} | "
                   f"{col(lambda s, r: r['graft_timestep'])} | {col(lambda s, r: r['random_timestep'])} | "
                   f"{col(lambda s, r: r['graft_rest'])} | {col(lambda s, r: ts_concentration(r))} | "
                   f"{col(lambda s, r: ts_concentration(r, 'gradient_shares'))} |")
  lines += ["", "## Final success of every arm (each run's last evaluation)", "",
            "| arm | " + " | ".join(TASKS) + " |", "|---|" + "---|" * len(TASKS)]
  for arm in ARMS:
    cells = [fmt(list(finals.get(arm, {}).get(t, {}).values())) for t in TASKS]
    lines.append(f"| {arm} | " + " | ".join(cells) + " |")
  groups = next(iter(analyses.values()))["groups"] if analyses else {}
  if groups:
    lines += ["", "## Concentration C_g = update share / parameter share, per group (median over runs)", "",
              "| group | parameter share | adam delta | adam grad | sgd delta |", "|---|---|---|---|---|"]
    for g in [*groups, "other"]:
      def med(arm, which):
        xs = [r[which][g]["concentration"] for _, _, r in runs_of(analyses, arm) if r.get(which) and g in r[which]]
        return f"{np.median(xs):.2f}" if xs else "-"
      share = [r["shares"][g]["param_share"] for _, _, r in runs_of(analyses, "adam") if g in r["shares"]]
      if share:
        lines.append(f"| {g} | {share[0]:.3f} | {med('adam', 'shares')} | {med('adam', 'gradient_shares')} | "
                     f"{med('sgd', 'shares')} |")
  return lines


def plots(analyses: dict, out: str, root: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from experiments.arm_tables import save_figure
  fig, ax = plt.subplots(figsize=(5, 3.5))
  for arm in ("adam", "sgd"):
    steer = steering_means(runs_of(analyses, arm))
    if steer:
      ax.plot([float(a) for a in steer], list(steer.values()), marker="o", label=arm)
  ax.set_xlabel("alpha (theta_0 + alpha x timestep delta)")
  ax.set_ylabel("success (mean over tasks, seeds)")
  ax.legend()
  save_figure(fig, summary_path(out, root, "steering.png"))


def render(root: str, seeds) -> str:
  analyses, finals = load(root, seeds)
  text = results_head("timestep_modules", root)
  text += [f"- **{h}**: {v}" for h, v in verdicts(analyses, finals, seeds).items()]
  text += ["", *tables(analyses, finals)]
  text += changes_lines(root)
  return "\n".join(text) + "\n"


def main(argv=None):
  args, seeds = parse_summary_args(__doc__, "experiments/timestep_modules/runs", argv, one_plot=False)
  write_results(args.out, args.root, render(args.root, seeds))
  analyses, _ = load(args.root, seeds)
  if analyses:
    plots(analyses, args.out, args.root)


if __name__ == "__main__":
  main()
