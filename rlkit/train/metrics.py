"""Run logging: `workdir/metrics.jsonl`, wandb (offline by default), a tqdm bar, and a PNG of the curves.

Every row of metrics.jsonl is one JSON object with `step` (global, across stages), `stage` and the metrics
of that step; eval rows carry `eval/...` keys. On resume, rows past the restored step are dropped first, so
the file of a resumed run is identical in content to an uninterrupted one (wall-clock fields aside).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Optional

import numpy as np


# Wall-clock fields differ between two runs of the same config; everything else must not.
TIMING_KEYS = ("time", "tokens_per_s", "sample_s", "update_s", "step_s", "gen_tokens_per_s")


def without_timings(rows: list[dict]) -> list[dict]:
  """Metric rows minus their wall-clock fields: what two runs of the same config must agree on exactly."""
  return [{k: v for k, v in r.items() if k not in TIMING_KEYS} for r in rows]


def _jsonable(v: Any) -> Any:
  if isinstance(v, (np.generic, np.ndarray)) or hasattr(v, "__array__"):
    v = np.asarray(v)
    v = v.item() if v.ndim == 0 else v.tolist()
  if isinstance(v, float) and not math.isfinite(v):
    return str(v)
  return v


def read_metrics(path: str) -> list[dict]:
  if not os.path.exists(path):
    return []
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


class MetricsLogger:
  """Appends metric rows to JSONL, mirrors them to wandb, and drives one progress bar per stage."""

  def __init__(self, workdir: str, wandb_mode: str = "offline", project: str = "rlkit",
               config: Optional[dict] = None, resume_step: Optional[int] = None, progress: bool = True,
               enabled: bool = True):
    """`enabled=False` (every process but 0 of a multi-host run) writes nothing and starts no wandb run."""
    self.path = os.path.join(workdir, "metrics.jsonl")
    self.workdir = workdir
    self._enabled = enabled
    self._bar = None
    if not enabled:
      return
    rows = read_metrics(self.path)
    if resume_step is None:
      rows = []
    else:
      rows = [r for r in rows if r["step"] <= resume_step]
    self._write_all(rows)
    self._file = open(self.path, "a")
    self._progress = progress
    self._wandb = None
    if wandb_mode != "disabled":
      import wandb
      self._wandb = wandb.init(project=project, mode=wandb_mode, dir=workdir, config=config,
                               resume="allow", id=_run_id(workdir))

  def _write_all(self, rows: list[dict]) -> None:
    tmp = self.path + ".tmp"
    with open(tmp, "w") as f:
      for r in rows:
        f.write(json.dumps(r) + "\n")
    os.replace(tmp, self.path)

  def start_stage(self, name: str, total: int, initial: int = 0) -> None:
    if not self._enabled or not self._progress:
      return
    from tqdm import tqdm
    self.close_bar()
    self._bar = tqdm(total=total, initial=initial, desc=name, dynamic_ncols=True)

  def log(self, step: int, stage: str, metrics: dict, show: tuple[str, ...] = ()) -> None:
    if not self._enabled:
      return
    row = {"step": int(step), "stage": stage}
    row.update({k: _jsonable(v) for k, v in metrics.items()})
    self._file.write(json.dumps(row) + "\n")
    self._file.flush()
    if self._wandb is not None:
      self._wandb.log({f"{stage}/{k}" if "/" not in k else k: v for k, v in row.items()
                       if isinstance(v, (int, float)) and k != "step"}, step=int(step))
    if self._bar is not None and show:
      self._bar.set_postfix({k: f"{row[k]:.3g}" for k in show if isinstance(row.get(k), (int, float))},
                            refresh=False)

  def advance(self, n: int = 1) -> None:
    if self._bar is not None:
      self._bar.update(n)

  def say(self, text: str) -> None:
    """One console line (process 0 only), printed above the progress bar when one is drawn."""
    if not self._enabled:
      return
    if self._bar is not None:
      self._bar.write(text)
    else:
      print(text, flush=True)

  def close_bar(self) -> None:
    if self._bar is not None:
      self._bar.close()
      self._bar = None

  def close(self) -> None:
    self.close_bar()
    if not self._enabled:
      return
    self._file.close()
    if self._wandb is not None:
      self._wandb.finish()


def _run_id(workdir: str) -> str:
  """A stable wandb run id per workdir, so a resumed run continues the same wandb run."""
  import hashlib
  return hashlib.sha1(os.path.abspath(workdir).encode()).hexdigest()[:12]
