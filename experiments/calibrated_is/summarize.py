"""Summarise calibrated_is's rerun from the base: the calibration gate, the tables, the pre-registered verdicts
(pooled and per seed) and grad_mse.png, from the archive (or a run's root).

  python experiments/calibrated_is/summarize.py                                    # the archive, runs/
  python experiments/calibrated_is/summarize.py --root=/tmp/calibrated_is [--out=experiments/calibrated_is]

Reads ROOT/gate_<copy>/metrics.jsonl (the gate is recomputed from them by mismatch_gate.py; ROOT/gate.json, the
driver's record, must agree) and ROOT/results.jsonl (run.py's lines; the last line of each key wins). Prints the tables
and verdicts to paste into results.md and writes grad_mse.png into ROOT, or into --out. When the gate failed it
prints the gate and "not tested" for every hypothesis; when the newest command that computed gradients was a
`--quick` one, every verdict reads "smoke run".
The decision rules are README.md's, fixed before any run. For a pair (a, b) and a copy, d = nmse(a) - nmse(b) on
the same batch, pooled over seeds and batches (or one seed's batches): "lower" if mean(d) + 2 SE < 0, "higher" if
mean(d) - 2 SE > 0, "tie" if |r| + 2 SE_r <= 0.05 with r = mean(d) / mean(nmse(b)).
"""
import argparse
import collections
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs.calibrated_is import ARMS, COPIES  # noqa: E402
from experiments.calibrated_is import mismatch_gate  # noqa: E402
from experiments.driver import add_summary_args, summary_path, verdict_or_smoke  # noqa: E402
from experiments.gate import gate_table, read_gate  # noqa: E402

ARCHIVE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "runs")
TIE_MARGIN = 0.05
# name -> (arm a, arm b, what is predicted, the rule's kind): README's hypotheses.
TESTS = {
    "H1": ("calibrated", "token_tis", "calibrated IS (ours) has lower gradient error than token-TIS", "lower"),
    "H2": ("cis", "token_tis", "the published rule has lower gradient error than token-TIS", "lower"),
    "H3": ("calibrated", "cis", "calibrated IS (ours) has lower gradient error than the published rule", "lower"),
    "H4": ("token_tis", "none", "token-TIS is not above no correction (the earlier run's pattern does not recur)",
           "not_higher"),
}
NOT_TESTED = "not tested"


def load(root):
  rows = {}
  path = os.path.join(root, "results.jsonl")
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        row = json.loads(line)
        rows[row["key"]] = row
  by_type = collections.defaultdict(list)
  for row in rows.values():
    by_type[row["type"]].append(row)
  return by_type


def gate_of(root):
  """The gate's outcome recomputed from the gate runs' metrics; checked against the driver's gate.json. The copies
  are those with a gate run in `root` (the first attempt's archive holds bf16 and fp8 only: README, amendment 1)."""
  outcome = mismatch_gate.evaluate({copy: mismatch_gate.read_rows(os.path.join(root, f"gate_{copy}"))
                                    for copy in COPIES if os.path.isdir(os.path.join(root, f"gate_{copy}"))})
  written = read_gate(root)
  if written is not None:
    if written.get("arms_copies") != outcome["arms_copies"]:
      raise SystemExit(f"{os.path.join(root, 'gate.json')} says the arms ran on {written.get('arms_copies')}, but "
                       f"the gate runs' metrics give {outcome['arms_copies']}: the archive is inconsistent.")
    outcome["base"] = written.get("base")
  return outcome


def per_seed(rows, copy, arm, field):
  """{seed: mean of `field` over that seed's batches}."""
  seeds = collections.defaultdict(list)
  for r in rows:
    if r["copy"] == copy and r["arm"] == arm and r.get(field) is not None:
      seeds[r["seed"]].append(float(r[field]))
  return {s: float(np.mean(v)) for s, v in sorted(seeds.items())}


def cell(values, digits=2):
  """'mean ± std over seeds' of per-seed values (the spread is the std of the seed means)."""
  v = np.array(list(values.values()))
  if len(v) == 0:
    return "-"
  return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}" if len(v) > 1 else f"{v.mean():.{digits}f}"


def paired(rows, copy, a, b, seed=None):
  """(mean d, SE, r, SE_r, n) of d = nmse(a) - nmse(b), paired by (seed, batch); one seed's batches or all."""
  val = {(r["seed"], r["batch"], r["arm"]): r["nmse"] for r in rows
         if r["copy"] == copy and (seed is None or r["seed"] == seed)}
  keys = sorted({(s, i) for s, i, arm in val if arm == b and (s, i, a) in val})
  if len(keys) < 2:
    return (float("nan"),) * 4 + (len(keys),)
  d = np.array([val[k + (a,)] - val[k + (b,)] for k in keys])
  base = np.mean([val[k + (b,)] for k in keys])
  se = d.std(ddof=1) / np.sqrt(len(d))
  return d.mean(), se, d.mean() / base, se / base, len(d)


def calls_of(mean, se, r, se_r) -> dict:
  """README's three calls, each on its own (lower and tie can both hold)."""
  return {"lower": bool(mean + 2 * se < 0), "tie": bool(abs(r) + 2 * se_r <= TIE_MARGIN),
          "higher": bool(mean - 2 * se > 0)}


def verdict(kind, calls) -> str:
  """A hypothesis' verdict from its calls at every tested copy (README's decision rules)."""
  if not calls:
    return NOT_TESTED
  hits = [c["lower"] if kind == "lower" else not c["higher"] for c in calls]
  if all(hits):
    return "supported"
  if kind == "lower":
    return "not supported" if not any(hits) else "mixed"
  return "not supported" if all(c["higher"] for c in calls) else "mixed"


def table(title, header, lines):
  print(f"\n{title}\n")
  print("| " + " | ".join(header) + " |")
  print("|" + "---|" * len(header))
  for line in lines:
    print("| " + " | ".join(line) + " |")


def fmt(x, digits=4):
  return "nan" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def print_gate(root, outcome):
  print("\n".join(gate_table(root)))
  table("Calibration gate (README): the gate runs' first iterations, as the trainer logged them",
        ["copy", "iterations", "mismatch/mean", "mismatch/max", "rollout_corr/kl", "k3 KL",
         "published rule truncated", "reward", "informative groups", "held-out greedy acc", "mismatch gate"],
        [[copy, str(c["iterations"]), fmt(c["mismatch/mean"]), fmt(c["mismatch/max"]), fmt(c["rollout_corr/kl"], 5),
          fmt(c["rollout_corr/k3_kl"], 5), fmt(c["rollout_corr/rollout_is_ratio_fraction_high"], 3),
          fmt(c["reward"], 3), fmt(c["informative_groups"], 3), fmt(c["eval_accuracy"], 3),
          "pass" if c["pass"] else "FAIL"] for copy, c in outcome["copies"].items()])
  base = outcome.get("base") or {}
  print(f"\nbase: {base.get('path', '?')}, model.safetensors SHA-256 {base.get('model_safetensors_sha256', '?')}")
  print(f"GATE: capability {'pass' if outcome['capability']['pass'] else 'FAIL'}; mismatch/mean >= "
        f"{mismatch_gate.MIN_MISMATCH}: " + ", ".join(f"{copy} {'pass' if c['pass'] else 'FAIL'}"
                                                     for copy, c in outcome["copies"].items()))
  print(f"GATE: {'PASSED: the arms ran on ' + ', '.join(outcome['arms_copies']) if outcome['passed'] else 'FAILED'}")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default=ARCHIVE, help="the archive (default) or a run's root")
  add_summary_args(p, one_plot=True)
  a = p.parse_args(argv)
  if not any(os.path.exists(os.path.join(a.root, f"gate_{copy}", "metrics.jsonl")) for copy in COPIES):
    print(f"{a.root}: no gate runs yet (run.py --part=gate makes them); nothing to summarise")
    return
  outcome = gate_of(a.root)
  print_gate(a.root, outcome)
  t = load(a.root)
  grads = t["grad"]
  copies = [c for c in outcome["arms_copies"] if any(r["copy"] == c for r in grads)]
  if not outcome["passed"] or not copies:
    why = "the gate failed" if not outcome["passed"] else "no gradient rows yet"
    for name, (_, _, claim, _) in TESTS.items():
      print(f"{name} ({claim}): VERDICT: {NOT_TESTED} ({why})")
    return
  grad_runs = [r for r in t["wall"] if r["part"] in ("all", "grad")]
  smoke = bool(grad_runs) and grad_runs[-1]["quick"]
  seeds = sorted({r["seed"] for r in grads})
  arms = list(ARMS)
  print(f"\nseeds {seeds}; copies {copies}; "
        f"{len({(r['seed'], r['batch']) for r in grads}) // max(len(seeds), 1)} batch indices per seed")

  table("Target g* (the master's own rollouts, no correction)", ["seed", "batches x rows", "cos(half 1, half 2)",
        "noise floor ‖g* − E g*‖² / ‖g*‖²", "mean reward", "informative groups"],
        [[str(r["seed"]), f"{r['batches']} x {r['rows_per_batch']}", f"{r['half_cos']:.3f}", f"{r['floor_nmse']:.4f}",
          f"{r['reward']:.3f}", f"{r['informative']:.3f}"] for r in sorted(t["target"], key=lambda r: r["seed"])])

  lines = []
  for copy in copies:
    b = [r for r in t["batch"] if r["copy"] == copy]
    sigma = [r["sigma"] for r in grads if r["copy"] == copy and r["arm"] == "calibrated"]
    trunc = [r["truncated_frac"] for r in grads if r["copy"] == copy and r["arm"] == "cis"]
    lines.append([copy, str(len(b)), fmt(np.mean([r["lr_abs"] for r in b])),
                  fmt(np.nanmean([r["lr_abs_conf"] for r in b])), fmt(np.nanmean([r["lr_abs_unconf"] for r in b])),
                  fmt(np.mean([r["frac_conf"] for r in b]), 3), fmt(np.mean([r["k3_kl"] for r in b]), 6),
                  fmt(np.mean([r["reward"] for r in b]), 3), fmt(np.mean(sigma)), fmt(np.mean(trunc), 3)])
  table("The copies' mismatch in the measured batches: mean |log rho| over policy tokens (all / trainer p > 0.9 / "
        "p < 0.3), the share of p > 0.9 tokens, k3 KL, reward, calibrated's sigma, the published rule's truncated "
        "fraction", ["copy", "batches", "mean abs log rho", "p > 0.9", "p < 0.3", "share p > 0.9", "k3 KL",
                     "reward", "sigma (calibrated)", "truncated (cis)"], lines)

  for field, title, digits in (
      ("nmse", "Normalised gradient MSE ‖g − g*‖² / ‖g*‖² per batch (mean over seeds ± std of the seed means)", 3),
      ("cos", "cosine(g, g*) per batch (mean over seeds ± std of the seed means)", 4)):
    table(title, ["copy"] + arms, [[c] + [cell(per_seed(grads, c, arm, field), digits) for arm in arms]
                                   for c in copies])
  mg = t["mean_grad"]
  table("Error of the mean of the K batch gradients, nmse (bias proxy: per-batch variance / K remains)",
        ["copy"] + arms, [[c] + [cell(per_seed(mg, c, arm, "nmse"), 3) for arm in arms] for c in copies])
  lines = []
  for c in copies:
    cells = []
    for arm in arms:
      one, mean_k = per_seed(grads, c, arm, "nmse"), per_seed(mg, c, arm, "nmse")
      n = {r["seed"]: r["batches"] for r in mg if r["copy"] == c and r["arm"] == arm}
      # E‖mean_K g − g*‖² = bias² + var/K and E‖g − g*‖² = bias² + var (g* taken as exact).
      bias = {s: (n[s] * mean_k[s] - one[s]) / (n[s] - 1) for s in one if s in mean_k and n[s] > 1}
      cells.append(f"{cell(bias, 3)} / {np.mean([one[s] - bias[s] for s in bias]):.2f}" if bias else "-")
    lines.append([c] + cells)
  table("Bias² / variance split of the per-batch nmse (bias² = (K e_K − e_1) / (K − 1); mean ± std over seeds, "
        "then the variance)", ["copy"] + arms, lines)
  for field, title in (("ess", "ESS fraction (rollout_corr/rollout_is_eff_sample_size)"),
                       ("masked_frac", "Rejected token fraction (rollout_corr/rollout_rs_masked_fraction)"),
                       ("truncated_frac", "Truncated token fraction (rollout_corr/rollout_is_ratio_fraction_high)")):
    table(title, ["copy"] + arms[1:], [[c] + [cell(per_seed(grads, c, arm, field), 3) for arm in arms[1:]]
                                       for c in copies])

  lines, calls = [], collections.defaultdict(list)
  for name, (x, y, _, _) in TESTS.items():
    for c in copies:
      for scope in [None] + seeds:
        mean, se, r, se_r, n = paired(grads, c, x, y, scope)
        call = calls_of(mean, se, r, se_r)
        calls[(name, scope)].append(call)
        lines.append([name, f"{x} − {y}", c, "pooled" if scope is None else f"seed {scope}", str(n),
                      f"{mean:+.4f} ± {se:.4f}", f"{100 * r:+.2f}% ± {100 * se_r:.2f}%"]
                     + ["yes" if call[k] else "no" for k in ("lower", "tie", "higher")])
  table("Pre-registered tests: d = nmse(a) − nmse(b), paired per batch (mean ± SE)",
        ["test", "a − b", "copy", "scope", "pairs", "d", "d / nmse(b)", "lower (mean+2SE<0)",
         "tie (abs(r)+2SE_r<=5%)", "higher (mean−2SE>0)"], lines)
  print()
  for name, (_, _, claim, kind) in TESTS.items():
    pooled = verdict_or_smoke(verdict(kind, calls[(name, None)]), smoke)
    by_seed = ", ".join(f"seed {s}: {verdict_or_smoke(verdict(kind, calls[(name, s)]), smoke)}" for s in seeds)
    print(f"{name} ({claim}; copies {', '.join(copies)}): VERDICT: {pooled} (per seed: {by_seed})")
  for r in t["wall"]:
    print(f"wall: part {r['part']} seeds '{r['seeds']}'{' (quick)' if r['quick'] else ''}: {r['wall_s']:.0f} s")

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
  width = 0.8 / len(copies)
  for k, c in enumerate(copies):
    vals = [list(per_seed(grads, c, arm, "nmse").values()) for arm in arms]
    axes[0].bar(np.arange(len(arms)) + k * width, [np.mean(v) for v in vals], width,
                yerr=[np.std(v) for v in vals], capsize=3, label=f"{c} copy")
    tests = [paired(grads, c, x, y) for x, y, _, _ in TESTS.values()]
    axes[1].errorbar(np.arange(len(TESTS)) + k * width, [100 * q[2] for q in tests],
                     yerr=[200 * q[3] for q in tests], fmt="o", capsize=4, label=f"{c} copy")
  axes[0].set(title="gradient nmse per batch (mean over seeds, seed std)", xticks=np.arange(len(arms)),
              xticklabels=arms)
  axes[0].set_ylim(bottom=0)
  axes[1].axhspan(-100 * TIE_MARGIN, 100 * TIE_MARGIN, color="gray", alpha=0.2, label="tie band (±5%)")
  axes[1].axhline(0, color="k", lw=0.8)
  axes[1].set(title="pre-registered tests: nmse(a) / nmse(b) − 1, % (± 2 SE, pooled)",
              xticks=np.arange(len(TESTS)), xticklabels=[f"{n}\n{x} vs {y}" for n, (x, y, _, _) in TESTS.items()])
  for ax in axes:
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
  fig.tight_layout()
  out = summary_path(a.out, a.root, "grad_mse.png")
  fig.savefig(out, dpi=100)
  print(f"wrote {out}")


if __name__ == "__main__":
  main()
