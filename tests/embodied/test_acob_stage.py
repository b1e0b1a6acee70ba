"""The `acob` stage from configs/embodied.py:acob_test: it walks its three phases (calibration, TD and its gate,
reference-regularised updates with the trip-wire), and a run cut inside phase 3 resumes to the uninterrupted
run's metrics."""
import numpy as np
import pytest

from rlkit.train.metrics import without_timings
from tests.embodied.embodied_config import embodied_config
from tests.resume import cut_and_resume


def test_acob_walks_its_phases_and_resumes_to_the_uninterrupted_run(tmp_path, monkeypatch):
  """The acob_test preset: BC (4 steps), then ACoB: phase 1 (1 iteration), phase 2 (1, then its gate), phase 3
  (3 iterations with the trip-wire checked each); cut at global step 7 (phase 3), resumed, equal metrics."""
  reference, resumed = cut_and_resume(embodied_config("acob_test"), tmp_path, monkeypatch, 7)
  assert without_timings(resumed) == without_timings(reference)
  rows = [r for r in reference if r["stage"] == "acob" and "acob/phase" in r]
  assert [r["acob/phase"] for r in rows] == [1, 2, 3, 3, 3]
  assert "acob/gate_passed" in rows[1] and all("acob/tripped" in r and "acob/d_ref" in r for r in rows[2:])
  assert 0 < rows[2]["acob/d_ref"] < 1e-2 and all(np.isfinite(r["critic/loss"]) for r in rows)   # near the reference


@pytest.mark.slow   # ~30 s; tests/embodied/test_stream.py checks both modes on the loop itself in the default run
def test_acob_stream_runs_from_the_config_and_its_sync_mode_is_the_plain_loop(tmp_path):
  """acob.stream.mode=sync with blocks of 1 learn step gives the plain loop's metrics (its stream/* rates
  aside); stream mode runs blocks of learn steps on two threads and logs its rates and staleness."""
  from rlkit.train.metrics import read_metrics
  from rlkit.train.run import run
  from tests.fast_compile import fast_compile

  def acob_rows(mode, block, name):
    c = embodied_config("acob_test")
    c.acob.stream.update(mode=mode, block=block)
    if mode == "stream":
      c.acob.steps, c.acob.stream.exec_s = 3, 0.001
    with fast_compile():
      run(c, str(tmp_path / name))
    return [r for r in read_metrics(str(tmp_path / name / "metrics.jsonl")) if r["stage"] == "acob"]
  plain, sync = acob_rows("off", 1, "plain"), acob_rows("sync", 1, "sync")
  strip = lambda rows: without_timings([{k: v for k, v in r.items() if not k.startswith("stream/")}  # noqa: E731
                                        for r in rows])
  assert strip(sync) == strip(plain) and all("stream/decisions_per_s" in r for r in sync if "acob/phase" in r)
  stream = [r for r in acob_rows("stream", 2, "stream") if "acob/phase" in r]
  assert len(stream) == 3 and all(r["stream/decisions_per_s"] > 0 and r["stream/staleness"] >= 0 for r in stream)
