"""metrics.png: per-stage panels where scales differ, one shared eval panel, x axes without the steps a stage
reserved but did not use, one colour per stage and one figure legend, and a PNG that is really drawn."""
import json

import matplotlib
import matplotlib.image
import matplotlib.pyplot as plt
import numpy as np

from rlkit.train.plot import DPI, make_figure, plot_metrics, plot_panels, stage_color

SFT_STEPS = range(1, 31)    # the stage reserved steps 1..50 and stopped at 30 (stop_at_loss)
RL_STEPS = range(51, 71)


def _rows():
  rows, ema = [], 3.0
  for i, step in enumerate(SFT_STEPS):
    loss = 3.0 - 2.4 * i / (len(SFT_STEPS) - 1) + 0.1 * (-1) ** i
    ema = 0.9 * ema + 0.1 * loss
    rows.append({"step": step, "stage": "sft", "loss": loss, "loss_ema": ema, "lr": 1e-4, "step_s": 0.1})
  rows.append({"step": 30, "stage": "sft", "eval/accuracy": 0.3, "eval/pass@4": 0.45, "eval/num_examples": 64})
  for i, step in enumerate(RL_STEPS):
    rows.append({"step": step, "stage": "rl", "loss": 0.01 + 0.002 * (-1) ** i, "reward": 0.3 + 0.02 * i,
                 "kl": 1e-3 * i, "entropy": "nan"})   # non-finite values are stored as strings; not plotted
    if step % 10 == 0:
      rows.append({"step": step, "stage": "rl", "eval/accuracy": 0.3 + step / 200, "eval/pass@4": 0.5 + step / 300})
  return rows


def _write(tmp_path, rows):
  run = tmp_path / "run"
  run.mkdir()
  with open(run / "metrics.jsonl", "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)
  return str(run / "metrics.jsonl")


def test_losses_get_a_panel_per_stage_and_eval_accuracy_one_shared_panel():
  panels = plot_panels(_rows())
  assert [(k, s) for k, s, _ in panels] == [
      ("loss", "sft"), ("loss", "rl"), ("reward", "rl"), ("eval/accuracy", None), ("eval/pass@4", None),
      ("kl", "rl")]
  ranges = {(k, s): r for k, s, r in panels}
  assert ranges["loss", "sft"] == (min(SFT_STEPS), max(SFT_STEPS))    # not the 50 steps the stage reserved
  assert ranges["loss", "rl"] == ranges["kl", "rl"] == (min(RL_STEPS), max(RL_STEPS))
  assert ranges["eval/accuracy", None] == (30, 50)    # steps run: the 20 steps SFT reserved but did not use are cut


def test_figure_axes_colours_and_legend():
  rows = _rows()
  panels = plot_panels(rows)
  fig = make_figure(rows, "run")
  try:
    axes = [ax for ax in fig.axes if ax.axison]
    assert len(axes) == len(panels)
    for ax, (key, stage, (lo, hi)) in zip(axes, panels):
      x0, x1 = ax.get_xlim()
      assert x0 <= lo and x1 >= hi and x0 > lo - 1 and x1 < hi + 1, (key, stage, ax.get_xlim())
      assert ax.get_ylabel().startswith(key.replace("/", " ")), ax.get_ylabel()
      assert ax.get_legend() is None
      colours = {matplotlib.colors.to_hex(line.get_color()) for line in ax.get_lines()}
      want = {stage_color(["sft", "rl"], s) for s in ([stage] if stage else ["sft", "rl"])}
      assert colours == want, (key, stage, colours)
    assert len(fig.legends) == 1
    assert [t.get_text() for t in fig.legends[0].get_texts()] == ["sft", "rl"]
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
