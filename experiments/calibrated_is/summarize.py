"""Summarise a calibrated_is run: markdown tables, the pre-registered verdict, and grad_mse.png.

  python experiments/calibrated_is/summarize.py /tmp/calibrated_is [--out=OUT_DIR]

Reads DIR/results.jsonl (run.py's lines; the last line of each key wins, so reruns of a part replace its rows),
prints the tables and the verdict (paste them into results.md) and writes grad_mse.png (and reward_curves.png
when the curves part ran) into DIR, or into OUT_DIR (the committed plots: --out=experiments/calibrated_is). When
the newest run.py command that computed gradients was a `--quick` one, the verdict reads "smoke run": its
sizes decide nothing.
The decision rules are README.md's, fixed before any run:
d_b = nmse(calibrated) - nmse(token_tis) on the same batch, pooled over seeds and batches; "lower" if
mean(d) + 2 SE < 0; "tie" if |r| + 2 SE_r <= 0.05 with r = mean(d) / mean(nmse(token_tis)).
"""
import argparse
import collections
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments.driver import add_summary_args, summary_path, verdict_or_smoke  # noqa: E402

ARMS = ("none", "token_tis", "seq_tis", "seq_mis", "geo_mis", "icepop", "calibrated")
NOISE_KINDS = ("uniform", "tail")
TIE_MARGIN = 0.05


def load(workdir):
  rows = {}
  with open(os.path.join(workdir, "results.jsonl")) as f:
    for line in f:
      row = json.loads(line)
      rows[row["key"]] = row
  by_type = collections.defaultdict(list)
  for row in rows.values():
    by_type[row["type"]].append(row)
  return by_type


def settings_of(rows):
  order = {"on_policy": 0, "uniform": 1, "tail": 2, "bf16": 3}
  return sorted({(r["kind"], r["scale"]) for r in rows}, key=lambda s: (order.get(s[0], 9), s[1]))


def label(kind, scale):
  return kind if kind in ("on_policy", "bf16") else f"{kind} {scale:g}"


def per_seed(rows, kind, scale, arm, field):
  """{seed: mean of `field` over that seed's batches}."""
  seeds = collections.defaultdict(list)
  for r in rows:
    if r["kind"] == kind and r["scale"] == scale and r["arm"] == arm:
      seeds[r["seed"]].append(r[field])
  return {s: float(np.mean(v)) for s, v in sorted(seeds.items())}


def cell(values, digits=2):
  """'mean +- std over seeds' of per-seed values (the spread is the std of the seed means)."""
  v = np.array(list(values.values()))
  if len(v) == 0:
    return "-"
  return f"{v.mean():.{digits}f} ± {v.std(ddof=1):.{digits}f}" if len(v) > 1 else f"{v.mean():.{digits}f}"


def _group(rows, value):
  """{(kind, scale, arm): [value(row), ...]}."""
  out = collections.defaultdict(list)
  for r in rows:
    out[(r["kind"], r["scale"], r["arm"])].append(value(r))
  return out


def paired(rows, kind, scale, a="calibrated", b="token_tis"):
  """(mean d, SE, r, SE_r, n) of d = nmse(a) - nmse(b), paired by (seed, batch)."""
  val = {(r["seed"], r["batch"], r["arm"]): r["nmse"] for r in rows if r["kind"] == kind and r["scale"] == scale}
  keys = sorted({(s, i) for s, i, arm in val if arm == b and (s, i, a) in val})
  d = np.array([val[k + (a,)] - val[k + (b,)] for k in keys])
  base = np.mean([val[k + (b,)] for k in keys])
  se = d.std(ddof=1) / np.sqrt(len(d))
  return d.mean(), se, d.mean() / base, se / base, len(d)


def calls_of(mean, se, r, se_r):
  """The README's two rules, each on its own (they can both hold): (lower, tie)."""
  return mean + 2 * se < 0, abs(r) + 2 * se_r <= TIE_MARGIN


def table(title, header, lines):
  print(f"\n{title}\n")
  print("| " + " | ".join(header) + " |")
  print("|" + "---|" * len(header))
  for line in lines:
    print("| " + " | ".join(line) + " |")


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("workdir")
  add_summary_args(p, one_plot=False)
  a = p.parse_args(argv)
  t = load(a.workdir)
  grads, batches = t["grad"], t["batch"]
  settings = settings_of(grads)
  seeds = sorted({r["seed"] for r in grads})
  print(f"seeds {seeds}; {len({(r['seed'], r['batch']) for r in batches}) // max(len(seeds), 1)} "
        f"batch indices per seed and setting")
  for r in t["sft"]:
    print(f"SFT policy: step {r['step']}, held-out greedy accuracy {r['accuracy']:.3f}, pass@4 {r['pass4']}")

  table("Target g* (unperturbed rollouts, no correction)", ["seed", "batches x rows", "cos(half 1, half 2)",
        "noise floor ‖g* − E g*‖² / ‖g*‖²", "mean reward"],
        [[str(r["seed"]), f"{r['batches']} x {r['rows_per_batch']}", f"{r['half_cos']:.3f}",
          f"{r['floor_nmse']:.4f}", f"{r['reward']:.3f}"] for r in sorted(t["target"], key=lambda r: r["seed"])])

  lines = []
  for kind, scale in settings:
    b = [r for r in batches if r["kind"] == kind and r["scale"] == scale]
    cal = [r["sigma"] for r in grads if r["kind"] == kind and r["scale"] == scale and r["arm"] == "calibrated"]
    lines.append([label(kind, scale), f"{np.mean([r['lr_abs'] for r in b]):.4f}",
                  f"{np.nanmean([r['lr_abs_conf'] for r in b]):.4f}",
                  f"{np.nanmean([r['lr_abs_unconf'] for r in b]):.4f}", f"{np.mean([r['reward'] for r in b]):.3f}",
                  f"{np.mean(cal):.4f}"])
  table("Engine settings: mean |log rho| over policy tokens (all / trainer p > 0.9 / p < 0.3), reward, "
        "calibrated's sigma", ["setting", "mean abs log rho", "p > 0.9", "p < 0.3", "reward", "sigma (calibrated)"],
        lines)

  for field, title, digits in (("nmse", "Normalised gradient MSE ||g - g*||² / ||g*||² per batch (mean over "
                                "seeds ± std of the seed means)", 2),
                               ("cos", "cosine(g, g*) per batch (mean over seeds ± std of the seed means)", 3)):
    table(title, ["setting"] + list(ARMS),
          [[label(k, s)] + [cell(per_seed(grads, k, s, arm, field), digits) for arm in ARMS] for k, s in settings])
  mg = t["mean_grad"]
  table("Error of the mean of the K batch gradients (bias proxy; per-batch variance / K remains): nmse",
        ["setting"] + list(ARMS),
        [[label(k, s)] + [cell(per_seed(mg, k, s, arm, "nmse"), 2) for arm in ARMS] for k, s in settings])
  lines = []
  for k, s in settings:
    cells = []
    for arm in ARMS:
      one, mean_k = per_seed(grads, k, s, arm, "nmse"), per_seed(mg, k, s, arm, "nmse")
      n = {r["seed"]: r["batches"] for r in mg if r["kind"] == k and r["scale"] == s and r["arm"] == arm}
      # E||mean_K g - g*||^2 = bias^2 + var/K and E||g - g*||^2 = bias^2 + var (g* taken as exact).
      bias = {seed: (n[seed] * mean_k[seed] - one[seed]) / (n[seed] - 1) for seed in one}
      cells.append(f"{cell(bias, 2)} / {np.mean([one[x] - bias[x] for x in one]):.1f}")
    lines.append([label(k, s)] + cells)
  table("POST-HOC: bias² / variance split of the per-batch nmse (bias² = (K e_K - e_1) / (K - 1), e_K the mean-of-K "
        "error, e_1 the per-batch error; bias² mean ± std over seeds, then the variance)", ["setting"] + list(ARMS),
        lines)
  norm2 = {key: float(np.mean(v)) for key, v in _group(grads, lambda r: r["g_norm_rel"] ** 2).items()}
  table("POST-HOC: squared gradient norm ‖g‖² / ‖g*‖² per batch (variance shows up as norm)",
        ["setting"] + list(ARMS), [[label(k, s)] + [f"{norm2[(k, s, arm)]:.1f}" for arm in ARMS] for k, s in settings])
  for field, title in (("ess", "ESS fraction (rollout_corr/rollout_is_eff_sample_size)"),
                       ("masked_frac", "Masked token fraction (rollout_corr/rollout_rs_masked_fraction)")):
    table(title, ["setting"] + list(ARMS[1:]),
          [[label(k, s)] + [cell(per_seed(grads, k, s, arm, field), 3) for arm in ARMS[1:]] for k, s in settings])
  table("Fraction of batches with no kept token (g = 0)", ["setting"] + list(ARMS[1:]),
        [[label(k, s)] + [f"{np.mean(list(per_seed(grads, k, s, arm, 'empty').values())):.2f}" for arm in ARMS[1:]]
         for k, s in settings])

  lines, calls = [], {}
  for kind, scale in settings:
    mean, se, r, se_r, n = paired(grads, kind, scale)
    calls[(kind, scale)] = calls_of(mean, se, r, se_r)
    higher = mean - 2 * se > 0
    lines.append([label(kind, scale), str(n), f"{mean:+.3f} ± {se:.3f}", f"{100 * r:+.1f}% ± {100 * se_r:.1f}%",
                  "yes" if calls[(kind, scale)][0] else "no", "yes" if calls[(kind, scale)][1] else "no",
                  "yes" if higher else "no"])
  table("Pre-registered test: d = nmse(calibrated) - nmse(token_tis), paired per batch (mean ± SE)",
        ["setting", "pairs", "d", "d / nmse(token_tis)", "lower (mean+2SE<0)", "tie (abs(r)+2SE_r<=5%)",
         "higher (mean-2SE>0)"], lines)
  tail = [calls[s][0] for s in settings if s[0] == "tail"]
  uniform = [calls[s][1] for s in settings if s[0] == "uniform"]
  verdict = "supported" if all(tail) and all(uniform) else "not supported" if not any(tail) else "mixed"
  # The gradient rows are the newest grad command's: a full one rewrites every key a quick one wrote (its
  # seeds, settings and batch indices are a subset of the full sizes').
  grad_runs = [r for r in t["wall"] if r["part"] in ("all", "grad")]
  verdict = verdict_or_smoke(verdict, bool(grad_runs) and grad_runs[-1]["quick"])
  print(f"\ntail: lower at {sum(tail)} of {len(tail)} strengths; uniform: tie at {sum(uniform)} of {len(uniform)} "
        f"strengths\nVERDICT: {verdict}")

  diag = sorted(t["diagnose"], key=lambda r: (NOISE_KINDS.index(r["kind"]), r["scale"]))
  if diag:
    table("POST-HOC diagnostic (not pre-registered): per-step mismatch the corrections see vs the shift of the "
          "distribution tokens are drawn from", ["setting", "realized mean abs log rho (q_z)",
          "marginal mean abs log rho (qbar)", "KL(q_z ‖ pi)", "KL(qbar ‖ pi)"],
          [[label(r["kind"], r["scale"]), f"{r['realized_abs_lr']:.4f}", f"{r['marginal_abs_lr']:.4f}",
            f"{r['realized_kl']:.5f}", f"{r['marginal_kl']:.6f}"] for r in diag])

  curves = sorted(t["curve"], key=lambda r: (r["kind"], ARMS.index(r["arm"])))
  if curves:
    table("Reward curves (one seed, GRPO from the SFT checkpoint): training reward, held-out greedy accuracy",
          ["setting", "arm", "reward it 1-5", "reward last 5", "mean reward", "held-out acc", "mismatch/mean"],
          [[label(r["kind"], r["scale"]), r["arm"], f"{np.mean(r['reward'][:5]):.3f}",
            f"{np.mean(r['reward'][-5:]):.3f}", f"{np.mean(r['reward']):.3f}", f"{r['accuracy']:.3f}",
            f"{r['lr_abs']:.3f}"] for r in curves])
  for r in t["wall"]:
    print(f"wall: part {r['part']} seed {r['seed']}{' (quick)' if r['quick'] else ''}: {r['wall_s']:.0f} s")

  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  # geo_mis at verl's preset is off the MSE scale (tables); the last row is the pre-registered paired test.
  fig, axes = plt.subplots(3, 2, figsize=(12, 11), sharex=True)
  for col, kind in enumerate(NOISE_KINDS):
    scales = sorted({s for k, s in settings if k == kind})
    if not scales:
      continue
    for arm in ARMS:
      for row, field in enumerate(("nmse", "cos")):
        if arm == "geo_mis" and field == "nmse":
          continue
        vals = [list(per_seed(grads, kind, s, arm, field).values()) for s in scales]
        mean, sd = np.array([np.mean(v) for v in vals]), np.array([np.std(v) for v in vals])
        axes[row, col].errorbar(scales, mean, yerr=sd, marker="o", capsize=3, label=arm, color=f"C{ARMS.index(arm)}")
    on = [r["nmse"] for r in grads if r["kind"] == "on_policy" and r["arm"] == "none"]
    if on:
      axes[0, col].axhline(np.mean(on), color="gray", ls="--", lw=1, label="on-policy (no mismatch)")
    test = np.array([paired(grads, kind, s)[2:4] for s in scales])
    axes[2, col].errorbar(scales, 100 * test[:, 0], yerr=200 * test[:, 1], marker="o", capsize=3,
                            color=f"C{ARMS.index('calibrated')}")
    axes[2, col].axhspan(-100 * TIE_MARGIN, 100 * TIE_MARGIN, color="gray", alpha=0.2, label="tie band (+-5%)")
    axes[2, col].axhline(0, color="k", lw=0.8)
    axes[0, col].set(title=f"{kind} noise: normalised grad MSE per batch (geo_mis off scale)", xscale="log")
    axes[1, col].set(title=f"{kind} noise: cosine(g, g*)", xscale="log")
    axes[2, col].set(title=f"{kind}: nmse(calibrated) / nmse(token_tis) - 1, % (+-2 SE)", xscale="log",
                     xlabel="noise scale sigma")
  for ax in axes.flat:
    ax.grid(alpha=0.3)
  axes[0, 1].legend(fontsize=8)
  axes[2, 1].legend(fontsize=8)
  fig.tight_layout()
  out = summary_path(a.out, a.workdir, "grad_mse.png")
  fig.savefig(out, dpi=100)
  print(f"wrote {out}")
  if curves:
    fig, axes = plt.subplots(1, len(NOISE_KINDS), figsize=(12, 3.5), sharey=True)
    for ax, kind in zip(axes, NOISE_KINDS):
      for r in (c for c in curves if c["kind"] == kind):
        smooth = np.convolve(r["reward"], np.ones(5) / 5, mode="valid")
        ax.plot(np.arange(5, len(r["reward"]) + 1), smooth, label=f"{r['arm']} (acc {r['accuracy']:.2f})")
      ax.set(title=f"{kind} noise, sigma 1: training reward (5-iteration mean)", xlabel="RL iteration")
      ax.grid(alpha=0.3)
      ax.legend(fontsize=7)
    fig.tight_layout()
    out = summary_path(a.out, a.workdir, "reward_curves.png")
    fig.savefig(out, dpi=100)
    print(f"wrote {out}")


if __name__ == "__main__":
  main()
