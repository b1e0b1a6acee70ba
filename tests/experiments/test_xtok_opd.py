"""experiments/xtok_opd: the committed tokenizers are what make_bpe.py trains (a folder of other tokenizers is
refused), the driver's calibration gate stops the arms when it fails and archives what ran, and the summary
regenerates the tables from a synthetic archive (no training)."""
import filecmp
import json
import os

import pytest

from configs.xtok_opd import (ARMS, BASE_SFT_STEPS, BPE_DIR, EVAL_EVERY, PILOT, STEPS, STUDENT_MAX_STEPS,
                              STUDENT_STOP_AT_LOSS, TOKENIZERS, VOCAB_A, VOCAB_B)
from experiments.gate import GATE_FAILED, read_gate
from experiments.xtok_opd import run as R
from experiments.xtok_opd import summarize as S
from experiments.xtok_opd.make_bpe import FILES, alignment_report, make_tokenizers
from tests.experiments.workdirs import no_training, write_workdir


def test_the_presets_tokenizers_are_what_make_bpe_trains_and_other_tokenizers_are_refused(tmp_path):
  paths = make_tokenizers(str(tmp_path))          # (one training for both checks: it is most of the cost)
  assert set(paths) == set(TOKENIZERS) == {"a", "b"}
  for name in paths:
    for f in FILES:
      assert filecmp.cmp(os.path.join(paths[name], f), os.path.join(BPE_DIR, name, f), shallow=False), (name, f)
  assert make_tokenizers(str(tmp_path)) == paths                 # again: checked, kept
  report = alignment_report(paths["a"], paths["b"])              # B against a teacher that merges further
  assert (report["vocab_teacher"], report["vocab_student"]) == (VOCAB_A, VOCAB_B)
  assert report["shared_tokens"] == VOCAB_B
  assert 0.3 < report["aligned_frac"] < 0.9 and report["spans_per_answer"] > 0.2   # room for both modes
  assert report["teacher_tokens_per_answer"] < report["student_tokens_per_answer"]
  with open(os.path.join(paths["b"], "tokenizer.json"), "a") as f:
    f.write(" ")
  with pytest.raises(FileExistsError, match=r"holds another tokenizer than make_bpe trains now"):
    make_tokenizers(str(tmp_path))


def _synthetic_root(root, seeds=(0, 1, 2), arms=tuple(ARMS), pilot_gain=0.2):
  """Finished workdirs as run.py leaves them, with made-up numbers: the teacher at 0.95, students at 0.25, the
  OPD arms gaining by mode (both > aligned > spans), and the command walls of ROOT/runs.jsonl."""
  gains = {"sft_demo": 0.40, "aligned": 0.12, "spans": 0.05, "both": 0.18, "same_tok": pilot_gain}
  walls = []
  for seed in seeds:
    write_workdir(os.path.join(root, f"teacher_s{seed}"), {"stages": ["sft"], "sft": {"kind": "sft", "steps": BASE_SFT_STEPS}},
           [{"stage": "sft", "step": 1, "eval/accuracy": 0.9, "at_stage_start": True},
            {"stage": "sft", "step": BASE_SFT_STEPS, "eval/accuracy": 0.95}])
    for tok in ("b", "d"):
      config = {"stages": ["sft"], "sft": {"kind": "sft", "steps": STUDENT_MAX_STEPS,
                                           "stop_at_loss": STUDENT_STOP_AT_LOSS[tok]}}
      write_workdir(os.path.join(root, f"student_{tok}_s{seed}"), config,
             [{"stage": "sft", "step": 600, "loss": 0.5, "loss_ema": 0.5, "step_s": 0.05},
              {"stage": "sft", "step": 600, "eval/accuracy": 0.25}])
    for arm in arms:
      kind = "sft" if arm == "sft_demo" else "distill"
      train = [{"stage": kind, "step": s, "step_s": 0.2, "reward": 0.3, **(
          {"distill/aligned_frac": 0.8, "distill/spans": 0.5} if ARMS[arm]["cross_tokenizer"] else {})}
          for s in range(1, STEPS + 1)]
      evals = [{"stage": kind, "step": 1, "eval/accuracy": 0.25, "at_stage_start": True}] + [
          {"stage": kind, "step": s, "eval/accuracy": 0.25 + gains[arm] * s / STEPS + 0.01 * seed}
          for s in range(EVAL_EVERY, STEPS + 1, EVAL_EVERY)]
      write_workdir(os.path.join(root, f"{arm}_s{seed}"), {"stages": [kind], kind: {"kind": kind, "steps": STEPS}},
             train + evals)
    for name in (*R.BASES, *arms):
      walls.append({"workdir": os.path.join(root, f"{name}_s{seed}"), "wall_s": 60.0, "rc": 0})
  with open(os.path.join(root, "runs.jsonl"), "w") as f:
    f.writelines(json.dumps(w) + "\n" for w in walls)


def test_a_failed_gate_stops_before_the_arms(tmp_path, capsys, monkeypatch):
  no_training(monkeypatch, R)
  root = str(tmp_path / "root")
  _synthetic_root(root, seeds=(0,), arms=(PILOT,), pilot_gain=0.04)       # the pilot moved 4 points: too little
  assert R.main([f"--root={root}", "--dry_run"]) == GATE_FAILED
  out = capsys.readouterr().out
  assert "pilot same_tok: gain in accuracy (seed 0) = 0.04 (>= 0.1): FAIL" in out
  assert "calibration gate FAILED" in out and "configs/xtok_opd.py:aligned" not in out     # no arm launched
  gate = read_gate(root)
  assert not gate["passed"] and [c["passed"] for c in gate["checks"]] == [True, True, True, True, False, True]


def test_gate_archive_and_summary_of_a_synthetic_run(tmp_path, capsys, monkeypatch):
  no_training(monkeypatch, R)
  root, archive = str(tmp_path / "root"), str(tmp_path / "archive")
  _synthetic_root(root)
  assert R.main([f"--root={root}", f"--archive={archive}"]) == 0
  assert read_gate(archive)["passed"]
  names = sorted(os.listdir(archive))
  assert len([n for n in names if n.endswith(("_s0", "_s1", "_s2"))]) == 3 * (len(R.BASES) + len(ARMS))
  assert {"gate.json", "runs.jsonl"} <= set(names)
  capsys.readouterr()
  S.main([f"--root={archive}", f"--out={tmp_path / 'curves.png'}"])
  out = capsys.readouterr().out
  assert "Calibration gate: **passed**" in out
  assert "| 0 | 0.900 | 0.950 | 0.250 | 0.250 |" in out
  rows = {line.split(" | ")[0][2:]: line for line in out.splitlines() if line.startswith("| ") and " - " in line}
  assert rows["aligned - spans"].endswith("| aligned > spans |") and rows["both - aligned"].endswith("both > aligned |")
  assert "| same_tok | 0,1,2 | +21.0 (+20.0-+22.0) |" in out          # gain over its own student
  assert "at each evaluation" in out and "| aligned | 0.250 |" in out   # curves start at step 0: the student
  assert os.path.exists(tmp_path / "curves.png")
