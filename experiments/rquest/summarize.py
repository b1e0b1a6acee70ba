"""Summarise experiments/rquest: the gate, the tables and verdicts (markdown, printed) and a PNG of the curves.

  python experiments/rquest/summarize.py --root=experiments/rquest/runs [--seeds=0,1,2] [--out=DIR|FILE.png]

Reads the archive (or a driver's root): gate.json and every DIR/<arm>_s<seed>. The solver's held-out accuracy is
its evaluation (the first, at the stage's start, is the base's); the question metrics (rlkit/train/rquest_stage.py
`question_metrics`) are training metrics, shown at each evaluation step as their mean over the iterations since
the previous one (`rquest/unique`: its value at that step). Then the pre-registered verdicts (README), per seed
where they are paired. The plot goes to DIR/curves.png, or where --out says.
"""
import os
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(os.path.dirname(HERE)))
from configs.rquest import ARMS  # noqa: E402
from experiments.arm_tables import load_with_training, summarize  # noqa: E402
from experiments.driver import last_eval, spread, summary_path  # noqa: E402
from experiments.gate import parse_summary_args  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

METRICS = {"held-out accuracy": "eval/accuracy", "invalid": "rquest/invalid", "duplicate": "rquest/duplicate",
           "hidden duplicate": "rquest/hidden_duplicate", "unique fingerprints": "rquest/unique",
           "label correct": "rquest/label_correct", "solver rows": "rquest/solver_rows"}
LAST = ("rquest/unique",)           # a running count: its value at the step, not a window mean
GAIN_MIN = 0.02                     # an accuracy difference the verdicts count (README)
EPS = 1e-9                          # bounds are inclusive: accuracies are k/500, so a difference of exactly 0.02
                                    # must not fail on float rounding (0.608 - 0.628 = -0.02000000000000001)
# (verdict, arm a, arm b): "a ends above b", paired by seed (README "Predictions").
ABOVE = (("R1a: checker labels beat majority labels (rquest proposer)", "rquest_checker", "rquest"),
         ("R1b: checker labels beat majority labels (rzero proposer)", "rzero_checker", "rzero"),
         ("R3: the rquest proposer beats rzero under checker labels", "rquest_checker", "rzero_checker"),
         ("R5: the rquest proposer beats rzero under majority labels", "rquest", "rzero"))


def load(path: str, keys) -> dict:
  return load_with_training(path, keys, last=LAST)


def base_accuracy(root: str, arms, seeds) -> dict:
  """{seed: the base solver's held-out accuracy}: an arm's evaluation at its start (every arm of a seed starts
  from the same base on the same held-out questions)."""
  out = {}
  for seed in seeds:
    for arm in arms:
      rows = read_metrics(os.path.join(root, f"{arm}_s{seed}", "metrics.jsonl"))
      start = next((r for r in rows if r.get("at_stage_start")), None)
      if start is not None:
        out[seed] = start["eval/accuracy"]
        break
  return out


def paired_verdict(d: dict, threshold: float = GAIN_MIN) -> str:
  """Supported: ahead in every seed and by >= threshold on the mean; not supported: mean <= 0; else
  inconclusive."""
  if not d:
    return "not measured"
  mean = np.mean(list(d.values()))
  if all(v > 0 for v in d.values()) and mean >= threshold - EPS:
    return "supported"
  return "not supported" if mean <= 0 else "inconclusive"


def verdicts(runs: dict, base: dict) -> None:
  acc = {arm: {s: r["values"]["eval/accuracy"][-1] for s, r in by.items() if r["steps"]} for arm, by in runs.items()}
  invalid = {arm: {s: r["values"]["rquest/invalid"][-1] for s, r in by.items() if r["steps"]}
             for arm, by in runs.items()}
  fmt = lambda d: ", ".join(f"s{s} {v:+.3f}" for s, v in d.items()) or "-"   # noqa: E731
  print("\nVerdicts (README; final held-out accuracy, paired by seed)\n\n| prediction | difference per seed | verdict |"
        "\n|---|---|---|")
  for name, a, b in ABOVE:
    d = {s: acc[a][s] - acc[b][s] for s in sorted(set(acc.get(a, {})) & set(acc.get(b, {})))}
    print(f"| {name} | {fmt(d)} | {paired_verdict(d)} |")
  for arm, below in (("rquest", True), ("rzero", True), ("rquest_checker", False), ("rzero_checker", False)):
    d = {s: v - base[s] for s, v in acc.get(arm, {}).items() if s in base}
    if not d:
      continue
    mean = np.mean(list(d.values()))
    holds = all(v < 0 for v in d.values()) if below else mean >= -GAIN_MIN - EPS
    claim = "ends below the base in every seed" if below else f"ends no more than {GAIN_MIN} below the base (mean)"
    print(f"| R2: {arm} {claim} | {fmt(d)} | {'supported' if holds else 'not supported'} |")
  d = {s: invalid["rzero"][s] - invalid["rquest"][s] for s in sorted(set(invalid.get("rquest", {}))
                                                                      & set(invalid.get("rzero", {})))}
  print(f"| R4: rquest's invalid share below rzero's in every seed (last window) | {fmt(d)} | "
        f"{'not measured' if not d else 'supported' if all(v > 0 for v in d.values()) else 'not supported'} |")


def main(argv=None) -> None:
  args, seeds = parse_summary_args(__doc__, "experiments/rquest/runs", argv)
  base = base_accuracy(args.root, ARMS, seeds)
  if base:
    print(f"The base solver's held-out accuracy (seeds {','.join(map(str, base))}): {spread(list(base.values()))}\n")
  sft = {s: e["eval/accuracy"] for s in seeds if (e := last_eval(os.path.join(args.root, f"proposer_sft_s{s}")))}
  if sft:
    print(f"The SFT proposer's valid share, greedy on held-out bindings (seeds {','.join(map(str, sft))}): "
          f"{spread(list(sft.values()))}\n")
  runs = summarize(args.root, ARMS, seeds, METRICS, summary_path(args.out, args.root, "curves.png"), "rquest",
                   base="", load=load)
  verdicts(runs, base)


if __name__ == "__main__":
  main()
