"""The `acob` stage from configs/embodied.py:acob_test: it walks its three phases (calibration, TD and its gate,
reference-regularised updates with the trip-wire), and a run cut inside phase 3 resumes to the uninterrupted
run's metrics."""
import numpy as np

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
