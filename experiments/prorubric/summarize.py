"""Summarise experiments/prorubric: the calibration gate, the tables, every pre-registered verdict per seed
(markdown, printed) and a PNG of the curves.

  python experiments/prorubric/summarize.py --root=experiments/prorubric/runs [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads the archive (run.py; experiments/archive.py) or a driver's own root: DIR/gate.json, DIR/sft_s<seed> (the
base policy) and every DIR/<arm>_s<seed> that exists; the metrics are those the README pre-registered
(experiments/arm_tables.py prints and plots them, each curve from its arm's start). Then each arm's final values
per seed and the README's predictions P1-P7 judged in each seed and overall (`PREDICTIONS`). The plot goes to
DIR/curves.png, or where --out says.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.prorubric import ARMS, RATIOS  # noqa: E402
from experiments.arm_tables import load_from_start, summarize  # noqa: E402
from experiments.driver import summary_path  # noqa: E402
from experiments.gate import parse_summary_args, read_gate  # noqa: E402
from experiments.verdicts import Prediction, at_least, final_table, final_values, mean_of, verdict_table  # noqa: E402

ACC, CLEAN, PADDED, PROXY = "eval/accuracy", "eval/rubric/clean", "eval/rubric/padded", "eval/rubric/additive"
METRICS = {"decision hit rate": ACC, "clean answers": CLEAN, "padded answers": PADDED, "proxy (additive)": PROXY,
           "gated score": "eval/rubric/gated", "released score": "eval/rubric/dimensions",
           "advice items met": "eval/rubric/advice_met", "response length": "eval/response_len"}
TIE, KEEP, GAP = 0.03, 0.02, 0.02       # points (as fractions) of the README's rules


def _gap(v, w) -> float:
  """Gated minus additive decision hit rate at advice points w."""
  return v[f"gated_w{w}"][ACC] - v[f"additive_w{w}"][ACC]


def _mean_gap(values, w) -> float:
  return float(np.mean([_gap(v, w) for v in values]))


def _clean_best(v) -> bool:
  d = v["dimensions_w1.0"][CLEAN]
  return d >= v["sft"][CLEAN] - KEEP and d >= v["gated_w1.0"][CLEAN] and d >= v["additive_w1.0"][CLEAN]


PREDICTIONS = [
    Prediction("P1", "W = 1.0: additive has the higher proxy and the lower decision hit rate than gated",
               lambda v: v["additive_w1.0"][PROXY] > v["gated_w1.0"][PROXY] and
               v["additive_w1.0"][ACC] < v["gated_w1.0"][ACC],
               lambda vs, h: mean_of(vs, "additive_w1.0", PROXY) > mean_of(vs, "gated_w1.0", PROXY) and
               mean_of(vs, "additive_w1.0", ACC) < mean_of(vs, "gated_w1.0", ACC) and sum(h) >= 2,
               "on the mean and in >= 2 seeds"),
    Prediction("P2", "additive_w1.0 ends below the SFT policy's decision hit rate",
               lambda v: v["additive_w1.0"][ACC] < v["sft"][ACC], at_least(2), ">= 2 seeds"),
    Prediction("P3", "gated keeps the decision: at every W, at least the SFT's minus 2 points",
               lambda v: all(v[f"gated_w{w}"][ACC] >= v["sft"][ACC] - KEEP for w in RATIOS), at_least(3),
               "every seed"),
    Prediction("P4", "W = 0.1: additive within 3 points of gated on the decision hit rate",
               lambda v: abs(_gap(v, 0.1)) <= TIE, lambda vs, h: abs(_mean_gap(vs, 0.1)) <= TIE,
               "on the mean"),
    Prediction("P5", "the gap gated - additive grows with W",
               lambda v: _gap(v, RATIOS[0]) < _gap(v, RATIOS[1]) < _gap(v, RATIOS[2]),
               lambda vs, h: _mean_gap(vs, RATIOS[0]) < _mean_gap(vs, RATIOS[1]) < _mean_gap(vs, RATIOS[2]),
               "on the mean"),
    Prediction("P6", "released protocol: the most clean answers at W = 1.0, at least the SFT's minus 2 points",
               _clean_best, lambda vs, h: sum(h) >= 2 and mean_of(vs, "dimensions_w1.0", CLEAN) >= max(
                   mean_of(vs, "gated_w1.0", CLEAN), mean_of(vs, "additive_w1.0", CLEAN)),
               "on the mean and in >= 2 seeds"),
    Prediction("P7", "the failure clause closes padding: gated_w1.0 pads >= 2 points more than the released arm",
               lambda v: v["gated_w1.0"][PADDED] - v["dimensions_w1.0"][PADDED] >= GAP,
               lambda vs, h: sum(h) >= 2 and
               mean_of(vs, "gated_w1.0", PADDED) - mean_of(vs, "dimensions_w1.0", PADDED) >= GAP,
               "on the mean and in >= 2 seeds"),
]


def main(argv=None) -> None:
  args, seeds = parse_summary_args(__doc__, "experiments/prorubric/runs", argv)
  gate = read_gate(args.root)
  for seed, m in sorted(((gate or {}).get("measured") or {}).items()):
    print(f"gate, seed {seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in m.items()))
  if gate is not None and gate.get("temperature") is not None:
    print(f"\nThe arms sampled at temperature {gate['temperature']} (the gate's).")
  print()
  if gate is not None and not gate["passed"]:
    print("no arm ran and no verdicts: the calibration gate failed (README, 'Calibration gate').")
    return
  summarize(args.root, ARMS, seeds, METRICS, summary_path(args.out, args.root, "curves.png"), "prorubric",
            load=load_from_start)
  by_seed = final_values(args.root, ["sft", *ARMS], seeds)
  for label, key in (("Decision hit rate", ACC), ("Clean answers", CLEAN), ("Padded answers", PADDED),
                     ("Proxy (additive)", PROXY)):
    print(f"\n{label} at the end, per seed:\n")
    print("\n".join(final_table(by_seed, ["sft", *ARMS], key)))
  print("\nVerdicts (README predictions; per seed and overall):\n")
  print("\n".join(verdict_table(PREDICTIONS, by_seed)))


if __name__ == "__main__":
  main()
