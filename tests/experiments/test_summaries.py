"""The summarisers' shared behaviour (experiments/driver.py, experiments/arm_tables.py): plots go to the run root
unless --out says otherwise, never over the committed plots; a smoke (quick) run prints "smoke run" where a
verdict would be; a metric no seed logged is a NaN cell, not a numpy warning. On synthetic workdirs."""
import argparse
import glob
import json
import os
import warnings

import numpy as np
import pytest

from configs.baselines import QUICK_STEPS as BASELINES_QUICK_STEPS
from configs.calif import ARMS as CALIF_ARMS
from configs.logra import QUICK_STEPS, STEPS
from experiments import arm_tables
from experiments.baselines import summarize as baselines
from experiments.calibrated_is import summarize as calibrated_is
from experiments.calif import summarize as calif
from experiments.driver import SMOKE_RUN, add_summary_args, summary_path, verdict_or_smoke
from experiments.grpo_arith import summarize as grpo_arith
from experiments.logra import summarize as logra
from tests.experiments.workdirs import write_workdir

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _rl_run(path, steps, acc, stage="rl", every=None, **extra):
  """A one-stage workdir that ran `steps` iterations and evaluated every `every` (default: at the end)."""
  train = [{"stage": stage, "step": s, "step_s": 0.1, "reward": 0.5, "grad_norm": 1.0, **extra}
           for s in range(1, steps + 1)]
  evals = [{"stage": stage, "step": s, "eval/accuracy": acc, "eval/pass@4": acc + 0.1}
           for s in range(every or steps, steps + 1, every or steps)]
  write_workdir(path, {"stages": [stage], stage: {"steps": steps}}, train + evals)


@pytest.fixture
def committed_plots():
  """The PNGs under experiments/ (the plots results.md files show) and their modification times; a test using it
  checks that they are untouched."""
  plots = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(REPO, "experiments", "*", "*.png"))}
  assert plots
  yield plots
  assert plots == {p: os.path.getmtime(p) for p in plots}


def test_summary_path_is_the_run_root_unless_out_says_otherwise(tmp_path):
  root = str(tmp_path / "root")
  assert summary_path("", root, "curves.png") == os.path.join(root, "curves.png") and os.path.isdir(root)
  assert summary_path(str(tmp_path / "plots"), root, "curves.png") == str(tmp_path / "plots" / "curves.png")
  assert summary_path(str(tmp_path / "x" / "mine.png"), root, "curves.png") == str(tmp_path / "x" / "mine.png")
  assert os.path.isdir(tmp_path / "plots") and os.path.isdir(tmp_path / "x")


def test_summary_args(capsys):
  p = argparse.ArgumentParser()
  add_summary_args(p, quick="the quick workdirs")
  assert vars(p.parse_args([])) == {"out": "", "quick": False}
  assert p.parse_args(["--out=a.png", "--quick"]).quick
  several = argparse.ArgumentParser()
  add_summary_args(several, one_plot=False)
  assert not hasattr(several.parse_args([]), "quick")
  with pytest.raises(SystemExit):
    several.parse_args(["--out=a.png"])
  assert "this summary writes several plots; pass a folder" in capsys.readouterr().err
  assert verdict_or_smoke("supported", False) == "supported" and verdict_or_smoke("supported", True) == SMOKE_RUN


def test_over_seeds_gives_nan_for_a_column_no_seed_logged_without_a_warning():
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    mean, lo, hi = arm_tables.over_seeds(np.array([[1.0, np.nan, np.nan], [3.0, 2.0, np.nan]]).T)
    empty = arm_tables.over_seeds([])
  np.testing.assert_array_equal(mean, [2.0, 2.0, np.nan])
  np.testing.assert_array_equal(lo, [1.0, 2.0, np.nan])
  np.testing.assert_array_equal(hi, [3.0, 2.0, np.nan])
  assert [len(x) for x in empty] == [0, 0, 0]


def test_arm_summary_with_a_metric_no_arm_logs_writes_into_the_run_root_without_warnings(tmp_path, capsys,
                                                                                          committed_plots):
  """calif's metrics include constraint keys; these runs log only eval/accuracy: all-NaN columns. The plot
  went to experiments/calif/curves.png (the committed one) by default, and numpy warned about the NaN cells."""
  root = tmp_path / "calif"
  _rl_run(str(root / "sft_s0"), 10, 0.2, stage="sft")
  for i, arm in enumerate(CALIF_ARMS):
    for seed in (0, 1):
      _rl_run(str(root / f"{arm}_s{seed}"), 20, 0.3 + 0.1 * i, every=10)
  with warnings.catch_warnings():
    warnings.simplefilter("error")
    calif.main([f"--root={root}", "--seeds=0,1"])
  out = capsys.readouterr().out
  assert (root / "curves.png").exists() and f"wrote {root / 'curves.png'}" in out
  assert "| constraints | 0.300 | 0.300 |" in out and "| constraints | nan | nan |" in out
  calif.main([f"--root={root}", "--seeds=0,1", f"--out={tmp_path / 'mine.png'}"])
  assert (tmp_path / "mine.png").exists()


def test_logra_verdicts_of_quick_runs_read_smoke_run(tmp_path, capsys, committed_plots):
  for steps, smoke in ((QUICK_STEPS, True), (STEPS // 10, False)):
    root = tmp_path / f"logra_{steps}"
    for arm, acc in (("adamw", 0.5), ("logra_r16", 0.3)):
      _rl_run(str(root / f"{arm}_s0"), steps, acc)
    logra.main([f"--root={root}", "--seeds=0"])
    out = capsys.readouterr().out
    assert (root / "curves.png").exists()
    row = next(line for line in out.splitlines() if line.startswith("| logra_r16 | -0.200"))
    if smoke:
      assert out.startswith(f"{SMOKE_RUN}: ") and f"{root / 'adamw_s0'}" in out.splitlines()[0]
      assert f"| {SMOKE_RUN} |" in row and "below" not in out and "supported" not in out
    else:
      assert SMOKE_RUN not in out and "| below |" in row
  assert STEPS // 10 != QUICK_STEPS


def _calibrated_is_archive(root, quick_flags, fp8_mismatch=0.05):
  """An archive as calibrated_is/run.py leaves it (made-up numbers): the gate runs of both copies (bf16 below the
  mismatch gate, fp8 at `fp8_mismatch`), gate.json, and results.jsonl with 3 seeds x 4 batches on fp8 where
  calibrated IS is below the published rule, which is below token-TIS, and token-TIS ties with no correction (so
  every hypothesis reads "supported"), then one `wall` row per command in `quick_flags`."""
  from experiments.calibrated_is import mismatch_gate
  from experiments.gate import record_gate
  gate_rows = {}
  for copy, mismatch in (("bf16", 0.004), ("fp8", fp8_mismatch)):
    rows = [{"stage": "rl", "step": s, "reward": 0.6, "informative_groups": 0.7, "mismatch/mean": mismatch,
             "mismatch/max": 10 * mismatch, "rollout_corr/kl": mismatch / 10, "rollout_corr/k3_kl": mismatch / 10,
             "rollout_corr/rollout_is_ratio_fraction_high": 0.1} for s in (1, 2, 3)]
    rows.append({"stage": "rl", "step": 3, "eval/accuracy": 0.7})
    write_workdir(os.path.join(root, f"gate_{copy}"), {"stages": ["rl"], "rl": {"steps": 3}}, rows)
    gate_rows[copy] = rows
  outcome = mismatch_gate.evaluate(gate_rows)
  record_gate(root, "calibrated_is", mismatch_gate.checks(outcome), passed=outcome["passed"],
              arms_copies=outcome["arms_copies"], base={"path": "base", "model_safetensors_sha256": "ab" * 32})
  rows, rng = [], np.random.default_rng(0)
  offset = {"none": 0.0, "token_tis": 0.0, "seq_tis": 0.01, "icepop": 0.0, "calibrated": -0.5, "cis": -0.2}
  for seed in range(3 if outcome["passed"] else 0):
    rows.append({"type": "target", "key": f"target/{seed}", "seed": seed, "batches": 8, "rows_per_batch": 128,
                 "half_cos": 0.9, "floor_nmse": 0.01, "reward": 0.6, "informative": 0.7, "lr_abs": 0.0})
    for b in range(4):
      base = 5.0 + rng.standard_normal()
      rows.append({"type": "batch", "key": f"batch/{seed}/fp8/{b}", "seed": seed, "copy": "fp8", "batch": b,
                   "lr_abs": 0.05, "lr_abs_conf": 0.01, "lr_abs_unconf": 0.2, "k3_kl": 0.002, "frac_conf": 0.8,
                   "reward": 0.6, "informative": 0.7})
      for arm in calibrated_is.ARMS:
        rows.append({"type": "grad", "key": f"grad/{seed}/fp8/{arm}/{b}", "seed": seed, "copy": "fp8", "arm": arm,
                     "batch": b, "nmse": base + offset[arm] + 0.001 * rng.standard_normal(), "cos": 0.3,
                     "g_norm_rel": 2.0, "kept_tokens": 500, "empty": False, "ess": 0.99, "masked_frac": 0.0,
                     "truncated_frac": 0.05, "weight_mean": 1.0, "sigma": 0.1 if arm == "calibrated" else None})
    for arm in calibrated_is.ARMS:
      rows.append({"type": "mean_grad", "key": f"mean_grad/{seed}/fp8/{arm}", "seed": seed, "copy": "fp8",
                   "arm": arm, "batches": 4, "nmse": 1.5 + offset[arm] / 4})
  rows += [{"type": "wall", "key": f"wall/all///{i}", "part": "all", "seeds": "", "quick": q, "wall_s": 60.0}
           for i, q in enumerate(quick_flags)]
  with open(os.path.join(root, "results.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


@pytest.mark.parametrize("quick_flags, verdict", [((True,), SMOKE_RUN), ((True, False), "supported"),
                                                  ((False, True), SMOKE_RUN)])
def test_calibrated_is_summary_of_an_archive_gives_the_gate_and_every_verdict(tmp_path, capsys, committed_plots,
                                                                             quick_flags, verdict):
  root = str(tmp_path / "runs")
  _calibrated_is_archive(root, quick_flags)
  calibrated_is.main([f"--root={root}"])
  out = capsys.readouterr().out
  assert "Calibration gate: **passed**" in out and "| bf16 copy: trainer's mismatch/mean | 0.004 | >= 0.03 | FAIL |" in out
  assert "GATE: PASSED: the arms ran on fp8" in out and f"SHA-256 {'ab' * 32}" in out
  assert "| fp8 | 3 | 0.0500 |" in out and "| bf16 | 3 | 0.0040 |" in out      # the gate runs' table
  for name in calibrated_is.TESTS:
    assert f"{name} (" in out and (f"VERDICT: {verdict} (per seed: seed 0: {verdict}, seed 1: {verdict}, seed 2: "
                                   f"{verdict})") in out.split(f"{name} (")[-1].splitlines()[0]
  assert "| H1 | calibrated − token_tis | fp8 | seed 2 | 4 |" in out
  assert os.path.exists(os.path.join(root, "grad_mse.png"))


def test_calibrated_is_summary_of_a_failed_gate_reports_it_and_no_verdict(tmp_path, capsys, committed_plots):
  root = str(tmp_path / "runs")
  _calibrated_is_archive(root, (False,), fp8_mismatch=0.01)
  calibrated_is.main([f"--root={root}"])
  out = capsys.readouterr().out
  assert "GATE: FAILED" in out and "| fp8 copy: trainer's mismatch/mean | 0.01 | >= 0.03 | FAIL |" in out
  assert out.count("VERDICT: not tested (the gate failed)") == len(calibrated_is.TESTS) == 4
  assert not os.path.exists(os.path.join(root, "grad_mse.png"))
  with open(os.path.join(root, "gate.json"), "w") as f:       # a record the metrics do not back is refused
    json.dump({"arms_copies": ["fp8"]}, f)
  with pytest.raises(SystemExit, match="inconsistent"):
    calibrated_is.main([f"--root={root}"])


def test_baselines_quick_summary_is_headed_smoke_run(tmp_path, capsys, committed_plots):
  root = tmp_path / "baselines"
  _rl_run(str(root / "sft_s0"), 10, 0.2, stage="sft")
  _rl_run(str(root / "grpo_quick_s0"), BASELINES_QUICK_STEPS, 0.4, every=25, response_len_wrong=3.0, clip_frac=0.0)
  _rl_run(str(root / "grpo_s0"), 2 * BASELINES_QUICK_STEPS, 0.5, every=50, response_len_wrong=3.0, clip_frac=0.0)
  baselines.main([f"--root={root}", "--seeds=0", "--quick"])
  out = capsys.readouterr().out
  assert out.startswith(SMOKE_RUN) and "| grpo | 0 | 0.400 | +20.0 |" in out
  assert (root / "accuracy_quick.png").exists()
  baselines.main([f"--root={root}", "--seeds=0"])
  out = capsys.readouterr().out
  assert SMOKE_RUN not in out and "| grpo | 0 | 0.500 | +30.0 |" in out and (root / "accuracy.png").exists()


def test_grpo_arith_plot_goes_beside_the_workdirs(tmp_path, capsys, committed_plots):
  runs = tmp_path / "runs"
  for seed in (0, 1):
    rows = [{"stage": "sft", "step": s, "loss": 1.0, "step_s": 0.1} for s in range(1, 11)]
    rows.append({"stage": "sft", "step": 10, "eval/accuracy": 0.2, "eval/pass@4": 0.3})
    rows += [{"stage": "rl", "step": s, "reward": 0.5, "step_s": 0.1} for s in range(11, 41)]
    rows.append({"stage": "rl", "step": 40, "eval/accuracy": 0.5, "eval/pass@4": 0.6})
    write_workdir(str(runs / f"w_s{seed}"), {"seed": seed, "stages": ["sft", "rl"], "sft": {"steps": 10},
                                       "rl": {"steps": 30}}, rows)
  grpo_arith.main([str(runs / "w_s0"), str(runs / "w_s1")])
  assert "mean gain +30.0 points" in capsys.readouterr().out
  assert (runs / "accuracy.png").exists()
