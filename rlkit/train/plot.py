"""`workdir/metrics.png`: the training curves of metrics.jsonl, one colour per stage throughout.

Panel rule, per key: a key in SHARED_SCALE (or an `eval/pass@k`) means the same thing on the same scale in
every stage, so it gets ONE panel with every stage's points on it, x = steps run (global steps less the
steps earlier stages reserved but did not use). Every other key gets one panel per stage that logs it,
x = only that stage's logged steps: the SFT loss (~3) and the RL loss (~0.01) on one axis would flatten the
RL curve, and a stage that stopped early (SFT's `stop_at_loss`) would leave its unused reserved steps as an
empty stretch of a shared axis.
"""
from __future__ import annotations

import math
import os
from typing import Optional

from rlkit.train.metrics import read_metrics

# In plot order; keys no row logs are skipped. `eval/pass@k` panels (whatever k the run used) follow
# eval/accuracy.
PLOT_KEYS = ("loss", "reward", "accuracy", "eval/accuracy", "kl", "approx_kl", "entropy", "mismatch/mean",
             "response_len")
SHARED_SCALE = ("eval/accuracy",)
# Drawn faintly under its smoothed companion in the same panel, rather than as a panel of its own.
SMOOTHED = {"loss": "loss_ema"}
# Matplotlib's tab10; a stage's colour is fixed by its order of first appearance in the file.
STAGE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf")
MAX_COLS = 4
DPI = 100


def _num(v) -> bool:
  # Non-finite floats are stored as strings ("nan", "inf") and bools are not curves.
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_shared(key: str) -> bool:
  return key in SHARED_SCALE or key.startswith("eval/pass@")


def stages_of(rows: list[dict]) -> list[str]:
  return list(dict.fromkeys(r["stage"] for r in rows))


def stage_color(stages: list[str], stage: str) -> str:
  return STAGE_COLORS[stages.index(stage) % len(STAGE_COLORS)]


def _shifts(rows: list[dict]) -> dict[str, int]:
  """Per stage, what a shared panel subtracts from its global steps: the steps earlier stages reserved but
  did not run (an early-stopped SFT), so x there counts the steps run and has no empty stretch."""
  shifts, ran = {}, 0
  for stage in stages_of(rows):
    steps = [r["step"] for r in rows if r["stage"] == stage]
    shifts[stage] = min(steps) - 1 - ran
    ran += max(steps) - min(steps) + 1
  return shifts


def _points(rows: list[dict], key: str, stage: Optional[str]) -> list[tuple[int, float]]:
  """(x, value) of `key`: global steps in a stage's own panel; steps run (see `_shifts`) in a shared one."""
  if stage is None:
    shift = _shifts(rows)
    return [(r["step"] - shift[r["stage"]], r[key]) for r in rows if _num(r.get(key))]
  return [(r["step"], r[key]) for r in rows if _num(r.get(key)) and r["stage"] == stage]


def _rows_with(rows: list[dict], key: str, stage: Optional[str]) -> list[dict]:
  return [r for r in rows if _num(r.get(key)) and stage in (None, r["stage"])]


def plot_panels(rows: list[dict]) -> list[tuple[str, Optional[str], tuple[int, int]]]:
  """(key, stage, (first x, last x)) per panel; stage None for a shared panel over all stages (its x: steps
  run, see `_shifts`)."""
  passk = sorted({k for r in rows for k in r if k.startswith("eval/pass@")},
                 key=lambda k: (len(k), k))     # pass@2 before pass@16
  keys = []
  for k in PLOT_KEYS:
    keys += [k] + (passk if k == "eval/accuracy" else [])
  panels = []
  for key in keys:
    for stage in [None] if is_shared(key) else stages_of(rows):
      steps = [s for s, _ in _points(rows, key, stage)]
      if steps:
        panels.append((key, stage, (min(steps), max(steps))))
  return panels


def _label(key: str) -> str:
  return key.replace("/", " ").replace("_", " ")


def make_figure(rows: list[dict], title: str = ""):
  """The figure of plot_metrics (None if nothing plottable); the caller closes it."""
  panels = plot_panels(rows)
  if not panels:
    return None
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt
  from matplotlib.lines import Line2D
  stages = stages_of(rows)
  cols = min(MAX_COLS, len(panels))
  nrows = math.ceil(len(panels) / cols)
  # Whole inches, so the PNG is exactly figsize * DPI pixels; the extra inch holds the title and the legend.
  fig, axes = plt.subplots(nrows, cols, figsize=(4 * cols, 3 * nrows + 1), squeeze=False,
                           layout="constrained")
  for ax, (key, stage, (lo, hi)) in zip(axes.flat, panels):
    smoothed = False
    for s in stages if stage is None else [stage]:
      color = stage_color(stages, s)
      pts = [p for p, r in zip(_points(rows, key, stage), _rows_with(rows, key, stage)) if r["stage"] == s]
      if not pts:
        continue
      smooth = SMOOTHED.get(key)
      spts = _points(rows, smooth, s) if smooth and stage is not None else []
      x, y = zip(*pts)
      # Eval rows are sparse, so mark each point; a lone point of a curve would be invisible otherwise.
      marker = "o" if key.startswith("eval/") or len(pts) == 1 else None
      ax.plot(x, y, color=color, marker=marker, ms=4, lw=1.5, alpha=0.35 if spts else 1.0)
      if spts:
        ax.plot(*zip(*spts), color=color, lw=1.5)
        smoothed = True
    pad = max(0.5, 0.02 * (hi - lo))    # keeps end markers inside the axes without a visible dead range
    ax.set_xlim(lo - pad, hi + pad)
    ax.set_title(stage or "all stages", fontsize=10, color="black" if stage is None else stage_color(stages, stage))
    ax.set_ylabel(_label(key) + (" (ema solid)" if smoothed else ""))
    ax.set_xlabel("step" if stage else "steps run (reserved, unused steps cut)")
    ax.grid(alpha=0.3)
  for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
  handles = [Line2D([], [], color=stage_color(stages, s), lw=2.5) for s in stages]
  fig.legend(handles, stages, loc="outside lower center", ncol=len(stages), frameon=False)
  if title:
    fig.suptitle(title)
  return fig


def plot_metrics(path: str, out_png: str) -> Optional[str]:
  """Plots the metrics.jsonl at `path` into `out_png`, titled with the workdir's name. Returns the PNG path,
  or None if there are no rows (or none with a plotted key)."""
  rows = read_metrics(path)
  fig = make_figure(rows, os.path.basename(os.path.dirname(os.path.abspath(path)))) if rows else None
  if fig is None:
    return None
  import matplotlib.pyplot as plt
  fig.savefig(out_png, dpi=DPI)
  plt.close(fig)
  return out_png
