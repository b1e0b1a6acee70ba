"""experiments/opd_scale: the overlap metrics' limits (overlaps.py), the rank correlation, the driver's calibration
gate (it stops the arms when it fails, and archives what ran) and the pre-registered tables and tests regenerated
from a synthetic archive (summarize.py; no training: the overlaps come from ROOT/overlaps.json)."""
import glob
import json
import os
import re
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.opd_scale import (ARMS, DISTILL_STEPS, EVAL_EVERY, PILOT, STUDENT_MAX_STEPS, STUDENT_STOP_AT_LOSS,
                               STUDENT_WIDTHS, TEACHERS, teacher_step)
from experiments.gate import GATE_FAILED, read_gate
from experiments.opd_scale import run as R
from experiments.opd_scale import summarize as S
from experiments.opd_scale.overlaps import OVERLAP_FILE, overlap_metrics
from tests.experiments.workdirs import no_training, write_workdir


def _logits(key, n=6, r=4, v=12):
  return jax.random.normal(key, (n, r, v)) * 3.0


def test_a_model_against_itself_overlaps_fully_and_has_no_divergence():
  s = _logits(jax.random.key(0))
  response = jnp.argmax(s, -1)
  mask = jnp.ones(response.shape, bool).at[:, -1].set(False)
  m = overlap_metrics(s, s, response, mask)
  assert m["overlap@1"] == m["overlap@5"] == 1.0 and m["hit@1"] == 1.0      # argmax responses: in the top-1
  assert abs(m["reverse_kl"]) < 1e-6 and abs(m["logp_gap"]) < 1e-6


def test_overlap_counts_shared_top_k_tokens_on_the_masked_positions_only():
  v = 6
  s = jnp.log(jnp.array([[[.5, .3, .1, .05, .03, .02], [.5, .3, .1, .05, .03, .02]]]))     # top-2 {0, 1}
  t = jnp.log(jnp.array([[[.05, .5, .3, .1, .03, .02], [.02, .03, .05, .1, .3, .5]]]))     # {1, 2}, {5, 4}
  response = jnp.array([[2, 0]])
  both = overlap_metrics(s, t, response, jnp.array([[True, True]]), ks=(1, 2, v))
  assert both["overlap@2"] == pytest.approx(0.25) and both["overlap@1"] == 0.0 and both[f"overlap@{v}"] == 1.0
  assert both["hit@2"] == pytest.approx(0.5) and both[f"hit@{v}"] == 1.0
  first = overlap_metrics(s, t, response, jnp.array([[True, False]]), ks=(2,))
  assert first["overlap@2"] == pytest.approx(0.5) and first["hit@2"] == 1.0
  ls, lt = jax.nn.log_softmax(s[0, 0]), jax.nn.log_softmax(t[0, 0])
  assert first["reverse_kl"] == pytest.approx(float((jnp.exp(ls) * (ls - lt)).sum()), rel=1e-5)
  assert first["logp_gap"] == pytest.approx(float(lt[2] - ls[2]), rel=1e-5)


def test_spearman_is_the_rank_correlation_with_average_ranks_for_ties():
  assert S.spearman([1, 2, 3, 4], [10, 20, 30, 40]) == pytest.approx(1.0)
  assert S.spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)
  assert np.isnan(S.spearman([1, 2, 3], [5, 5, 5])) and np.isnan(S.spearman([1, 2], [1, 2]))
  assert list(S.rank([3.0, 1.0, 3.0, 2.0])) == [2.5, 0.0, 2.5, 1.0]
  stats = pytest.importorskip("scipy.stats")
  x, y = np.random.default_rng(0).integers(0, 5, (2, 30))          # many ties
  assert S.spearman(x, y) == pytest.approx(stats.spearmanr(x, y)[0])


def test_verdict_rule():
  assert S.verdict("a", "b", [0.2, 0.15, -0.01], 0.1) == "a > b"
  assert S.verdict("a", "b", [0.05, -0.02, 0.01], 0.1) == "tie"
  assert S.verdict("a", "b", [0.6, -0.1, -0.1], 0.1) == "mixed"
  assert S.verdict("a", "b", [], 0.1) == "-"


ACC_T = {"tbase_sft": 0.95, "tbase_rl": 0.97, "t192sft": 0.80, "t192rl": 0.85, "tself": 0.70}


def _synthetic_root(root, seeds=(0, 1, 2), arms=tuple(ARMS), pilot_overlap=0.8):
  """Finished workdirs as run.py leaves them, with made-up numbers: students at 0.2, recovery following the
  initial overlap (recovery = overlap@5 - 0.5), not teacher accuracy; ROOT/overlaps.json and ROOT/runs.jsonl."""
  cache, rng, walls = {}, np.random.default_rng(0), []
  for seed in seeds:
    for run in ("base", "w192", "self"):
      stages = ["sft"] if run == "self" else ["sft", "rl"]
      mine = {t: s for t, (r, s) in TEACHERS.items() if r == run}
      rows = [{"stage": "sft", "step": 1, "eval/accuracy": 0.5, "at_stage_start": True}] + [
          {"stage": stage, "step": teacher_step(t), "eval/accuracy": ACC_T[t]} for t, stage in mine.items()]
      config = {"stages": stages, **{stage: {"kind": stage, "steps": teacher_step(t) - (
          teacher_step(t.replace("rl", "sft")) if stage == "rl" else 0)} for t, stage in mine.items()}}
      write_workdir(os.path.join(root, f"teacher_{run}_s{seed}"), config, rows)
    for w in STUDENT_WIDTHS:
      config = {"stages": ["sft"], "sft": {"kind": "sft", "steps": STUDENT_MAX_STEPS,
                                           "stop_at_loss": STUDENT_STOP_AT_LOSS[w]}}
      write_workdir(os.path.join(root, f"student_w{w}_s{seed}"), config,
             [{"stage": "sft", "step": 500, "loss": 0.5, "loss_ema": 0.5, "step_s": 0.05},
              {"stage": "sft", "step": 500, "eval/accuracy": 0.2}])
    for arm in arms:
      spec = ARMS[arm]
      overlap = pilot_overlap if (arm, seed) == (PILOT, 0) else float(rng.uniform(0.5, 0.9))
      recovery = overlap - 0.5                                   # rises with overlap only
      acc1 = 0.2 + recovery * (ACC_T[spec["teacher"]] - 0.2)
      config = {"stages": ["distill"], "distill": {"kind": "distill", "steps": DISTILL_STEPS}}
      train = [{"stage": "distill", "step": s, "step_s": 0.2, "reward": 0.1, "entropy": 1.0}
               for s in range(1, DISTILL_STEPS + 1)]
      evals = [{"stage": "distill", "step": 1, "eval/accuracy": 0.2, "at_stage_start": True}] + [
          {"stage": "distill", "step": s, "eval/accuracy": 0.2 + (acc1 - 0.2) * s / DISTILL_STEPS,
           "eval/response_len": 3.0} for s in range(EVAL_EVERY, DISTILL_STEPS + 1, EVAL_EVERY)]
      write_workdir(os.path.join(root, f"{arm}_s{seed}"), config, train + evals)
      metrics = {"overlap@1": overlap, "overlap@5": overlap, "hit@1": overlap, "hit@5": overlap,
                 "reverse_kl": 1 - overlap, "logp_gap": overlap - 1}
      cache[f"initial:{arm}:s{seed}"] = metrics
      cache[f"final:{arm}:s{seed}"] = {**metrics, "overlap@5": overlap + (acc1 - 0.2)}     # rises with the gain
    names = [os.path.basename(w) for w, _, _ in R.base_runs(root, seed, "")] + [f"{a}_s{seed}" for a in arms]
    walls += [{"workdir": os.path.join(root, n), "wall_s": 60.0, "rc": 0} for n in names]
  with open(os.path.join(root, OVERLAP_FILE), "w") as f:
    json.dump(cache, f)
  with open(os.path.join(root, "runs.jsonl"), "w") as f:
    f.writelines(json.dumps(w) + "\n" for w in walls)


def _no_training(monkeypatch):
  """The driver's launches allowed only for finished workdirs, and no overlaps process: a test never trains nor
  loads a checkpoint."""
  no_training(monkeypatch, R)
  monkeypatch.setattr(R, "overlaps", lambda args, seeds: 0)


def test_a_failed_gate_stops_before_the_arms(tmp_path, capsys, monkeypatch):
  _no_training(monkeypatch)
  root = str(tmp_path / "root")
  _synthetic_root(root, seeds=(0,), arms=tuple(ARMS), pilot_overlap=0.55)     # the pilot gains 3.75 points
  for arm in ARMS:                                               # only the gate's runs have run
    if arm != PILOT:
      shutil.rmtree(os.path.join(root, f"{arm}_s0"))
  assert R.main([f"--root={root}", "--dry_run"]) == GATE_FAILED
  out = capsys.readouterr().out
  assert f"pilot {PILOT}: gain in accuracy (seed 0) = 0.0375 (>= 0.1): FAIL" in out
  assert "calibration gate FAILED" in out and "configs/opd_scale.py:s128_from_t192rl" not in out   # not launched
  assert not read_gate(root)["passed"]


def test_gate_archive_and_summary_of_a_synthetic_run(tmp_path, capsys, monkeypatch):
  _no_training(monkeypatch)
  root, archive = str(tmp_path / "root"), str(tmp_path / "archive")
  _synthetic_root(root)
  committed = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(os.path.dirname(S.__file__), "*.png"))}
  assert committed      # the plots results.md shows
  assert R.main([f"--root={root}", f"--archive={archive}"]) == 0
  gate = read_gate(archive)
  assert gate["passed"] and gate["checks"][-1]["name"].startswith("range of seed 0's initial overlap@5")
  assert {OVERLAP_FILE, "gate.json", "runs.jsonl"} <= set(os.listdir(archive))
  assert not glob.glob(os.path.join(archive, "*", "checkpoints"))          # the summary reads no checkpoint
  capsys.readouterr()
  S.main([f"--root={archive}"])
  out = capsys.readouterr().out
  assert "Calibration gate: **passed**" in out
  assert "| 0 | 0.500 | 0.950 | 0.970 | 0.800 | 0.850 | 0.700 | 0.200 | 0.200 |" in out
  assert f"n = {3 * len(ARMS)} of {3 * len(ARMS)}" in out
  h1 = next(line for line in out.splitlines() if line.startswith("| overlap@5 (primary)"))
  assert "supported" in h1 and "| +1.00 |" in h1                  # recovery = overlap - 0.5 exactly
  for needle in ("t192rl - tbase_sft", "t192rl - t192sft (s128)", "tbase_rl - tbase_sft (s128)",
                 "s128 - s96 from t192rl", "M1 (the measure's check)", "## H4", "## H5", "## H6"):
    assert needle in out, needle
  gained = re.search(r"rose in (\d+) of the (\d+) triples", out)
  assert gained and gained[1] == gained[2] and f"rho(change of overlap@5, gain) = +1.00 over {3 * len(ARMS)}" in out
  # Into the run root, not over the committed plots.
  assert os.path.exists(os.path.join(archive, "curves.png")) and os.path.exists(os.path.join(archive, "recovery.png"))
  assert committed == {p: os.path.getmtime(p) for p in committed}
  S.main([f"--root={archive}", f"--out={tmp_path / 'plots'}"])
  assert sorted(os.listdir(tmp_path / "plots")) == ["curves.png", "recovery.png"]
  with pytest.raises(SystemExit):       # two plots: a folder, not one .png
    S.main([f"--root={archive}", f"--out={tmp_path / 'c.png'}"])
  assert "this summary writes several plots; pass a folder" in capsys.readouterr().err


def test_h1_is_not_tested_when_the_overlaps_span_too_little():
  assert S.h1_verdict(0.9, 0.1, 0.2, 12, 0.03).startswith("not tested (the triples' predictor spans 0.030")
  assert S.h1_verdict(0.9, 0.1, 0.2, 9, 0.3) == "not tested (n < 10)"
  assert S.h1_verdict(0.9, 0.1, 0.95, 12, 0.3).startswith("inconclusive")
  assert S.h1_verdict(0.5, 0.1, 0.2, 12, 0.3).startswith("supported")
  assert S.h1_verdict(-0.5, 0.1, 0.2, 12, 0.3, sign=-1).startswith("supported")    # reverse KL: smaller is closer
  assert S.h1_verdict(0.1, 0.5, 0.2, 12, 0.3).startswith("contradicted")
