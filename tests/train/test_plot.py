"""metrics.png: one global-step x-axis shared by every panel, per-stage panels where scales differ, one shared
eval panel with the previous stage's final evaluation as a baseline, a duplicated series drawn once, smoothed
curves over faint raw ones, one colour per stage and one figure legend, and a PNG that is really drawn."""
import json

import matplotlib
import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np

from rlkit.train.plot import (DPI, RAW_ALPHA, Panel, make_figure, plot_metrics, plot_panels, smooth,
                              stage_color)

SFT_STEPS = range(1, 31)    # the stage reserved steps 1..50 and stopped at 30 (stop_at_loss)
RL_STEPS = range(51, 71)
SFT_EVAL = 0.3


def _rows():
  rows, ema = [], 3.0
  for i, step in enumerate(SFT_STEPS):
    loss = 3.0 - 2.4 * i / (len(SFT_STEPS) - 1) + 0.1 * (-1) ** i
    ema = 0.9 * ema + 0.1 * loss
    rows.append({"step": step, "stage": "sft", "loss": loss, "loss_ema": ema, "grad_norm": 5.0 - 0.1 * i,
                 "lr": 1e-4, "step_s": 0.1})
  rows.append({"step": 30, "stage": "sft", "eval/accuracy": SFT_EVAL, "eval/pass@4": 0.45,
               "eval/num_examples": 64})
  for i, step in enumerate(RL_STEPS):
    reward = 0.3 + 0.02 * i + 0.05 * (-1) ** i
    # A 0/1 verifier: accuracy is the reward; it must be drawn once. dual_clip_frac (not plotted) and
    # clip_frac are both 0, which is not a duplicate: see test_constant_series_are_not_duplicates.
    rows.append({"step": step, "stage": "rl", "loss": 0.01 + 0.002 * (-1) ** i, "reward": reward,
                 "accuracy": reward, "kl": 1e-3 * i, "grad_norm": 0.2 + 0.01 * (-1) ** i, "clip_frac": 0.0,
                 "entropy": "nan"})   # non-finite values are stored as strings; not plotted
    if step % 10 == 0:
      rows.append({"step": step, "stage": "rl", "eval/accuracy": 0.3 + step / 200, "eval/pass@4": 0.5 + step / 300})
  return rows


def _write(tmp_path, rows):
  run = tmp_path / "run"
  run.mkdir()
  with open(run / "metrics.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  return str(run / "metrics.jsonl")


def test_panels_per_stage_where_scales_differ_shared_for_eval_and_the_duplicate_dropped():
  assert plot_panels(_rows()) == [
      Panel("loss", "sft"), Panel("loss", "rl"), Panel("reward", "rl", same_as=("accuracy",)),
      Panel("eval/accuracy", None), Panel("eval/pass@4", None), Panel("kl", "rl"), Panel("grad_norm", "sft"),
      Panel("grad_norm", "rl"), Panel("clip_frac", "rl")]


def test_constant_series_are_not_duplicates():
  # Both 0 all run by coincidence (e.g. clip_frac on policy, a reward nobody earns): two metrics, two panels.
  rows = [{"step": s, "stage": "rl", "reward": 0.0, "accuracy": 0.0} for s in range(1, 6)]
  assert plot_panels(rows) == [Panel("reward", "rl"), Panel("accuracy", "rl")]
  # Equal values at different steps are different series too.
  rows = [{"step": s, "stage": "rl", "reward": float(s)} for s in range(1, 6)]
  rows += [{"step": s + 1, "stage": "rl", "accuracy": float(s)} for s in range(1, 6)]
  assert [p.key for p in plot_panels(rows)] == ["reward", "accuracy"]


def _visible_axes(fig):
  return [ax for ax in fig.axes if ax.axison]


def test_every_panel_shares_one_global_step_axis():
  rows = _rows()
  fig = make_figure(rows, "run")
  try:
    axes = _visible_axes(fig)
    assert len(axes) == len(plot_panels(rows))
    for ax in axes:
      # The SFT loss panel included: global steps 1..70, not that stage's own 1..30, not "steps run".
      assert ax.get_xlim() == axes[0].get_xlim()
      assert axes[0].get_shared_x_axes().joined(axes[0], ax)
    x0, x1 = axes[0].get_xlim()
    assert x0 <= 1 and x1 >= 70 and x0 > 0 and x1 < 71, (x0, x1)
    # RL's curve sits at its global steps; eval points too (the SFT eval at 30, RL's at 60 and 70).
    loss_rl = axes[1]
    assert {tuple(line.get_xdata()[[0, -1]]) for line in loss_rl.get_lines()} == {(51, 70)}
    eval_x = sorted(x for line in axes[3].get_lines() for x in line.get_xdata())
    assert eval_x == [30, 60, 70]
    assert {ax.get_xlabel() for ax in axes} == {"global step", ""}
  finally:
    plt.close(fig)


def test_eval_panels_have_the_previous_stages_final_eval_as_a_baseline():
  rows = _rows()
  fig = make_figure(rows, "run")
  try:
    for ax, panel in zip(_visible_axes(fig), plot_panels(rows)):
      lines = [c for c in ax.collections if c.get_gid() == "baseline"]
      if not panel.key.startswith("eval/"):
        assert not lines, panel
        continue
      assert len(lines) == 1, panel
      (start, end), = [seg[:, 0] for seg in lines[0].get_segments()]
      y = {v for seg in lines[0].get_segments() for v in seg[:, 1]}
      want = SFT_EVAL if panel.key == "eval/accuracy" else 0.45
      assert y == {want} and (start, end) == (51, 70), (panel, y, start, end)
      assert matplotlib.colors.to_hex(lines[0].get_colors()[0]) == stage_color(["sft", "rl"], "sft")
    texts = [t.get_text() for t in fig.legends[0].get_texts()]
    assert texts[:2] == ["sft", "rl"] and "dashed: previous stage's final eval" in texts
  finally:
    plt.close(fig)


def test_a_single_stage_run_has_no_baseline():
  rows = [r for r in _rows() if r["stage"] == "rl"]
  fig = make_figure(rows)
  try:
    assert not [c for ax in fig.axes for c in ax.collections if c.get_gid() == "baseline"]
    assert not any("dashed" in t.get_text() for t in fig.legends[0].get_texts())
  finally:
    plt.close(fig)


def test_smoothed_curves_over_faint_raw_ones():
  rows = _rows()
  fig = make_figure(rows, "run")
  try:
    axes = dict(zip([(p.key, p.stage) for p in plot_panels(rows)], _visible_axes(fig)))
    raw, smoothed = axes["reward", "rl"].get_lines()
    assert raw.get_alpha() == RAW_ALPHA and smoothed.get_alpha() is None
    want = [r["reward"] for r in rows if "reward" in r]
    np.testing.assert_allclose(raw.get_ydata(), want)
    # The +-0.05 zigzag is averaged out; the trend is kept.
    assert np.abs(np.diff(smoothed.get_ydata(), 2)).max() < 0.5 * np.abs(np.diff(want, 2)).max()
    assert abs(np.mean(smoothed.get_ydata()) - np.mean(want)) < 0.01
    # The SFT loss smooths with the trainer's own average, the one stop_at_loss reads.
    _, ema = axes["loss", "sft"].get_lines()
    np.testing.assert_allclose(ema.get_ydata(), [r["loss_ema"] for r in rows if "loss_ema" in r])
    # Eval points are few: drawn as they are, marked.
    (evals,) = axes["eval/accuracy", None].get_lines()[:1]
    assert evals.get_marker() == "o" and evals.get_alpha() is None
  finally:
    plt.close(fig)


def test_smooth_is_a_centred_mean_that_keeps_a_line_and_skips_short_series():
  assert smooth([1.0, 2.0, 3.0]) is None
  line = np.arange(100, dtype=float)
  s = smooth(list(line))
  np.testing.assert_allclose(s[3:-3], line[3:-3])     # centred: no lag on a trend
  np.testing.assert_allclose(smooth([2.0, 4.0] * 20), 3.0, atol=0.7)


def test_figure_colours_and_legend():
  rows = _rows()
  panels = plot_panels(rows)
  fig = make_figure(rows, "run")
  try:
    for ax, panel in zip(_visible_axes(fig), panels):
      assert ax.get_ylabel().startswith(panel.key.replace("/", " ").replace("_", " ")), ax.get_ylabel()
      assert ax.get_legend() is None
      colours = {matplotlib.colors.to_hex(line.get_color()) for line in ax.get_lines()}
      stages = [panel.stage] if panel.stage else ["sft", "rl"]
      assert colours == {stage_color(["sft", "rl"], s) for s in stages}, (panel, colours)
    reward_ax = _visible_axes(fig)[panels.index(Panel("reward", "rl", ("accuracy",)))]
    assert reward_ax.get_ylabel() == "reward (= accuracy)"
    assert len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()][:2] == ["sft", "rl"]
  finally:
    plt.close(fig)


def test_png_is_the_figure_size_and_drawn(tmp_path):
  rows = _rows()
  path = _write(tmp_path, rows)
  out = str(tmp_path / "metrics.png")
  fig = make_figure(rows)
  width, height = fig.get_size_inches() * DPI
  plt.close(fig)
  assert plot_metrics(path, out) == out
  img = matplotlib.image.imread(out)[..., :3]     # floats in [0, 1]
  assert img.shape[:2] == (round(height), round(width))
  assert width >= 800 and height >= 600
  pixels = (img.reshape(-1, 3) * 255).round().astype(int)
  background = np.array([255, 255, 255])
  assert (np.abs(pixels - background).max(axis=1) > 10).mean() > 0.02
  assert len(np.unique(pixels, axis=0)) > 3
  for stage in ("sft", "rl"):
    rgb = np.array(matplotlib.colors.to_rgb(stage_color(["sft", "rl"], stage))) * 255
    assert (np.abs(pixels - rgb).max(axis=1) < 8).sum() > 100, stage


def test_no_rows_gives_none(tmp_path):
  assert plot_metrics(str(tmp_path / "missing.jsonl"), str(tmp_path / "a.png")) is None
  assert plot_metrics(_write(tmp_path, []), str(tmp_path / "b.png")) is None
  assert not (tmp_path / "a.png").exists() and not (tmp_path / "b.png").exists()
