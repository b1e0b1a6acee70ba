"""The tests' cut-and-resume check: a run, the same run stopped right after its checkpoint at one global step
(an exception raised from `stages.save`, as a kill after the save would leave it), then resumed in the same
workdir: a resume that equals the uninterrupted run gives the same metric rows."""
from rlkit.train import stages
from rlkit.train.metrics import read_metrics
from tests.fast_compile import fast_compile


class Interrupted(Exception):
  pass


def cut_and_resume(config, tmp_path, monkeypatch, cut: int) -> tuple[list, list]:
  """(the uninterrupted run's metric rows, the cut-and-resumed run's), run under `fast_compile`."""
  from rlkit.train.run import run
  save = stages.save
  # Saved at the cut (and at each stage's end) only: the test presets save every step, ~0.3 s an Orbax save.
  config.checkpoint.every = cut

  def save_then_stop(ctx, state, global_step, meta, force):
    save(ctx, state, global_step, meta, force)
    if global_step == cut:
      raise Interrupted()

  with fast_compile():
    run(config, str(tmp_path / "ref"))
    monkeypatch.setattr(stages, "save", save_then_stop)
    try:
      run(config, str(tmp_path / "cut"))
    except Interrupted:
      pass
    else:
      raise AssertionError(f"the run never saved global step {cut}: nothing was cut")
    monkeypatch.setattr(stages, "save", save)
    run(config, str(tmp_path / "cut"))
  return (read_metrics(str(tmp_path / "ref" / "metrics.jsonl")),
          read_metrics(str(tmp_path / "cut" / "metrics.jsonl")))
