"""experiments/driver.py: which workdirs a driver skips as finished (and the summaries mark done)."""
import json

from experiments.driver import finished, stage_done


def _config(**sft):
  return {"stages": ["sft"], "sft": {"kind": "sft", "steps": 300, "stop_at_loss": 0.0, **sft}}


def _rows(evals, ema=None):
  train = [{"stage": "sft", "step": s, "loss": 1.0, "step_s": 0.1, **({"loss_ema": ema(s)} if ema else {})}
           for s in range(1, max(evals) + 1)]
  return train + [{"stage": "sft", "step": s, "eval/accuracy": 0.5} for s in evals]


def test_an_sft_stage_that_evaluates_along_the_way_is_finished_only_at_its_end():
  """An interrupted SFT stage with eval_every has evaluations too; it used to count as finished (the rule was
  'an SFT stage has evaluated'), so a driver skipped it and summaries used its mid-run numbers."""
  config = _config(eval_every=100)
  assert not stage_done(config, _rows([100, 200]))
  assert stage_done(config, _rows([100, 200, 300]))
  assert not stage_done(config, [])


def test_an_sft_stage_that_stopped_at_its_loss_threshold_is_finished():
  config = _config(stop_at_loss=0.6)
  assert stage_done(config, _rows([140], ema=lambda s: 0.59 if s == 140 else 0.9))     # stopped at step 140
  config["sft"]["eval_every"] = 100
  assert not stage_done(config, _rows([100], ema=lambda s: 0.9))                       # interrupted after 100


def test_a_later_stage_counts_global_steps(tmp_path):
  config = {"stages": ["sft", "distill"], "sft": {"kind": "sft", "steps": 10},
            "distill": {"kind": "distill", "steps": 50}}
  rows = [{"stage": "sft", "step": 10, "eval/accuracy": 0.2}, {"stage": "distill", "step": 10, "eval/accuracy": 0.2},
          {"stage": "distill", "step": 40, "eval/accuracy": 0.3}]
  assert not stage_done(config, rows)
  rows.append({"stage": "distill", "step": 60, "eval/accuracy": 0.4})
  assert stage_done(config, rows)
  (tmp_path / "config.json").write_text(json.dumps(config))
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + "\n")
  assert finished(str(tmp_path)) and not finished(str(tmp_path / "nowhere"))
