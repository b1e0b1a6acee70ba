"""results.md of experiments/moe_replay (README.md is the pre-registration: arms, gate, hypotheses and rules).

  python experiments/moe_replay/summarize.py --root=experiments/moe_replay/runs [--out=DIR]

Reads ROOT/<arm>_s<seed>/metrics.jsonl and ROOT/gate.json; every number and verdict is computed here by README's
rules.
"""
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs.moe_replay import ARMS  # noqa: E402
from experiments.driver import arm_rows, changes_lines, load_runs, write_results  # noqa: E402
from experiments.gate import parse_summary_args, results_head  # noqa: E402

EDGE = 10                  # first/last iterations (H3, H4)
REWARD_WINDOW = 20         # H4's last-20 reward
GAP_RATIO = 0.5            # H1


def load(path: str) -> dict:
  from rlkit.train.metrics import read_metrics
  from rlkit.train.stages import AT_STAGE_START
  rows = read_metrics(os.path.join(path, "metrics.jsonl"))
  train = [r for r in rows if "step_s" in r]
  evals = [r for r in rows if "eval/accuracy" in r and not r.get(AT_STAGE_START)]

  def mean(key, rs):
    values = [r[key] for r in rs if key in r and r[key] == r[key]]
    return float(np.mean(values)) if values else math.nan
  first, last = train[:EDGE], train[-EDGE:]
  return {"dlogp": mean("mismatch/mean", train), "flip": mean("moe/flip_rate", train),
          "flip_trend": mean("moe/flip_rate", last) - mean("moe/flip_rate", first),
          "cv_change": abs(mean("moe/load_cv", last) - mean("moe/load_cv", first)),
          "cold": mean("moe/cold_fraction", last), "reward": mean("reward", train[-REWARD_WINDOW:]),
          "final": evals[-1]["eval/accuracy"] if evals else math.nan, "steps": len(train)}


def _verdict(ok, detail: str) -> str:
  return f"{'not measured' if ok is None else 'supported' if ok else 'not supported'}: {detail}"


def _per_seed(runs: dict, seeds, a: str, b: str, key: str, rule) -> tuple:
  """(rule held in every seed both arms ran, or None without any; "s<seed> <a value> vs <b value>" text)."""
  paired = [s for s in seeds if s in runs.get(a, {}) and s in runs.get(b, {})]
  pairs = {s: (runs[a][s][key], runs[b][s][key]) for s in paired}
  ok = all(rule(x, y) for x, y in pairs.values()) if pairs else None
  return ok, ", ".join(f"s{s} {x:.4f} vs {y:.4f}" for s, (x, y) in pairs.items())


def verdicts(runs: dict, seeds) -> dict:
  out = {}
  ok, detail = _per_seed(runs, seeds, "replay", "no_replay", "dlogp", lambda x, y: x <= GAP_RATIO * y)
  out["H1"] = _verdict(ok, f"|dlogp| replay vs no_replay {detail} (at most {GAP_RATIO}x)")
  ok, detail = _per_seed(runs, seeds, "replay_weights", "replay", "dlogp", lambda x, y: x <= y)
  out["H2"] = _verdict(ok, f"|dlogp| replay_weights vs replay {detail}")
  ok, detail = _per_seed(runs, seeds, "replay_frozen", "replay", "cv_change", lambda x, y: x < y)
  out["H3"] = _verdict(ok, f"|load CV change| replay_frozen vs replay {detail}")
  nr = runs.get("no_replay", {})
  flips = ", ".join(f"s{s} {r['flip']:.4f} ({r['flip_trend']:+.4f})" for s, r in nr.items()) or "no run"
  out["H4"] = f"descriptive: no_replay flip rate over training (last 10 - first 10): {flips}"
  return out


def render(root: str, seeds) -> str:
  runs = load_runs(root, ARMS, seeds, load)
  text = results_head("moe_replay", root)
  text += [f"- **{h}**: {v}" for h, v in verdicts(runs, seeds).items()]
  text += ["", f"## Arms (seed mean, min-max; |dlogp| and flip rate over training, cold experts the last {EDGE}, "
           f"reward the last {REWARD_WINDOW} iterations)", "",
           "| arm | seeds | mean dlogp | flip rate | load CV change | cold experts | reward | final accuracy |",
           "|---|---|---|---|---|---|---|---|"]
  text += arm_rows(runs, ARMS, [(k, "{:.4f}") for k in ("dlogp", "flip", "cv_change", "cold")]
                   + [("reward", "{:.3f}"), ("final", "{:.3f}")])
  text += changes_lines(root)
  return "\n".join(text) + "\n"


def main(argv=None):
  args, seeds = parse_summary_args(__doc__, "experiments/moe_replay/runs", argv, one_plot=False)
  write_results(args.out, args.root, render(args.root, seeds))


if __name__ == "__main__":
  main()
