"""`workdir/metrics.png`: the training curves of metrics.jsonl, one colour per stage throughout.

Every panel has the same x-axis, the global step (the `step` of metrics.jsonl, of wandb and of the
checkpoints), so a reader lines up one moment of the run down a column; each stage's stretch of it is tinted in
the stage's colour. An early-stopped stage (SFT's `stop_at_loss`) leaves the steps it reserved but did not run
as an untinted gap.

Panel rule, per key: a key in SHARED_SCALE (or an `eval/pass@k`) means the same thing on the same scale in
every stage, so it gets ONE panel with every stage's points on it, and from the second stage on, a dashed
line at the previous stage's final evaluation: the baseline the stage has to beat. Every other key gets one
panel per stage that logs it: the SFT loss (~3) and the RL loss (~0.01) on one y-axis would flatten the RL
curve. A panel whose series equals an earlier panel's (reward and accuracy under a 0/1 verifier) is dropped
and named in the kept panel's label.

Curves are drawn raw and faint, with a smoothed one on top: the trainer's own average where it logs one
(SMOOTHED; the loss average that `stop_at_loss` reads), else a centred moving mean over a window of ~1/20 of
the stage's points, which, unlike an EMA, does not shift the curve to the right.
"""
from __future__ import annotations

import math
import os
from typing import NamedTuple, Optional

import numpy as np

from rlkit.train.metrics import read_metrics

# In plot order; keys no row logs are skipped. `eval/pass@k` panels (whatever k the run used) follow
# eval/accuracy. grad_norm is the pre-clipping global norm (train/steps.py), clip_frac the fraction of tokens
# whose ratio the policy loss clipped (objectives/policy_losses.py).
PLOT_KEYS = ("loss", "reward", "accuracy", "eval/accuracy", "kl", "approx_kl", "entropy", "grad_norm",
             "clip_frac", "mismatch/mean", "response_len")
SHARED_SCALE = ("eval/accuracy",)
SMOOTHED = {"loss": "loss_ema"}
# Fewer points than this are drawn as they are: a moving mean over a handful of points hides them.
SMOOTH_MIN_POINTS = 8
# Matplotlib's tab10; a stage's colour is fixed by its order of first appearance in the file.
STAGE_COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f",
                "#bcbd22", "#17becf")
RAW_ALPHA = 0.3
MAX_COLS = 4
DPI = 100
# Fixed margins in inches (left, right, top without / with a suptitle, bottom) and gaps between panels
# (between columns, between rows), instead of a layout engine: constrained layout measured every tick label
# of every panel twice per save and drew the figure twice, ~2 s of a ~3 s save on a 2-core machine, at the
# end of every run. These fit a y tick label of ~7 characters (matplotlib's default formatter switches to an
# offset or scientific notation before they get longer), the y label, each panel's title, the x tick labels
# and x label, the figure title and the one-row legend.
MARGINS_IN = (0.9, 0.25, 0.45, 0.8, 0.85)
GAPS_IN = (1.0, 0.7)


class Panel(NamedTuple):
  key: str
  stage: Optional[str]           # None: a shared panel with every stage's points
  same_as: tuple[str, ...] = ()  # keys whose equal series were dropped in favour of this panel


def _num(v) -> bool:
  # Non-finite floats are stored as strings ("nan", "inf") and bools are not curves.
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def is_shared(key: str) -> bool:
  return key in SHARED_SCALE or key.startswith("eval/pass@")


def stages_of(rows: list[dict]) -> list[str]:
  return list(dict.fromkeys(r["stage"] for r in rows))


def stage_color(stages: list[str], stage: str) -> str:
  return STAGE_COLORS[stages.index(stage) % len(STAGE_COLORS)]


def points(rows: list[dict], key: str, stage: Optional[str]) -> list[tuple[int, float]]:
  """(global step, value) of `key` in `stage`'s rows, or in every row for stage None."""
  return [(r["step"], r[key]) for r in rows if _num(r.get(key)) and stage in (None, r["stage"])]


def step_range(rows: list[dict], stage: Optional[str] = None) -> tuple[int, int]:
  """First and last global step of `stage`'s rows (of all rows for None): the x-range every panel shares."""
  steps = [r["step"] for r in rows if stage in (None, r["stage"])]
  return min(steps), max(steps)


def _same_series(a: list[tuple[int, float]], b: list[tuple[int, float]]) -> bool:
  # A constant series (a metric at 0 all run, e.g. clip_frac on policy) equals any other constant one by
  # coincidence, not because the two metrics are one; only a moving curve is evidence of a duplicate.
  if len(a) != len(b) or len(a) < 2 or [s for s, _ in a] != [s for s, _ in b]:
    return False
  va, vb = np.array([v for _, v in a]), np.array([v for _, v in b])
  return bool(np.ptp(va) > 0 and np.allclose(va, vb, rtol=1e-6, atol=1e-12))


def plot_panels(rows: list[dict]) -> list[Panel]:
  """The panels of the figure, in order (see the module docstring for the rule)."""
  passk = sorted({k for r in rows for k in r if k.startswith("eval/pass@")},
                 key=lambda k: (len(k), k))     # pass@2 before pass@16
  keys = []
  for k in PLOT_KEYS:
    keys += [k] + (passk if k == "eval/accuracy" else [])
  panels: list[Panel] = []
  for key in keys:
    for stage in [None] if is_shared(key) else stages_of(rows):
      pts = points(rows, key, stage)
      if not pts:
        continue
      twin = next((i for i, p in enumerate(panels)
                   if p.stage == stage and _same_series(points(rows, p.key, stage), pts)), None)
      if twin is None:
        panels.append(Panel(key, stage))
      else:
        panels[twin] = panels[twin]._replace(same_as=panels[twin].same_as + (key,))
  return panels


def baselines(rows: list[dict], key: str) -> list[tuple[str, str, float]]:
  """(stage, previous stage, the previous stage's last value of `key`) for each stage after the first that
  logs `key`: on an evaluation panel, the score that stage started from."""
  logged = [s for s in stages_of(rows) if points(rows, key, s)]
  return [(s, prev, points(rows, key, prev)[-1][1]) for prev, s in zip(logged, logged[1:])]


def smooth(values: list[float]) -> Optional[np.ndarray]:
  """Centred moving mean (window ~1/20 of the points, at least 5, truncated at the ends); None below
  SMOOTH_MIN_POINTS."""
  n = len(values)
  if n < SMOOTH_MIN_POINTS:
    return None
  half = max(2, n // 40)    # at least 5 points: a 3-point mean leaves a third of a step-to-step zigzag
  csum = np.concatenate([[0.0], np.cumsum(values, dtype=float)])
  lo = np.clip(np.arange(n) - half, 0, n)
  hi = np.clip(np.arange(n) + half + 1, 0, n)
  return (csum[hi] - csum[lo]) / (hi - lo)


def _label(key: str) -> str:
  return key.replace("/", " ").replace("_", " ")


def _draw_curve(ax, rows: list[dict], key: str, stage: str, color: str) -> bool:
  """Draws `stage`'s curve of `key`; True if drawn raw under a smoothed one."""
  pts = points(rows, key, stage)
  x, y = map(np.array, zip(*pts))
  if key.startswith("eval/") or len(pts) == 1:
    # Eval rows are sparse, so mark each point (a lone point of a curve would be invisible otherwise), and
    # a handful of evaluations is not smoothed.
    ax.plot(x, y, color=color, marker="o", ms=4, lw=1.5)
    return False
  logged = points(rows, SMOOTHED[key], stage) if key in SMOOTHED else []
  if logged:
    sx, sy = map(np.array, zip(*logged))
  else:
    sx, sy = x, smooth(list(y))
  if sy is None:
    ax.plot(x, y, color=color, lw=1.5)
    return False
  ax.plot(x, y, color=color, lw=1.0, alpha=RAW_ALPHA)
  ax.plot(sx, sy, color=color, lw=1.8)
  return True


def _grid(width: float, height: float, cols: int, nrows: int, titled: bool) -> dict:
  """subplots_adjust's fractions for MARGINS_IN and GAPS_IN on a `width` x `height` inch figure."""
  left, right, top, top_titled, bottom = MARGINS_IN
  top = top_titled if titled else top
  panel_w = (width - left - right - (cols - 1) * GAPS_IN[0]) / cols
  panel_h = (height - top - bottom - (nrows - 1) * GAPS_IN[1]) / nrows
  return dict(left=left / width, right=1 - right / width, top=1 - top / height, bottom=bottom / height,
              wspace=GAPS_IN[0] / panel_w, hspace=GAPS_IN[1] / panel_h)


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
  width, height = 4 * cols, 3 * nrows + 1
  fig, axes = plt.subplots(nrows, cols, figsize=(width, height), squeeze=False, sharex=True,
                           gridspec_kw=_grid(width, height, cols, nrows, bool(title)))
  lo, hi = step_range(rows)
  used = list(axes.flat)[:len(panels)]
  smoothed = with_baseline = False
  for ax, panel in zip(used, panels):
    for s in stages:
      color = stage_color(stages, s)
      ax.axvspan(*step_range(rows, s), color=color, alpha=0.06, lw=0)
      if panel.stage in (None, s) and points(rows, panel.key, s):
        smoothed |= _draw_curve(ax, rows, panel.key, s, color)
    if panel.key.startswith("eval/"):
      for s, prev, value in baselines(rows, panel.key):
        with_baseline = True
        ax.hlines(value, step_range(rows, s)[0], hi, colors=stage_color(stages, prev), linestyles="--", lw=1.2,
                  gid="baseline")
    ax.set_title(panel.stage or "all stages", fontsize=10,
                 color="black" if panel.stage is None else stage_color(stages, panel.stage))
    ax.set_ylabel(_label(panel.key) + "".join(f" (= {_label(k)})" for k in panel.same_as))
    ax.grid(alpha=0.3)
    ax.tick_params(labelbottom=True)    # sharex hides them above the last row, which may have empty slots
  pad = max(0.5, 0.01 * (hi - lo))      # keeps end markers inside the axes without a visible dead range
  used[0].set_xlim(lo - pad, hi + pad)  # shared: sets every panel's
  for col in range(cols):
    # The label once per column, under its lowest panel.
    col_axes = used[col::cols]
    col_axes[-1].set_xlabel("global step")
  for ax in list(axes.flat)[len(panels):]:
    ax.axis("off")
  handles = [Line2D([], [], color=stage_color(stages, s), lw=2.5) for s in stages]
  labels = list(stages)
  if smoothed:
    handles.append(Line2D([], [], color="grey", lw=1.0, alpha=RAW_ALPHA))
    labels.append("faint: raw, solid: smoothed")
  if with_baseline:
    handles.append(Line2D([], [], color="grey", lw=1.2, ls="--"))
    labels.append("dashed: previous stage's final eval")
  fig.legend(handles, labels, loc="lower center", bbox_to_anchor=(0.5, 0.0), ncol=len(labels), frameon=False)
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
