"""Summarise experiments/opd_scale: the calibration gate, base accuracies, per-pair gap recovery and top-k
overlaps, the pre-registered tests (README.md), a PNG of the curves and one of recovery against overlap and
against teacher accuracy.

  python experiments/opd_scale/summarize.py --root=experiments/opd_scale/runs [--seeds=0,1,2] [--out=DIR]

Reads what the driver archives (run.py; experiments/archive.py): each workdir's config.json and metrics.jsonl,
ROOT/gate.json, ROOT/overlaps.json (overlaps.py computed it from the checkpoints, which the archive does not
keep) and ROOT/runs.jsonl (command walls); the driver's own root reads the same. The plots, curves.png and
recovery.png, go to ROOT, or where --out says.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.opd_scale import ARMS, PAIRS, STUDENT_WIDTHS, TEACHERS  # noqa: E402
from experiments.arm_tables import load_from_start, save_figure, summarize  # noqa: E402
from experiments.driver import command_walls, spread, summary_path  # noqa: E402
from experiments.gate import parse_summary_args  # noqa: E402
from experiments.opd_scale.overlaps import read_overlaps  # noqa: E402
from experiments.opd_scale.workdirs import base_accuracy  # noqa: E402

METRICS = {"held-out accuracy": "eval/accuracy", "sample reward (T=1)": "reward", "entropy": "entropy",
           "response length": "eval/response_len"}
PRIMARY = "overlap@5"           # the pre-registered predictor (README)
MIN_ROOM = 0.10                 # recovery is defined for pairs whose teacher is at least this far above the student
MIN_RANGE = 0.05                # H1 needs the eligible triples' initial overlap@5 to span at least this
TIE_R, TIE_GAIN, TIE_RHO = 0.10, 0.02, 0.2
SIGN_ROOM = 0.05                # H5: pairs whose |room| is at least this
S128 = [t for s, t in PAIRS if s == "s128"]     # the teachers of the width-128 student


def rank(a) -> np.ndarray:
  """Ranks from 0, ties given their average rank."""
  _, inv, counts = np.unique(np.asarray(a, float), return_inverse=True, return_counts=True)
  ends = np.cumsum(counts)
  return ((ends - counts + ends - 1) / 2.0)[inv]


def spearman(x, y) -> float:
  """Spearman's rank correlation (Pearson's of the average ranks); nan for fewer than 3 points or a constant."""
  if len(x) < 3:
    return np.nan
  rx, ry = rank(x), rank(y)
  if rx.std() == 0 or ry.std() == 0:
    return np.nan
  return float(np.corrcoef(rx, ry)[0, 1])


def verdict(x: str, y: str, d: list, tie: float) -> str:
  """"x > y" when the mean of d = value(x) - value(y) is at least `tie` and d has that sign on a majority,
  "tie" when |mean| < tie, else "mixed"; "-" without data."""
  if not d:
    return "-"
  mean = float(np.mean(d))
  if abs(mean) < tie:
    return "tie"
  winner, loser, agree = (x, y, sum(v > 0 for v in d)) if mean > 0 else (y, x, sum(v < 0 for v in d))
  return f"{winner} > {loser}" if 2 * agree > len(d) else "mixed"


def pair_rows(runs: dict, bases: dict, ovs: dict) -> list:
  """One dict per finished (arm, seed): accuracies, room, gain, recovery and the overlaps."""
  rows = []
  for arm, by_seed in runs.items():
    spec = ARMS[arm]
    for seed, run in by_seed.items():
      if not run["done"] or not (ovs.get((arm, seed)) or {}).get("initial"):
        continue
      b = bases[seed]
      acc0, acc_t, acc1 = b[f"s{spec['student']}"], b[spec["teacher"]], run["values"]["eval/accuracy"][-1]
      room = acc_t - acc0
      final = ovs[(arm, seed)]["final"] or {}
      rows.append({"arm": arm, "seed": seed, "student": spec["student"], "teacher": spec["teacher"],
                   "acc_t": acc_t, "acc0": acc0, "acc1": acc1, "room": room, "gain": acc1 - acc0,
                   "recovery": (acc1 - acc0) / room if room >= MIN_ROOM else np.nan,
                   **ovs[(arm, seed)]["initial"], **{f"final {k}": v for k, v in final.items()}})
  return rows


def paired(rows: list, a: str, b: str, key: str, student=None) -> list:
  """value(a) - value(b) of `key` per (student, seed) where both teachers' pairs have a finite value."""
  by = {(r["student"], r["seed"], r["teacher"]): r[key] for r in rows if np.isfinite(r[key])}
  return [by[(s, seed, a)] - by[(s, seed, b)] for (s, seed, t) in sorted(by) if t == a and (s, seed, b) in by
          and (student is None or s == student)]


def h1_verdict(r_p: float, r_a: float, r_pa: float, n: int, spread_: float, sign: int = 1) -> str:
  """H1's pre-registered rule on rho(recovery, predictor) r_p, rho(recovery, teacher accuracy) r_a and
  rho(predictor, teacher accuracy) r_pa over n eligible triples whose predictor spans `spread_`."""
  if n < 10:
    return "not tested (n < 10)"
  if spread_ < MIN_RANGE:
    return f"not tested (the triples' predictor spans {spread_:.3f} < {MIN_RANGE})"
  if abs(r_pa) >= 0.9:
    return "inconclusive (predictor and teacher accuracy rank the pairs alike)"
  if sign * r_p - r_a >= TIE_RHO and sign * r_p > 0:
    return "supported: the predictor does better"
  if r_a - sign * r_p >= TIE_RHO:
    return "contradicted: teacher accuracy does better"
  return f"no difference (< {TIE_RHO})"


def tests(rows: list) -> None:
  """The pre-registered tests (README, "Hypotheses"), in order."""
  ok = [r for r in rows if np.isfinite(r["recovery"])]
  print(f"\n## H1: does the initial overlap predict gap recovery better than teacher accuracy?\n\nEligible "
        f"(student, teacher, seed) triples (room >= {MIN_ROOM:.2f}): n = {len(ok)} of {len(rows)}.\n")
  print("| predictor | range | rho(recovery, predictor) | rho(recovery, teacher acc) | rho(predictor, teacher acc) | "
        "rho(gain, predictor) | rho(gain, teacher acc) | verdict |\n|---|---|---|---|---|---|---|---|")
  rec, gain, acc = [r["recovery"] for r in ok], [r["gain"] for r in ok], [r["acc_t"] for r in ok]
  for pred in (PRIMARY, "overlap@1", "hit@5", "hit@1", "reverse_kl"):
    x = [r[pred] for r in ok]
    sign = -1 if pred == "reverse_kl" else 1           # a smaller KL is the higher compatibility
    width = float(np.ptp(x)) if x else 0.0
    r_p, r_a, r_pa = spearman(rec, x), spearman(rec, acc), spearman(x, acc)
    v = h1_verdict(r_p, r_a, r_pa, len(ok), width if pred != "reverse_kl" else np.inf, sign)
    print(f"| {pred}{' (primary)' if pred == PRIMARY else ''} | {width:.3f} | {r_p:+.2f} | {r_a:+.2f} | {r_pa:+.2f} | "
          f"{spearman(gain, x):+.2f} | {spearman(gain, acc):+.2f} | {v} |")
  seeds = sorted({r["seed"] for r in ok})
  mine = {s: [r for r in ok if r["seed"] == s and r["student"] == 128] for s in seeds}
  within = [spearman([r["recovery"] for r in m], [r[PRIMARY] for r in m]) for m in mine.values()]
  within_acc = [spearman([r["recovery"] for r in m], [r["acc_t"] for r in m]) for m in mine.values()]
  print(f"\nWithin seed, student s128 ({len(S128)} teachers each; secondary): mean rho(recovery, {PRIMARY}) = "
        f"{np.nanmean(within or [np.nan]):+.2f}, mean rho(recovery, teacher acc) = "
        f"{np.nanmean(within_acc or [np.nan]):+.2f} over {int(np.sum(np.isfinite(within)))} seeds")
  top = []
  for seed in sorted({r["seed"] for r in rows}):
    grid = {r["teacher"]: r[PRIMARY] for r in rows if r["seed"] == seed and r["student"] == 128}
    if len(grid) == len(S128):
      top.append(max(grid, key=grid.get) == "tself")
  print(f"\nM1 (the measure's check): tself has the highest initial {PRIMARY} of s128's teachers on {sum(top)} of "
        f"{len(top)} seeds (expected: at least 2 of 3)")
  print("\n## H2-H3 and student size: paired within (student, seed)\n\n| comparison | measure | per (student, seed) "
        "| mean | verdict |\n|---|---|---|---|---|")
  for a, b, student in (("t192rl", "tbase_sft", None), ("t192rl", "t192sft", 128), ("tbase_rl", "tbase_sft", 128)):
    for key, tie, scale in (("recovery", TIE_R, 1), ("gain", TIE_GAIN, 100)):
      d = paired(rows, a, b, key, student)
      cells = ", ".join(f"{scale * v:+.2f}" for v in d) or "-"
      print(f"| {a} - {b}{'' if student is None else f' (s{student})'} | {key}{' (points)' if scale > 1 else ''} "
            f"| {cells} | {scale * np.mean(d) if d else np.nan:+.2f} | {verdict(a, b, d, tie)} |")
  for teacher in ("tbase_sft", "t192rl"):
    by = {(r["student"], r["seed"]): r for r in rows if r["teacher"] == teacher}
    for key, tie, scale in (("recovery", TIE_R, 1), ("gain", TIE_GAIN, 100)):
      d = [by[(128, s)][key] - by[(96, s)][key] for (st, s) in sorted(by) if st == 128 and (96, s) in by
           and np.isfinite(by[(128, s)][key]) and np.isfinite(by[(96, s)][key])]
      print(f"| s128 - s96 from {teacher} | {key}{' (points)' if scale > 1 else ''} | "
            f"{', '.join(f'{scale * v:+.2f}' for v in d) or '-'} | {scale * np.mean(d) if d else np.nan:+.2f} | "
            f"{verdict('s128', 's96', d, tie)} |")
  print("\n## H4: is the most accurate teacher always the best one to distil from? (student s128)\n")
  beaten = []
  for seed in sorted({r["seed"] for r in rows}):
    grid = [r for r in rows if r["seed"] == seed and r["student"] == 128]
    if len(grid) < len(S128):
      continue
    best = max(grid, key=lambda r: r["acc_t"])
    best_other = max((r for r in grid if r is not best), key=lambda r: r["acc1"])
    beaten.append(best_other["acc1"] >= best["acc1"] + TIE_GAIN)
    print(f"- seed {seed}: most accurate teacher {best['teacher']} ({best['acc_t']:.3f}) -> student "
          f"{best['acc1']:.3f}; best other {best_other['teacher']} ({best_other['acc_t']:.3f}) -> "
          f"{best_other['acc1']:.3f}")
  if beaten:
    v = ("supported (scores are not sufficient)" if 2 * sum(beaten) > len(beaten) else
         "contradicted (the most accurate teacher was never beaten)" if not any(beaten) else "mixed")
    print(f"\nA less accurate teacher gave a student at least {100 * TIE_GAIN:.0f} points better on "
          f"{sum(beaten)} of {len(beaten)} seeds: {v}")
  signed = [r for r in rows if abs(r["room"]) >= SIGN_ROOM]
  agree = [np.sign(r["gain"]) == np.sign(r["room"]) for r in signed]
  print(f"\n## H5: sign(gain) = sign(room) where |room| >= {SIGN_ROOM}: {sum(agree)} of {len(agree)} triples "
        f"(predicted: at least 80%); teacher below its student: "
        f"{[(r['arm'], r['seed'], round(100 * r['gain'], 1)) for r in signed if r['room'] < 0] or 'none'}")
  moved = [r for r in rows if np.isfinite(r.get(f"final {PRIMARY}", np.nan))]
  up = [r for r in moved if r["gain"] > TIE_GAIN]
  rose = sum(r[f"final {PRIMARY}"] > r[PRIMARY] for r in up)
  rho = spearman([r[f"final {PRIMARY}"] - r[PRIMARY] for r in moved], [r["gain"] for r in moved])
  print(f"\n## H6: {PRIMARY} rose in {rose} of the {len(up)} triples that gained > {100 * TIE_GAIN:.0f} points; "
        f"rho(change of {PRIMARY}, gain) = {rho:+.2f} over {len(moved)} triples")


def scatter(rows: list, out: str) -> None:
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  ok = [r for r in rows if np.isfinite(r["recovery"])]
  fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
  for ax, key, label in ((axes[0], PRIMARY, f"initial {PRIMARY}"), (axes[1], "acc_t", "teacher accuracy")):
    for student, marker in zip(STUDENT_WIDTHS, "os"):
      for i, teacher in enumerate(TEACHERS):
        pts = [(r[key], r["recovery"]) for r in ok if r["student"] == student and r["teacher"] == teacher]
        if pts:
          ax.scatter(*zip(*pts), marker=marker, color=f"C{i}", label=f"s{student} from {teacher}")
    ax.set(xlabel=label, title=f"gap recovery vs {label}")
    ax.grid(alpha=0.3)
  axes[0].set_ylabel("gap recovery")
  axes[0].legend(fontsize=7)
  save_figure(fig, out)


def main(argv=None) -> None:
  args, seeds = parse_summary_args(__doc__, "experiments/opd_scale/runs", argv, one_plot=False)
  bases = {s: base_accuracy(args.root, s) for s in seeds}
  names = ["base"] + list(TEACHERS) + [f"s{w}" for w in STUDENT_WIDTHS]      # base: before its fine-tuning
  print("Base models (greedy held-out accuracy):\n\n| seed | " + " | ".join(names) + " |\n|---|" + "---|" * len(names))
  for s, b in bases.items():
    print(f"| {s} | " + " | ".join(f"{b[n]:.3f}" for n in names) + " |")
  walls = command_walls(args.root)
  print(f"\nCommand walls: {sum(walls.values()) / 60:.1f} minutes over {len(walls)} workdirs (ROOT/runs.jsonl)\n")
  runs = summarize(args.root, ARMS, seeds, METRICS, summary_path(args.out, args.root, "curves.png"), "opd_scale",
                   base="", load=load_from_start)      # step 0: the arm's own student
  rows = pair_rows(runs, bases, read_overlaps(args.root))
  cols = ("acc_t", "acc0", "room", "acc1", "gain", "recovery", "overlap@1", "overlap@5", "hit@1", "hit@5",
          "reverse_kl", f"final {PRIMARY}")
  print("\nPer pair (mean and min-max over seeds; recovery over the seeds with room >= "
        f"{MIN_ROOM:.2f}):\n\n| pair | seeds | " + " | ".join(cols) + " |\n|---|---|" + "---|" * len(cols))
  for arm in ARMS:
    mine = [r for r in rows if r["arm"] == arm]
    if mine:
      cells = [spread([r[c] for r in mine if np.isfinite(r.get(c, np.nan))] or [np.nan]) for c in cols]
      print(f"| {arm} | {','.join(str(r['seed']) for r in mine)} | " + " | ".join(cells) + " |")
  tests(rows)
  if rows:
    scatter(rows, summary_path(args.out, args.root, "recovery.png"))


if __name__ == "__main__":
  main()
