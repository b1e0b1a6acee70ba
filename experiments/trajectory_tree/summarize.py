"""results.md and the plot of experiments/trajectory_tree (README.md is the pre-registration: what is measured, the
hypotheses and their decision rules, fixed before any run).

  python experiments/trajectory_tree/summarize.py --root=experiments/trajectory_tree/runs [--out=DIR]

Reads ROOT/results.jsonl (run.py's lines; the last line of each key wins) and writes results.md (also printed) and
trajectory_tree.png into ROOT, or into the folder --out (pass --out=experiments/trajectory_tree to refresh the
committed ones on purpose). Every verdict is computed here from the numbers by README's rules; where any line
comes from a --quick run, every verdict reads "smoke run".
"""
import argparse
import collections
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments.driver import add_summary_args, spread, summary_path, verdict_or_smoke, write_results  # noqa: E402

EQUAL_TOL = 1e-5          # H3: dedup vs expanded, relative
MEASURABLE = 1e-3         # H4: QwenGyre's weights vs expanded, gradient L2 relative
PAPER_TIME_REL = {1: 0.414, 5: 0.748}     # QwenGyre's J_max ablation (FOUND-2nd), fwd+bwd time / uncapped
ROLE_ORDER = ("main", "main summary", "sub-agent", "sub-agent summary")


def load(root: str) -> dict:
  """{type: [rows]}, the last line of each key."""
  rows = {}
  path = os.path.join(root, "results.jsonl")
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        if line.strip():
          row = json.loads(line)
          rows[row["key"]] = row
  by_type = collections.defaultdict(list)
  for row in rows.values():
    by_type[row["type"]].append(row)
  return by_type


def _yes(ok: bool) -> str:
  return "supported" if ok else "not supported"


def _grid(rows: list) -> dict:
  """{(b, f): [rows over seeds]}."""
  out = collections.defaultdict(list)
  for r in rows:
    out[r["branching"], r["shared"]].append(r)
  return dict(sorted(out.items()))


def _mean(rows, key) -> float:
  return float(np.mean([r[key] for r in rows]))


def _decreasing(xs) -> bool:
  return all(b < a for a, b in zip(xs, xs[1:]))


# ------------------------------------------------------------------------------------------------ tables

def tokens_table(grid: dict) -> list:
  lines = ["| B | f | shared tokens s | packed | expanded | packed / expanded | 1 - f(B-1)/B | s + B(L-s) |",
           "|" + "---|" * 8]
  for (b, f), rows in grid.items():
    r = rows[0]
    packed = sorted({x["tokens_packed"] for x in rows})
    lines.append(f"| {b} | {f:.2f} | {r['shared_tokens']} | {'/'.join(map(str, packed))} | {r['tokens_expanded']} | "
                 f"{r['token_ratio']:.4f} | {r['token_ratio_formula']:.4f} | {r['tokens_packed_formula']} |")
  return lines


def time_table(grid: dict) -> list:
  lines = ["| B | f | dedup fwd+bwd (ms) | expanded fwd+bwd (ms) | time dedup / expanded | tokens dedup / expanded |",
           "|" + "---|" * 6]
  for (b, f), rows in grid.items():
    lines.append(f"| {b} | {f:.2f} | {spread([1e3 * r['fwd_bwd_s_dedup'] for r in rows], '{:.1f}')} | "
                 f"{spread([1e3 * r['fwd_bwd_s_expanded'] for r in rows], '{:.1f}')} | "
                 f"{spread([r['time_ratio'] for r in rows])} | {rows[0]['token_ratio']:.3f} |")
  return lines


def equality_table(grid: dict, sampled: list) -> list:
  lines = ["| tree | seeds | exact: loss rel. (to scale) | exact: loss rel. (to abs(L)) | exact: grad L2 rel. | "
           "exact: grad max abs | QwenGyre: loss rel. (to scale) | QwenGyre: grad L2 rel. |", "|" + "---|" * 8]
  items = [(f"B {b}, f {f:.2f}", rows) for (b, f), rows in grid.items()]
  items += [(f"sampled, seed {r['seed']}", [r]) for r in sorted(sampled, key=lambda r: r["seed"])]
  for name, rows in items:
    mx = lambda k: max(r[k] for r in rows)          # noqa: E731  the worst seed
    lines.append(f"| {name} | {len(rows)} | {mx('loss_rel_scale'):.2e} | {mx('loss_rel'):.2e} | "
                 f"{mx('grad_rel_l2'):.2e} | {mx('grad_max_abs'):.2e} | "
                 f"{spread([r['qwengyre_loss_rel_scale'] for r in rows], '{:.3g}')} | "
                 f"{spread([r['qwengyre_grad_rel_l2'] for r in rows], '{:.3g}')} |")
  return lines


def sampled_lines(sampled: list, skipped: list) -> list:
  if not sampled:
    return [f"Not run: {skipped[-1]['reason']}." if skipped else "Not run (no sampled lines)."]
  lines = ["| seed | calls | packed | expanded | packed / expanded | dedup fwd+bwd (ms) | expanded fwd+bwd (ms) | "
           "time dedup / expanded |", "|" + "---|" * 8]
  for r in sorted(sampled, key=lambda r: r["seed"]):
    lines.append(f"| {r['seed']} | {r['paths']} | {r['tokens_packed']} | {r['tokens_expanded']} | "
                 f"{r['token_ratio']:.3f} | {1e3 * r['fwd_bwd_s_dedup']:.1f} | {1e3 * r['fwd_bwd_s_expanded']:.1f} | "
                 f"{r['time_ratio']:.3f} |")
  return lines


def _jmax(rows: list) -> dict:
  """{(selection, J): [rows over seeds]} in J_MAX order, uncapped (0) last."""
  out = collections.defaultdict(list)
  for r in rows:
    out[r["selection"], r["j_max"]].append(r)
  return dict(sorted(out.items(), key=lambda kv: (kv[0][0], kv[0][1] or 10 ** 9)))


def jmax_table(jm: dict) -> list:
  lines = ["| candidates | J_max | leaves chosen | packed tokens | coverage of trainable tokens | fwd+bwd / uncapped | "
           "QwenGyre (paper) | grad norm / uncapped | cos with uncapped | exact weights: grad norm / uncapped | "
           "exact weights: cos |", "|" + "---|" * 11]
  for (sel, j), rows in jm.items():
    paper = PAPER_TIME_REL.get(j)
    lines.append(f"| {sel} | {j or 'uncapped'} | {spread([r['leaves'] for r in rows], '{:.1f}')} | "
                 f"{spread([r['tokens_packed'] for r in rows], '{:.0f}')} | {spread([r['coverage'] for r in rows])} | "
                 f"{spread([r['time_rel'] for r in rows])} | {'-' if paper is None else f'{paper:.3f}'} | "
                 f"{spread([r['grad_norm_rel'] for r in rows])} | {spread([r['cos'] for r in rows])} | "
                 f"{spread([r['exact_grad_norm_rel'] for r in rows])} | {spread([r['exact_cos'] for r in rows])} |")
  return lines


def role_lines(rows: list) -> list:
  lines = ["| seed | calls | tree tokens | trainable | " + " | ".join(f"{r} output tokens" for r in ROLE_ORDER) + " |",
           "|" + "---|" * (4 + len(ROLE_ORDER))]
  seen = {}
  for r in rows:
    seen.setdefault(r["seed"], r)
  for seed, r in sorted(seen.items()):
    lines.append(f"| {seed} | {r['calls']} | {r['tree_tokens']} | {r['trainable_total']} | "
                 + " | ".join(str(r["role_tokens"].get(name, 0)) for name in ROLE_ORDER) + " |")
  return lines


# ------------------------------------------------------------------------------------------------ verdicts

def verdicts(grid: dict, sampled: list, jm: dict, smoke: bool) -> list:
  """README's decision rules, one row each."""
  out = []
  every = [r for rows in grid.values() for r in rows]
  if every:
    exact = all(r["tokens_packed"] == r["tokens_packed_formula"] for r in every)
    close = all(abs(r["token_ratio"] - r["token_ratio_formula"]) <= 1 / r["path_len"] for r in every)
    out.append(("H1", "tokens processed: packed = s + B(L-s), a ratio within 1/L of 1 - f(B-1)/B at every point",
                _yes(exact and close)))
    by_b = collections.defaultdict(list)
    for (b, f), rows in grid.items():
      by_b[b].append((f, _mean(rows, "time_ratio")))
    falls = all(_decreasing([t for _, t in sorted(v)]) for v in by_b.values())
    out.append(("H2a", "the mean time ratio dedup / expanded falls as f rises, for every B", _yes(falls)))
    shared = [r for r in every if r["shared"] > 0]
    less = all(r["time_ratio"] > r["token_ratio"] for r in shared)
    out.append(("H2b", "less than proportionally: time ratio > token ratio at every point with f > 0, every seed",
                _yes(bool(shared) and less)))
    zero = [r for r in every if r["shared"] == 0]
    out.append(("H2c", "with nothing shared (f = 0) the packed tree is slower: time ratio > 1, every B and seed",
                _yes(bool(zero) and all(r["time_ratio"] > 1 for r in zero))))
    eq = every + sampled
    worst = max(max(r["loss_rel_scale"], r["grad_rel_l2"]) for r in eq)
    out.append(("H3", f"exact weights: loss (to scale) and gradient (L2) relative differences < {EQUAL_TOL:g} at "
                f"every grid point, seed and sampled tree (worst {worst:.2e})", _yes(worst < EQUAL_TOL)))
    trained_shared = [r for r in every if r["shared_tokens"] > r["prompt_len"]]
    untouched = [r for r in every if r["shared_tokens"] <= r["prompt_len"]]
    measurable = all(r["qwengyre_grad_rel_l2"] > MEASURABLE for r in trained_shared)
    same = all(r["qwengyre_grad_rel_l2"] < EQUAL_TOL for r in untouched)
    by_b = collections.defaultdict(list)
    for (b, f), rows in grid.items():
      if rows[0]["shared_tokens"] > rows[0]["prompt_len"]:
        by_b[b].append((f, _mean(rows, "qwengyre_grad_rel_l2")))
    grows = all(_decreasing([-d for _, d in sorted(v)]) for v in by_b.values())
    out.append(("H4", f"QwenGyre's weights: gradient L2 relative difference > {MEASURABLE:g} wherever a trained token "
                f"is shared, < {EQUAL_TOL:g} where none is, and its mean grows with f for every B",
                _yes(bool(trained_shared) and measurable and same and grows)))
  for sel in sorted({sel for sel, _ in jm}):
    arms = {j: rows for (s, j), rows in jm.items() if s == sel}
    if not all(j in arms for j in (1, 2, 5, 0)):
      continue
    seeds = sorted({r["seed"] for r in arms[0]})
    at = lambda j, seed, k: next(r[k] for r in arms[j] if r["seed"] == seed)      # noqa: E731
    order = all(at(1, s, "time_rel") < at(2, s, "time_rel") < at(5, s, "time_rel") < 1 and
                at(1, s, "coverage") < at(2, s, "coverage") < at(5, s, "coverage") < 1 for s in seeds)
    out.append((f"H5a ({sel})", "J_max = 1 < 2 < 5 < uncapped in fwd+bwd time and in coverage, every seed",
                _yes(order)))
    grad = all(at(1, s, "grad_norm_rel") > 1 and at(5, s, "cos") > at(1, s, "cos") and
               abs(at(5, s, "grad_norm_rel") - 1) < abs(at(1, s, "grad_norm_rel") - 1) for s in seeds)
    out.append((f"H5b ({sel})", "QwenGyre's objective: grad norm at J_max = 1 above uncapped's, J_max = 5 closer to "
                "it, and J_max = 5 more aligned with uncapped (cos) than 1, every seed", _yes(grad)))
  return ["| hypothesis | rule | verdict |", "|---|---|---|"] + [
      f"| {name} | {rule} | {verdict_or_smoke(v, smoke)} |" for name, rule, v in out]


# ------------------------------------------------------------------------------------------------ plot

def plot(grid: dict, jm: dict, out: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
  by_b = collections.defaultdict(list)
  for (b, f), rows in grid.items():
    by_b[b].append((f, rows))
  for i, (b, items) in enumerate(sorted(by_b.items())):
    color = f"C{i}"
    fs = [f for f, _ in items]
    axes[0].plot(fs, [rows[0]["token_ratio"] for _, rows in items], "o-", color=color, label=f"B = {b}")
    axes[0].plot(fs, [1 - f * (b - 1) / b for f in fs], ":", color=color)
    t = np.array([[r["time_ratio"] for r in rows] for _, rows in items], dtype=object)
    mean = [np.mean(x) for x in t]
    axes[1].plot(fs, mean, "o-", color=color, label=f"B = {b}: time")
    axes[1].fill_between(fs, [min(x) for x in t], [max(x) for x in t], color=color, alpha=0.2)
    axes[1].plot(fs, [rows[0]["token_ratio"] for _, rows in items], "--", color=color, alpha=0.6,
                 label=f"B = {b}: tokens")
  axes[0].set(xlabel="shared-prefix fraction f", ylabel="tokens packed / expanded",
              title="tokens processed (dotted: 1 - f(B-1)/B)")
  axes[1].axhline(1.0, color="k", ls=":")
  axes[1].set(xlabel="shared-prefix fraction f", ylabel="dedup / expanded", title="fwd+bwd time (band: seeds)")
  for ax in axes[:2]:
    ax.legend(fontsize=8)
  labels = [f"{sel}\nJ={j or 'all'}" for sel, j in jm]
  x = np.arange(len(labels))
  for k, (key, name) in enumerate((("coverage", "coverage"), ("time_rel", "time / uncapped"),
                                   ("grad_norm_rel", "grad norm / uncapped"), ("cos", "cos with uncapped"))):
    axes[2].bar(x + (k - 1.5) * 0.2, [np.mean([r[key] for r in rows]) for rows in jm.values()], 0.2, label=name)
  for j, value in PAPER_TIME_REL.items():
    axes[2].axhline(value, color="k", ls=":", lw=0.8)
    axes[2].text(len(labels) - 0.5, value, f"paper J={j}", fontsize=7, va="bottom", ha="right")
  axes[2].set_xticks(x, labels, fontsize=7)
  axes[2].set(title="J_max ablation (mean over seeds)")
  axes[2].legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(out, dpi=110)
  plt.close(fig)


# ------------------------------------------------------------------------------------------------ document

def document(root: str, data: dict, plot_name: str) -> str:
  grid, sampled, jm = _grid(data["grid"]), data["sampled"], _jmax(data["jmax"])
  measured = data["grid"] + data["sampled"] + data["jmax"]
  smoke = any(r.get("quick") for r in measured + data["wall"])
  commits = sorted({r["commit"] for r in measured})
  cpus = sorted({f"{r['cpu']} ({r['cpu_isa']}, {r['cpu_cores']} cores)" for r in measured})
  seeds = sorted({r["seed"] for r in measured})
  sizes = sorted({f"{r['size']} ({r['params']:,} parameters)" for r in measured})
  wall = sum(r["wall_s"] for r in data["wall"])
  reps = sorted({r["reps"] for r in measured})
  path_len = sorted({r["path_len"] for r in data["grid"]})
  lines = ["# trajectory_tree: results", ""]
  if smoke:
    lines += ["**Smoke run** (`--quick` sizes): no verdict below means anything.", ""]
  lines += [
      "Pre-registered in [README.md](README.md). Written by `summarize.py` from the archived lines:", "",
      "```bash", f"python experiments/trajectory_tree/summarize.py --root={root}", "```", "",
      f"- commit(s): {', '.join(f'`{c}`' for c in commits)}; CPU: {'; '.join(cpus)}; jax "
      f"{', '.join(sorted({r['jax'] for r in measured}))}",
      f"- model(s): {', '.join(sizes)}; float32; seeds {', '.join(map(str, seeds))}; timings are medians of "
      f"{'/'.join(map(str, reps))} interleaved rounds after a warm-up; path length L = "
      f"{'/'.join(map(str, path_len)) or '-'}",
      f"- wall time of the run commands: {wall:.0f} s", "",
      "## Verdicts", "", *verdicts(grid, sampled, jm, smoke), "",
      "## H1: tokens processed (synthetic trees)", "", *tokens_table(grid), "",
      "## H2: forward+backward time", "", "Mean (min-max) over seeds.", "", *time_table(grid), "",
      "## H3, H4: loss and gradient, dedup vs expanded", "",
      "Exact weights: the worst seed. QwenGyre's weights: mean (min-max) over seeds. \"to scale\": the difference "
      "over sum |w| |log p|, which cannot cancel; \"to abs(L)\" over the expanded loss itself.", "",
      *equality_table(grid, sampled), "",
      "## Sampled trees (the pretrained base's own samples)", "", *sampled_lines(sampled, data["sampled_skipped"]), "",
      "## J_max ablation (one agent execution per seed)", "", *role_lines(data["jmax"]), "",
      "Mean (min-max) over seeds; time relative to uncapped within each candidate set, all arms timed in the same "
      "rounds. QwenGyre's objective: each trained token once with the execution's advantage, averaged per token.", "",
      *jmax_table(jm), "", f"![trajectory_tree]({plot_name})", ""]
  return "\n".join(lines)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default=os.path.join("experiments", "trajectory_tree", "runs"),
                 help="the archive (default) or a run's root")
  add_summary_args(p, one_plot=False)
  args = p.parse_args(argv)
  data = load(args.root)
  if not (data["grid"] or data["jmax"] or data["sampled"]):
    print(f"no measurements under {args.root}")
    return 1
  png = summary_path(args.out, args.root, "trajectory_tree.png")
  text = document(args.root, data, os.path.basename(png))
  plot(_grid(data["grid"]), _jmax(data["jmax"]), png)
  path = write_results(args.out, args.root, text)
  print(f"results: {path}\nplot: {png}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
