"""The SFT probe run after graft's rerun gate failed, looking for a design to pre-register (none was found:
results.md): which pairs of skills are of matched difficulty for the base? Each preset is one SFT run of
configs/graft.py's SFT recipe (lr 3e-4; 150 steps x 64, or 300 for the `_300` presets) on a two-skill mixture,
evaluated on a balanced set of the candidate skills (`eval/mixed/accuracy/<skill>`).

  python launch.py --config=experiments/graft/probe.py:sub97_add03 --workdir=/tmp/graft_probe/sub97_add03
  python experiments/graft/probe.py --root=experiments/graft/probe_runs     # the table (summarize.py prints it too)

Skills (mixture names, so eval.by_category reports them by name): `add` 4-digit a+b, `sub` 4-digit a-b, `mul`
2-digit x 2-digit a*b, `chain` three 3-digit operands joined by + or -. A preset `<own><pct>_<weak><pct>` trains
on those shares.
"""
import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from configs import graft  # noqa: E402
from rlkit.train.metrics import read_metrics  # noqa: E402

ARCHIVE = "experiments/graft/probe_runs"
KEYS = ("stage", "step", "eval/mixed/")     # what table() reads of a workdir (experiments/archive.py keys)

# name -> (operators, digits of each operand, operands)
SKILLS = {"add": ("+", 4, 2), "sub": ("-", 4, 2), "mul": ("*", 2, 2), "chain": ("+-", 3, 3)}
# Round 1 at configs/graft.py's 150 SFT steps; round 2 (`_300`) at 300 steps (each example still seen once).
PRESETS = {"sub97_add03": {"sub": 0.97, "add": 0.03}, "add97_sub03": {"add": 0.97, "sub": 0.03},
           "mul90_sub10": {"mul": 0.9, "sub": 0.1}, "sub90_mul10": {"sub": 0.9, "mul": 0.1},
           "mul99_sub01_300": {"mul": 0.99, "sub": 0.01}, "mul97_sub03_300": {"mul": 0.97, "sub": 0.03},
           "sub97_mul03_300": {"sub": 0.97, "mul": 0.03},
           # Round 3: a second slow skill, three 3-digit operands joined by + or -.
           "mul97_chain03_300": {"mul": 0.97, "chain": 0.03}, "chain97_mul03_300": {"chain": 0.97, "mul": 0.03}}


def skills(shares: dict) -> dict:
  return {name: {"task": "arithmetic", "weight": share,
                 "kwargs": {"ops": SKILLS[name][0], "min_digits": SKILLS[name][1], "max_digits": SKILLS[name][1],
                            "num_operands": SKILLS[name][2]}}
          for name, share in shares.items()}


def get_config(arg=None):
  if arg not in PRESETS:
    raise ValueError(f"Unknown preset {arg!r} for the graft probe; choose one of {', '.join(PRESETS)}.")
  c = graft.get_config("sft_add_o10")
  c.task.kwargs.skills = skills(PRESETS[arg])
  evaluated = [name for name in SKILLS if name != "chain" or "chain" in arg]   # rounds 1-2 had no `chain`
  c.eval.extra_sets = {"mixed": {"skills": skills({name: 1 / len(evaluated) for name in evaluated})}}
  c.eval.num_examples = c.eval.batch_size = 200 * len(evaluated)     # 200 per skill on the balanced set
  if "chain" in arg:
    c.data.max_prompt_len = 14       # BOS + "999+999-999=" and slack
  if arg.endswith("_300"):
    c.sft.steps = 300
    c.data.num_train = 6_000         # 2-digit products have 8,100 prompts: ~3 passes over 6,000 examples
  return c


def table(root: str) -> list:
  """Markdown lines: per probe run found under ROOT, its training shares and SFT steps, and each evaluated skill's
  greedy accuracy on the balanced set at the start (the base) and at the end."""
  lines = ["| probe | trained on | SFT steps | " + " | ".join(f"{s}: base -> SFT" for s in SKILLS) + " |",
           "|---|---|---|" + "---|" * len(SKILLS)]
  for name in PRESETS:
    evals = [r for r in read_metrics(os.path.join(root, name, "metrics.jsonl"))
             if any(k.startswith("eval/mixed/accuracy/") for k in r)]
    if not evals:
      continue
    start, end = evals[0], evals[-1]
    cell = lambda s: (f"{start[f'eval/mixed/accuracy/{s}']:.3f} -> {end[f'eval/mixed/accuracy/{s}']:.3f}"  # noqa: E731
                      if f"eval/mixed/accuracy/{s}" in end else "-")
    shares = ", ".join(f"{share:g} {skill}" for skill, share in PRESETS[name].items())
    lines.append(f"| {name} | {shares} | {end['step']} | " + " | ".join(cell(s) for s in SKILLS) + " |")
  return lines


if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--root", default=ARCHIVE)
  print("\n".join(table(parser.parse_args().root)))
