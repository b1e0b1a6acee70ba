"""experiments/opd_scale/summarize.py: the overlap metrics' limits, the rank correlation, and the pre-registered
tables and tests on synthetic workdirs (no training: the overlaps come from the cache file)."""
import glob
import json
import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from configs.opd_scale import ARMS, DISTILL_STEPS, STUDENT_WIDTHS, TEACHER_WIDTHS, TEACHERS, teacher_step
from experiments.opd_scale import summarize as S


def _logits(key, n=6, r=4, v=12):
  return jax.random.normal(key, (n, r, v)) * 3.0


def test_a_model_against_itself_overlaps_fully_and_has_no_divergence():
  s = _logits(jax.random.key(0))
  response = jnp.argmax(s, -1)
  mask = jnp.ones(response.shape, bool).at[:, -1].set(False)
  m = S.overlap_metrics(s, s, response, mask)
  assert m["overlap@1"] == m["overlap@5"] == 1.0 and m["hit@1"] == 1.0      # argmax responses: in the top-1
  assert abs(m["reverse_kl"]) < 1e-6 and abs(m["logp_gap"]) < 1e-6


def test_overlap_counts_shared_top_k_tokens_on_the_masked_positions_only():
  v = 6
  s = jnp.log(jnp.array([[[.5, .3, .1, .05, .03, .02], [.5, .3, .1, .05, .03, .02]]]))     # top-2 {0, 1}
  t = jnp.log(jnp.array([[[.05, .5, .3, .1, .03, .02], [.02, .03, .05, .1, .3, .5]]]))     # {1, 2}, {5, 4}
  response = jnp.array([[2, 0]])
  both = S.overlap_metrics(s, t, response, jnp.array([[True, True]]), ks=(1, 2, v))
  assert both["overlap@2"] == pytest.approx(0.25) and both["overlap@1"] == 0.0 and both[f"overlap@{v}"] == 1.0
  assert both["hit@2"] == pytest.approx(0.5) and both[f"hit@{v}"] == 1.0
  first = S.overlap_metrics(s, t, response, jnp.array([[True, False]]), ks=(2,))
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


def _write(path, config, rows):
  os.makedirs(path, exist_ok=True)
  json.dump(config, open(os.path.join(path, "config.json"), "w"))
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def _synthetic_root(root):
  """Workdirs as run.py leaves them, with made-up numbers: recovery follows the overlap, not teacher accuracy."""
  cache, rng = {}, np.random.default_rng(0)
  acc_t = {"t96sft": 0.30, "t96rl": 0.36, "t192sft": 0.55, "t192rl": 0.60}
  for seed in range(3):
    for w in TEACHER_WIDTHS:
      rows = [{"stage": "sft", "step": teacher_step("sft"), "eval/accuracy": acc_t[f"t{w}sft"]},
              {"stage": "rl", "step": teacher_step("rl"), "eval/accuracy": acc_t[f"t{w}rl"]}]
      path = os.path.join(root, f"teacher_w{w}_s{seed}")
      _write(path, {"stages": ["sft", "rl"]}, rows)
      for kind in ("sft", "rl"):
        os.makedirs(os.path.join(path, "checkpoints", str(teacher_step(kind))))
    for w in STUDENT_WIDTHS:
      _write(os.path.join(root, f"student_w{w}_s{seed}"), {"stages": ["sft"]},
             [{"stage": "sft", "step": 300, "eval/accuracy": 0.05}])
    for arm, spec in ARMS.items():
      overlap = float(rng.uniform(0.5, 0.9))
      recovery = overlap - 0.5                                   # rises with overlap only
      acc1 = 0.05 + recovery * (acc_t[spec["teacher"]] - 0.05)
      config = {"stages": ["distill"], "distill": {"kind": "distill", "steps": DISTILL_STEPS}}
      train = [{"stage": "distill", "step": s, "step_s": 0.2, "reward": 0.1, "entropy": 1.0}
               for s in range(1, DISTILL_STEPS + 1)]
      _write(os.path.join(root, f"{arm}_s{seed}"), config,
             train + [{"stage": "distill", "step": DISTILL_STEPS, "eval/accuracy": acc1, "eval/response_len": 3.0}])
      metrics = {"overlap@1": overlap, "overlap@5": overlap, "hit@1": overlap, "hit@5": overlap,
                 "reverse_kl": 1 - overlap, "logp_gap": overlap - 1}
      cache[f"initial:{arm}:s{seed}"] = metrics
      cache[f"final:{arm}:s{seed}"] = {**metrics, "overlap@5": overlap + (acc1 - 0.05)}     # rises with the gain
  json.dump(cache, open(os.path.join(root, "overlaps.json"), "w"))


def test_summary_of_synthetic_runs_reports_every_pre_registered_test(tmp_path, capsys):
  root = str(tmp_path / "root")
  _synthetic_root(root)
  committed = {p: os.path.getmtime(p) for p in glob.glob(os.path.join(os.path.dirname(S.__file__), "*.png"))}
  assert committed      # the plots results.md shows
  S.main([f"--root={root}"])
  out = capsys.readouterr().out
  assert f"n = {3 * len(ARMS)} of {3 * len(ARMS)}" in out
  h1 = next(line for line in out.splitlines() if line.startswith("| overlap@5 (primary)"))
  assert "supported" in h1 and "| +1.00 |" in h1                  # recovery = overlap - 0.5 exactly
  for needle in ("t96rl - t192sft", "t192rl - t192sft (s128)", "s128 - s64 from t96rl", "## H4", "## H5", "## H6"):
    assert needle in out, needle
  gained = re.search(r"rose in (\d+) of the (\d+) triples", out)
  assert gained and gained[1] == gained[2] and "rho(change of overlap@5, gain) = +1.00 over 18 triples" in out
  # Into the run root, not over the committed plots (the default was the experiment's folder).
  assert os.path.exists(os.path.join(root, "curves.png")) and os.path.exists(os.path.join(root, "recovery.png"))
  assert committed == {p: os.path.getmtime(p) for p in committed}
  S.main([f"--root={root}", f"--out={tmp_path / 'plots'}"])
  assert sorted(os.listdir(tmp_path / "plots")) == ["curves.png", "recovery.png"]
  with pytest.raises(SystemExit):       # two plots: a folder, not one .png
    S.main([f"--root={root}", f"--out={tmp_path / 'c.png'}"])
  assert "this summary writes several plots; pass a folder" in capsys.readouterr().err
  assert set(TEACHERS) == {"t96sft", "t96rl", "t192sft", "t192rl"}
