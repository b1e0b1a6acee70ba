"""results.md of experiments/mimo_graders (README.md is the pre-registration: arms, gate, hypotheses and rules).

  python experiments/mimo_graders/summarize.py --root=experiments/mimo_graders/runs [--out=DIR]

Reads ROOT/<arm>_s<seed>/metrics.jsonl and ROOT/gate.json; every number and verdict is computed here by README's
rules.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs.mimo_graders import ARMS, WINDOW  # noqa: E402
from experiments.driver import arm_rows, changes_lines, load_runs, write_results  # noqa: E402
from experiments.gate import parse_summary_args, results_head  # noqa: E402

KEEP = 0.05               # H1: the pass rate the graders may lose
QUALITY_GAIN = 0.05       # H2
LENGTH_RATIO = 0.9        # H3
HACK_MAX = 0.02           # H5


def load(path: str) -> dict:
  from rlkit.train.metrics import read_metrics
  from rlkit.train.stages import AT_STAGE_START
  rows = read_metrics(os.path.join(path, "metrics.jsonl"))
  train = [r for r in rows if "step_s" in r]
  evals = [r for r in rows if "eval/accuracy" in r]
  last = train[-WINDOW:]

  def mean(key, rs):
    values = [r[key] for r in rs if key in r and r[key] == r[key]]
    return float(np.mean(values)) if values else math.nan
  return {"start": next((r["eval/accuracy"] for r in evals if r.get(AT_STAGE_START)), math.nan),
          "end": evals[-1]["eval/accuracy"] if evals and not evals[-1].get(AT_STAGE_START) else math.nan,
          "pass": mean("reward/all_pass", last), "quality": mean("reward/quality", last),
          "len_correct": mean("response_len_correct", last), "len": mean("response_len", last),
          "audit": mean("reward/audit_reset", train), "steps": len(train)}


def _seed_mean(runs, arm, key, seeds):
  values = [runs[arm][s][key] for s in seeds if s in runs.get(arm, {})]
  return float(np.mean(values)) if values else math.nan


def verdicts(runs: dict, seeds) -> dict:
  def m(arm, key):
    return _seed_mean(runs, arm, key, seeds)

  out = {}
  base = m("pass_fail", "end")
  kept = {arm: m(arm, "end") - base for arm in ("grs", "gar", "gar_len")}
  out["H1"] = _verdict(all(v >= -KEEP for v in kept.values()) if all(map(math.isfinite, kept.values())) else None,
                       "end pass rate minus pass_fail's: " + ", ".join(f"{a} {v:+.3f}" for a, v in kept.items()))
  gain = m("gar", "quality") - m("pass_fail", "quality")
  paired = [s for s in seeds if s in runs.get("gar", {}) and s in runs.get("pass_fail", {})]
  every = bool(paired) and all(runs["gar"][s]["quality"] > runs["pass_fail"][s]["quality"] for s in paired)
  out["H2"] = _verdict(gain >= QUALITY_GAIN and every if math.isfinite(gain) else None,
                       f"gar - pass_fail solution score {gain:+.3f}; gar higher in every seed: {every}")
  ratio = m("gar_len", "len_correct") / m("pass_fail", "len_correct")
  out["H3"] = _verdict(ratio <= LENGTH_RATIO if math.isfinite(ratio) else None,
                       f"gar_len / pass_fail length of correct samples {ratio:.3f}")
  diff = m("gar", "quality") - m("grs", "quality")
  out["H4"] = _verdict(diff >= 0 if math.isfinite(diff) else None, f"gar - grs solution score {diff:+.3f}")
  audits = {arm: m(arm, "audit") for arm in ARMS}
  out["H5"] = _verdict(all(v <= HACK_MAX for v in audits.values()) if all(map(math.isfinite, audits.values()))
                       else None, "audit resets: " + ", ".join(f"{a} {v:.4f}" for a, v in audits.items()))
  return out


def _verdict(ok, detail: str) -> str:
  return f"{'not measured' if ok is None else 'supported' if ok else 'not supported'}: {detail}"


def render(root: str, seeds) -> str:
  runs = load_runs(root, ARMS, seeds, load)
  text = results_head("mimo_graders", root)
  text += [f"- **{h}**: {v}" for h, v in verdicts(runs, seeds).items()]
  text += ["", f"## Arms (seed mean, min-max; training-side columns: the last {WINDOW} iterations)", "",
           "| arm | seeds | held-out pass, start | held-out pass, end | sampled pass | solution score | "
           "length (correct) | audit resets |", "|---|---|---|---|---|---|---|---|"]
  text += arm_rows(runs, ARMS, [(k, "{:.3f}") for k in ("start", "end", "pass", "quality")]
                   + [("len_correct", "{:.1f}"), ("audit", "{:.3f}")])
  text += changes_lines(root)
  return "\n".join(text) + "\n"


def main(argv=None):
  args, seeds = parse_summary_args(__doc__, "experiments/mimo_graders/runs", argv, one_plot=False)
  write_results(args.out, args.root, render(args.root, seeds))


if __name__ == "__main__":
  main()
