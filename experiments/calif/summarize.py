"""Summarise experiments/calif: the calibration gate, the tables, every pre-registered verdict per seed (markdown,
printed) and a PNG of the curves.

  python experiments/calif/summarize.py --root=experiments/calif/runs [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads the archive (run.py; experiments/archive.py) or a driver's own root: DIR/gate.json, DIR/sft_s<seed> (the
base policy) and every DIR/<arm>_s<seed> that exists; the metrics are those the README pre-registered
(experiments/arm_tables.py prints and plots them, each curve from its arm's start). Then each arm's final values
per seed and the README's predictions P1-P7 judged in each seed and overall (`PREDICTIONS`). The plot goes to
DIR/curves.png, or where --out says.
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.calif import ARMS  # noqa: E402
from experiments.arm_tables import load_from_start, summarize  # noqa: E402
from experiments.driver import summary_path  # noqa: E402
from experiments.gate import parse_summary_args, read_gate  # noqa: E402
from experiments.verdicts import Prediction, final_table, final_values, mean_of, verdict_table  # noqa: E402

ACC, SAT, BOTH, CONTENT = ("eval/accuracy", "eval/constraint/satisfied", "eval/constraint/both",
                           "eval/constraint/content_len")
METRICS = {"accuracy": ACC, "satisfied": SAT, "both": BOTH, "content length": CONTENT,
           "response length": "eval/response_len"}
KEEP, NEAR, TIE, BAND = 0.03, 0.10, 0.03, 0.20     # the README's rules (fractions; BAND relative)
OLD_ARMS = ("constraints", "calif", "constraints_kl")


def _ratio(v, run) -> float:
  """A run's final content length over the SFT policy's."""
  return v[run][CONTENT] / v["sft"][CONTENT]


def _p4(ratio_calif: float, ratio_constraints: float) -> bool:
  return abs(ratio_calif - 1) <= BAND and ratio_constraints < ratio_calif


def _mean_ratio(values, run) -> float:
  return mean_of(values, run, CONTENT) / mean_of(values, "sft", CONTENT)


PREDICTIONS = [
    Prediction("P1", "constraints: satisfaction up (every seed), accuracy down (on the mean)",
               lambda v: v["constraints"][SAT] > v["sft"][SAT] and v["constraints"][ACC] < v["sft"][ACC],
               lambda vs, h: all(v["constraints"][SAT] > v["sft"][SAT] for v in vs) and
               mean_of(vs, "constraints", ACC) < mean_of(vs, "sft", ACC),
               "satisfaction in every seed, accuracy on the mean"),
    Prediction("P2", "calif keeps accuracy (>= SFT - 3 points) and beats constraints on it",
               lambda v: v["calif"][ACC] >= v["sft"][ACC] - KEEP and v["calif"][ACC] > v["constraints"][ACC],
               lambda vs, h: mean_of(vs, "calif", ACC) >= mean_of(vs, "sft", ACC) - KEEP and
               mean_of(vs, "calif", ACC) > mean_of(vs, "constraints", ACC), "on the mean"),
    Prediction("P3", "calif's satisfaction within 10 points of constraints'",
               lambda v: abs(v["calif"][SAT] - v["constraints"][SAT]) <= NEAR,
               lambda vs, h: abs(mean_of(vs, "calif", SAT) - mean_of(vs, "constraints", SAT)) <= NEAR, "on the mean"),
    Prediction("P4", "calif's content length within 20% of SFT's; constraints' falls further",
               lambda v: _p4(_ratio(v, "calif"), _ratio(v, "constraints")),
               lambda vs, h: _p4(_mean_ratio(vs, "calif"), _mean_ratio(vs, "constraints")), "on the mean"),
    Prediction("P5", "constraints_kl between constraints and calif on accuracy",
               lambda v: v["constraints"][ACC] < v["constraints_kl"][ACC] < v["calif"][ACC],
               lambda vs, h: mean_of(vs, "constraints", ACC) < mean_of(vs, "constraints_kl", ACC) <
               mean_of(vs, "calif", ACC), "on the mean"),
    Prediction("P6", "calif highest on both of constraints, calif, constraints_kl",
               lambda v: all(v["calif"][BOTH] > v[a][BOTH] for a in OLD_ARMS if a != "calif"),
               lambda vs, h: all(mean_of(vs, "calif", BOTH) > mean_of(vs, a, BOTH) for a in OLD_ARMS if a != "calif"),
               "on the mean"),
    Prediction("P7", "multiplying matters: calif >= 3 points above constraints_plus_task on both",
               lambda v: v["calif"][BOTH] - v["constraints_plus_task"][BOTH] >= TIE,
               lambda vs, h: sum(h) >= 2 and mean_of(vs, "calif", BOTH) - mean_of(vs, "constraints_plus_task", BOTH)
               >= TIE, "on the mean and in >= 2 seeds"),
]


def main(argv=None) -> None:
  args, seeds = parse_summary_args(__doc__, "experiments/calif/runs", argv)
  gate = read_gate(args.root)
  for seed, m in sorted(((gate or {}).get("measured") or {}).items()):
    print(f"gate, seed {seed}: " + ", ".join(f"{k} {v:.3f}" for k, v in m.items()))
  print()
  if gate is not None and not gate["passed"]:
    print("no arm ran and no verdicts: the calibration gate failed (README, 'Calibration gate').")
    return
  summarize(args.root, ARMS, seeds, METRICS, summary_path(args.out, args.root, "curves.png"), "calif",
            load=load_from_start)
  by_seed = final_values(args.root, ["sft", *ARMS], seeds)
  for label, key in (("Accuracy", ACC), ("Satisfied", SAT), ("Both", BOTH), ("Content length", CONTENT)):
    print(f"\n{label} at the end, per seed:\n")
    print("\n".join(final_table(by_seed, ["sft", *ARMS], key)))
  print("\nVerdicts (README predictions; per seed and overall):\n")
  print("\n".join(verdict_table(PREDICTIONS, by_seed)))


if __name__ == "__main__":
  main()
