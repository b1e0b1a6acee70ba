"""results.md of experiments/sandbox_security (README.md is the pre-registration: the attacks, modes and the
decision rules, fixed before any run).

  python experiments/sandbox_security/summarize.py --root=experiments/sandbox_security/runs [--out=DIR]

Reads ROOT/results.jsonl (run.py's lines; the last line of each key wins) and writes results.md (also printed)
into ROOT, or into --out (pass --out=experiments/sandbox_security to refresh the committed one on purpose).
"""
import argparse
import collections
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
from experiments.driver import add_summary_args, write_results  # noqa: E402
from experiments.sandbox_security.run import read_rows  # noqa: E402

MODES = ("bwrap_root", "bwrap_user", "rlimits_root")
NOT_ISOLATED_BY_RLIMITS = {"network_connect", "read_host_paths", "write_host_paths"}
REPS = 3


def load(root: str) -> dict:
  """{key: row}, the last line of each key."""
  return {row["key"]: row for row in read_rows(os.path.join(root, "results.jsonl"))}


def by_mode(rows: dict) -> dict:
  """{mode: {attack: [rows over repetitions]}}."""
  out = collections.defaultdict(lambda: collections.defaultdict(list))
  for row in rows.values():
    if row["type"] == "attack":
      out[row["mode"]][row["attack"]].append(row)
  return out


def verdicts(rows: dict, wall_s: float) -> dict:
  """{hypothesis: verdict text} by README's rules."""
  modes = by_mode(rows)
  unavailable = {r["mode"]: r["reason"] for r in rows.values() if r["type"] == "unavailable"}
  out = {}
  for h, mode in (("H1", "bwrap_root"), ("H2", "bwrap_user")):
    attacks = modes.get(mode, {})
    runs = [r for rs in attacks.values() for r in rs]
    if not runs:
      out[h] = f"not measured ({unavailable.get(mode, 'no runs')})"
      continue
    bad = sorted({r["attack"] for r in runs if not r["contained"]})
    n = sum(r["contained"] for r in runs)
    out[h] = (f"supported: {n} of {len(runs)} runs contained" if not bad and len(runs) == 11 * REPS else
              f"not supported: {n} of {len(runs)} contained" + (f"; not contained: {', '.join(bad)}" if bad else ""))
  longest = {mode: max(r["wall_s"] for rs in attacks.values() for r in rs) for mode, attacks in modes.items()}
  over = {m: w for m, w in longest.items() if w > wall_s + 1.0}
  out["H3"] = ((f"supported: the longest run of each mode {', '.join(f'{m} {w:.2f} s' for m, w in longest.items())}"
                f" (limit {wall_s + 1.0:.0f} s)") if longest and not over else
               f"not supported: {', '.join(f'{m} {w:.2f} s' for m, w in over.items())}" if over else "not measured")
  attacks = modes.get("rlimits_root", {})
  if not attacks:
    out["H4"] = f"not measured ({unavailable.get('rlimits_root', 'no runs')})"
  else:
    contained_always = {a for a, rs in attacks.items() if all(r["contained"] for r in rs)}
    never = {a for a, rs in attacks.items() if not any(r["contained"] for r in rs)}
    expected = set(attacks) - NOT_ISOLATED_BY_RLIMITS
    ok = contained_always == expected and never == NOT_ISOLATED_BY_RLIMITS & set(attacks)
    out["H4"] = ("supported: contains the 8 resource and process attacks in every repetition; network and host "
                 "files not isolated, as documented" if ok else
                 f"not supported: always contained {sorted(contained_always)}, never {sorted(never)}")
  return out


def table(modes: dict) -> str:
  names = sorted({a for attacks in modes.values() for a in attacks})
  present = [m for m in MODES if m in modes]
  lines = ["| attack | " + " | ".join(present) + " |", "|---|" + "---|" * len(present)]
  for name in names:
    cells = []
    for mode in present:
      rs = modes[mode].get(name, [])
      if not rs:
        cells.append("-")
        continue
      n = sum(r["contained"] for r in rs)
      ended = sorted({r["ended"] for r in rs})
      wall = float(np.median([r["wall_s"] for r in rs]))
      cells.append(f"{'contained' if n == len(rs) else 'NOT contained'} {n}/{len(rs)}: {', '.join(ended)}; "
                   f"{rs[-1]['observed']} (median {wall:.2f} s)")
    lines.append(f"| `{name}` | " + " | ".join(cells) + " |")
  return "\n".join(lines)


def render(rows: dict) -> str:
  hosts = [r for r in rows.values() if r["type"] in ("host", "unavailable")]
  wall_s = hosts[0]["limits"]["wall_s"] if hosts else 3.0
  v = verdicts(rows, wall_s)
  modes = by_mode(rows)
  host = hosts[0] if hosts else {}
  commits = sorted({h["commit"] for h in hosts})
  text = ["# sandbox_security: results", "",
          f"Measured at commit {', '.join(f'`{c}`' for c in commits) or '-'} (pre-registration: README.md), kernel "
          f"{host.get('kernel', '-')}, {host.get('bwrap', '-')}, limits {host.get('limits', '-')}; every attack "
          f"{REPS} times per mode. Regenerate: `python experiments/sandbox_security/summarize.py "
          "--root=experiments/sandbox_security/runs --out=experiments/sandbox_security`.", "",
          "## Verdicts", ""]
  text += [f"- **{h}**: {v[h]}" for h in ("H1", "H2", "H3", "H4")]
  text += ["", "## Every attack, every mode", "", table(modes), ""]
  for row in rows.values():
    if row["type"] == "unavailable":
      text.append(f"Mode `{row['mode']}` not measured: {row['reason']}")
  return "\n".join(text) + "\n"


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", default="experiments/sandbox_security/runs")
  add_summary_args(p, one_plot=False)
  args = p.parse_args(argv)
  write_results(args.out, args.root, render(load(args.root)))


if __name__ == "__main__":
  main()
