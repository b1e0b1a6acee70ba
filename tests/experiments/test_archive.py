"""experiments/archive.py: finished workdirs only, rows cut to the kept keys, the wall records moved along, and an
archive that reads (driver.finished, read as a root) like the workdirs it came from."""
import json
import os

from experiments.archive import archive, keep
from experiments.driver import command_walls, finished


def _workdir(path, steps_done):
  os.makedirs(path)
  json.dump({"stages": ["rl"], "rl": {"kind": "rl", "steps": 4}}, open(os.path.join(path, "config.json"), "w"))
  rows = [{"stage": "rl", "step": s, "step_s": 0.5, "loss": 1.0, "eval/accuracy": 0.1 * s, "eval/pass@4": 0.2}
          if s % 2 == 0 else {"stage": "rl", "step": s, "step_s": 0.5, "loss": 1.0} for s in range(1, steps_done + 1)]
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def test_archive_keeps_finished_workdirs_cut_to_the_keys(tmp_path):
  root, dest = str(tmp_path / "root"), str(tmp_path / "dest")
  _workdir(os.path.join(root, "grpo_s0"), 4)
  _workdir(os.path.join(root, "gspo_s0"), 3)                       # interrupted: not archived
  with open(os.path.join(root, "runs.jsonl"), "w") as f:
    for name, wall in (("grpo_s0", 10.0), ("gspo_s0", 7.0), ("grpo_s0", 5.0)):
      f.write(json.dumps({"workdir": os.path.join(root, name), "wall_s": wall}) + "\n")
  assert archive(root, dest, ["stage", "step", "eval/"]) == ["grpo_s0"]
  assert sorted(os.listdir(dest)) == ["grpo_s0", "runs.jsonl"]
  rows = [json.loads(line) for line in open(os.path.join(dest, "grpo_s0", "metrics.jsonl"))]
  assert rows == [{"stage": "rl", "step": 2, "eval/accuracy": 0.2, "eval/pass@4": 0.2},
                  {"stage": "rl", "step": 4, "eval/accuracy": 0.4, "eval/pass@4": 0.2}]
  assert finished(os.path.join(dest, "grpo_s0"))
  assert command_walls(dest) == {os.path.join(dest, "grpo_s0"): 15.0}
  # Finishing the other run later archives it alone; what is archived stays as it is.
  _workdir(os.path.join(root, "gspo_s0b"), 4)
  assert archive(root, dest, ["stage", "step", "eval/"]) == ["gspo_s0b"]
  assert keep({"eval/x": 1, "evalx": 2, "step_s": 3, "step": 4}, ["eval/", "step"]) == {"eval/x": 1, "step": 4}
