"""Run logging: `workdir/metrics.jsonl`, `workdir/samples.jsonl`, wandb (offline by default), a tqdm bar.

Every row of metrics.jsonl is one JSON object with `step` (global, across stages), `stage` and the metrics
of that step; eval rows carry `eval/...` keys. samples.jsonl holds, per evaluation, a few of the greedy
completions it scored (`eval.log_samples` per eval set: `step`, `stage`, `set`, `prompt`, `completion`,
`answer`, `correct`), also shown on the console and as a wandb table (`eval/samples`), as verl and TRL show
theirs: what the model writes, not only how often it is right. On resume, rows of both files past the
restored step are dropped first, so the files of a resumed run are identical in content to an uninterrupted
one's (wall-clock fields aside).
"""
from __future__ import annotations

import json
import math
import os
from typing import Any, Optional

import numpy as np


SAMPLES_FILE = "samples.jsonl"
# Wall-clock fields differ between two runs of the same config; everything else must not. By name: these, and
# any metric whose last component ends in "_s" (seconds: sync/encode_s, sync/dense_s, ...).
TIMING_KEYS = ("time", "tokens_per_s", "sample_s", "update_s", "step_s", "gen_tokens_per_s")


def is_timing(key: str) -> bool:
  return key in TIMING_KEYS or key.rsplit("/", 1)[-1].endswith("_s")


def without_timings(rows: list[dict]) -> list[dict]:
  """Metric rows minus their wall-clock fields: what two runs of the same config must agree on exactly."""
  return [{k: v for k, v in r.items() if not is_timing(k)} for r in rows]


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
    self.samples_path = os.path.join(workdir, SAMPLES_FILE)
    self.workdir = workdir
    self._enabled = enabled
    self._bar = None
    if not enabled:
      return
    for path in (self.path, self.samples_path):
      kept = [] if resume_step is None else [r for r in read_metrics(path) if r["step"] <= resume_step]
      _write_all(path, kept)
    self._file = open(self.path, "a")
    self._progress = progress
    self._wandb = None
    if wandb_mode != "disabled":
      import wandb
      self._wandb = wandb.init(project=project, mode=wandb_mode, dir=workdir, config=config,
                               resume="allow", id=_run_id(workdir))

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

  def log_samples(self, step: int, stage: str, rows: list[dict]) -> None:
    """Evaluation rows (`set`, `prompt`, `completion`, `answer`, `correct`) of one evaluation: appended to
    samples.jsonl with `step` and `stage`, shown on the console (clipped), and logged as a wandb table."""
    if not self._enabled or not rows:
      return
    rows = [{"step": int(step), "stage": stage, **{k: _jsonable(v) for k, v in r.items()}} for r in rows]
    with open(self.samples_path, "a") as f:
      f.write("".join(json.dumps(r) + "\n" for r in rows))
    for line in sample_lines(rows, self.samples_path):
      self.say(line)
    if self._wandb is not None:
      import wandb
      columns = list(dict.fromkeys(k for r in rows for k in r))
      self._wandb.log({"eval/samples": wandb.Table(columns=columns, data=[[r.get(k) for k in columns]
                                                                          for r in rows])}, step=int(step))

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


def _write_all(path: str, rows: list[dict]) -> None:
  with open(path + ".tmp", "w") as f:
    for r in rows:
      f.write(json.dumps(r) + "\n")
  os.replace(path + ".tmp", path)


def _clip(text: str, width: int) -> str:
  """`text` as a Python literal (newlines and trailing spaces visible) of at most `width` characters: a long
  one keeps its head and its tail, where a prompt's question and a completion's answer are."""
  text = repr(text)
  if len(text) <= width:
    return text
  head = (width - 3) // 2
  return text[:head] + "..." + text[len(text) - (width - 3 - head):]


def sample_lines(rows: list[dict], where: str = SAMPLES_FILE) -> list[str]:
  """The console view of one evaluation's sample rows: a header per eval set, then one line per row,
  "[right] '3+4=' -> '7' (answer '7')"."""
  lines = []
  for name in dict.fromkeys(r["set"] for r in rows):
    mine = [r for r in rows if r["set"] == name]
    lines.append(f"samples {mine[0]['stage']} @ step {mine[0]['step']}, eval set {name!r} (its first "
                 f"{len(mine)} prompts; also in {os.path.basename(where)}):")
    lines += [f"  [{'right' if r['correct'] else 'wrong'}] {_clip(r['prompt'], 50)} -> "
              f"{_clip(r['completion'], 60)} (answer {_clip(r['answer'], 30)})" for r in mine]
  return lines


def _run_id(workdir: str) -> str:
  """A stable wandb run id per workdir, so a resumed run continues the same wandb run."""
  import hashlib
  return hashlib.sha1(os.path.abspath(workdir).encode()).hexdigest()[:12]
