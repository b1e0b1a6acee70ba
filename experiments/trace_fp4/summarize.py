"""results.md of experiments/trace_fp4 (README.md is the pre-registration: arms, gate, hypotheses and rules).

  python experiments/trace_fp4/summarize.py --root=experiments/trace_fp4/runs [--out=DIR]

Reads ROOT/<arm>_s<seed>/metrics.jsonl and ROOT/gate.json; every number and verdict is computed here by README's
rules.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs.trace_fp4 import ARMS  # noqa: E402
from experiments.driver import arm_rows, changes_lines, load_runs, write_results  # noqa: E402
from experiments.gate import parse_summary_args, results_head  # noqa: E402

WINDOW = 20                # H3: the last iterations' mean reward
MISMATCH_RATIO = 0.05      # H1
LOGP_RATIO = 0.25          # H2
SPREAD_SLACK = 0.03        # H3


def load(path: str) -> dict:
  from rlkit.train.metrics import read_metrics
  from rlkit.train.stages import AT_STAGE_START
  rows = read_metrics(os.path.join(path, "metrics.jsonl"))
  train = [r for r in rows if "step_s" in r]
  evals = [r for r in rows if "eval/accuracy" in r and not r.get(AT_STAGE_START)]

  def mean(key, rs):
    values = [r[key] for r in rs if key in r and r[key] == r[key]]
    return float(np.mean(values)) if values else math.nan
  return {"mismatch": mean("moe/codeword_mismatch", train), "dlogp": mean("mismatch/mean", train),
          "reward": mean("reward", train[-WINDOW:]), "final": evals[-1]["eval/accuracy"] if evals else math.nan,
          "flip": mean("moe/flip_rate", train), "steps": len(train)}


def _verdict(ok, detail: str) -> str:
  return f"{'not measured' if ok is None else 'supported' if ok else 'not supported'}: {detail}"


def verdicts(runs: dict, seeds) -> dict:
  trace, rtn, bf16 = (runs.get(arm, {}) for arm in ("fp4_trace", "fp4_rtn", "bf16"))
  paired = [s for s in seeds if s in trace and s in rtn]
  out = {}
  for h, key, ratio in (("H1", "mismatch", MISMATCH_RATIO), ("H2", "dlogp", LOGP_RATIO)):
    r = {s: trace[s][key] / rtn[s][key] for s in paired if rtn[s][key] > 0}
    ok = all(v <= ratio for v in r.values()) if paired and len(r) == len(paired) else None
    out[h] = _verdict(ok, f"fp4_trace / fp4_rtn {key} " + ", ".join(f"s{s} {v:.4f}" for s, v in r.items())
                      + f" (at most {ratio})")
  checks = []
  for key, label in (("reward", f"last-{WINDOW} reward"), ("final", "final accuracy")):
    ref = [r[key] for r in bf16.values()]
    if ref and trace:
      low, high = min(ref) - SPREAD_SLACK, max(ref) + SPREAD_SLACK
      values = {s: trace[s][key] for s in trace}
      checks.append((all(low <= v <= high for v in values.values()),
                     f"{label} " + ", ".join(f"s{s} {v:.3f}" for s, v in values.items()) + f" in [{low:.3f}, {high:.3f}]"))
  out["H3"] = _verdict(all(ok for ok, _ in checks) if len(checks) == 2 else None,
                       "; ".join(d for _, d in checks) or "no bf16 or fp4_trace runs")
  diffs = []
  for key in ("reward", "final"):
    a = [rtn[s][key] for s in rtn]
    b = [r[key] for r in bf16.values()]
    diffs.append(f"{key} {np.mean(a) - np.mean(b):+.3f}" if a and b else f"{key} n/a")
  out["H4"] = "descriptive: fp4_rtn - bf16 seed means: " + ", ".join(diffs)
  return out


def render(root: str, seeds) -> str:
  runs = load_runs(root, ARMS, seeds, load)
  text = results_head("trace_fp4", root)
  text += [f"- **{h}**: {v}" for h, v in verdicts(runs, seeds).items()]
  text += ["", "## Arms (seed mean, min-max; mismatch and |dlogp|: over training; reward: the last "
           f"{WINDOW} iterations)", "",
           "| arm | seeds | codeword mismatch | mean dlogp | reward | final accuracy | flip rate |",
           "|---|---|---|---|---|---|---|"]
  text += arm_rows(runs, ARMS, [("mismatch", "{:.4f}"), ("dlogp", "{:.4f}"), ("reward", "{:.3f}"),
                                ("final", "{:.3f}"), ("flip", "{:.4f}")])
  text += changes_lines(root)
  return "\n".join(text) + "\n"


def main(argv=None):
  args, seeds = parse_summary_args(__doc__, "experiments/trace_fp4/runs", argv, one_plot=False)
  write_results(args.out, args.root, render(args.root, seeds))


if __name__ == "__main__":
  main()
