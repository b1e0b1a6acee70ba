"""experiments/slca_grpo: every preset validates (`launch.py --validate_only`) against a stand-in base whose BPE
tokenizer splits digits as the real base's does, and its turn budgets hold the longest episode; the arms differ
only in the advantage estimator and the judge's noise; the driver runs the gate, checks it and the budget, and
stops before any arm when either fails (training stubbed: every workdir written by hand); summarize.py renders
results.md, the three verdicts computed from the numbers, and the plot, from the runs or their archive."""
import json
import os

import pytest

from configs import slca_grpo as cfg_module
from configs.slca_grpo import ARMS, GATE, NOISES, STEPS, WINDOW, arm_name
from experiments.slca_grpo import run as driver
from experiments.slca_grpo import summarize
from tests.cli_in_process import launch_in_process
from rlkit.cli import changed_keys
from tests.experiments.workdirs import no_training, stand_in_model, write_workdir


@pytest.fixture(scope="module")
def stand_in_base(tmp_path_factory):
  """A Hugging Face folder like experiments/base/model, in seconds: a digit-split BPE tokenizer of the tool task's
  demonstrations (as the base's corpus had them) and a one-layer Qwen3-shaped model of its vocabulary."""
  from rlkit.data.splits import generate_splits
  from rlkit.data.tasks import make_task
  from rlkit.models.bpe import bpe_tokenizer
  folder = tmp_path_factory.mktemp("base")
  task = make_task("tool_calls", max_digits=cfg_module.MAX_DIGITS)
  texts = [r["prompt"] + task.demonstration(r) for r in generate_splits(task, 300, 10, 0)["train"]]
  tok = bpe_tokenizer(texts, 300, folder=str(folder / "tokenizer"), split_digits=True)
  return stand_in_model(folder, tok)


def _differ(a: str, b: str) -> set:
  return set(changed_keys(cfg_module.get_config(a).to_dict(), cfg_module.get_config(b).to_dict()))


def test_every_preset_validates_from_the_base(stand_in_base, tmp_path):
  for preset in cfg_module.PRESETS:
    c = cfg_module.get_config(preset)
    assert c.model.path == cfg_module.BASE_MODEL and c.tokenizer.kind == "hf"
    code, out, err = launch_in_process(f"--config=configs/slca_grpo.py:{preset}", f"--workdir={tmp_path / preset}",
                                       f"--config.model.path={stand_in_base}", "--validate_only")
    assert code == 0, (preset, out, err)
  assert not any(os.listdir(tmp_path))                       # --validate_only writes nothing


def test_the_arms_differ_only_where_they_should():
  assert list(ARMS) == [arm_name(k, n) for n in NOISES for k in ("grpo", "slca")] and "slca_n1.5" in ARMS
  for noise in NOISES:
    assert _differ(arm_name("grpo", noise), arm_name("slca", noise)) == {"rl.advantage"}
    if noise:
      assert _differ(arm_name("grpo", 0.0), arm_name("grpo", noise)) == {"rl.reward.kwargs.judge_noise"}
  assert _differ("gate", arm_name("grpo", 0.0)) == {"rl.steps", "rl.optimizer.frozen", "rl.eval_every"}
  c = cfg_module.get_config("slca_n1.5")
  assert (c.rl.advantage, c.rl.slca.kinds, c.rl.slca.weights, c.rl.reward.kwargs.judge_noise) == (
      "slca", "tool_call,summary", "1.0,1.0", 1.5)
  assert cfg_module.get_config("grpo_n0.5").rl.advantage == "group"
  assert (c.task.kwargs.max_digits, c.rl.multi_turn.max_turns, c.rl.prompts_per_step, c.rl.group_size,
          c.rl.steps) == (4, 2, 8, 8, STEPS)
  c.seed = 7                                                 # --config.seed=7: the judge follows the run's seed
  assert c.rl.reward.kwargs.judge_seed == 7 and c.to_dict()["rl"]["reward"]["kwargs"]["judge_seed"] == 7
  c.rl.reward.kwargs.judge_seed = 3                          # an explicit judge seed leaves the run's alone
  assert (c.seed, c.rl.reward.kwargs.judge_seed) == (7, 3)
  gate = cfg_module.get_config("gate")
  assert (gate.rl.steps, gate.rl.reward.kwargs.judge_noise, gate.rl.advantage) == (GATE["steps"], 0.0, "group")


def test_the_budgets_hold_the_longest_episode(stand_in_base):
  from rlkit.train.models import tokenizer_from_spec
  tok = tokenizer_from_spec({"kind": "hf", "path": stand_in_base})
  c = cfg_module.get_config("slca_n0")
  call, result = "<call>mul(9999,9999)</call>", f"<result>{9999 * 9999}</result>"
  say = f"<say>9999 times 9999 is {9999 * 9999}.</say>"
  n = {text: len(tok.encode(text)) for text in (call, result, say)}
  assert n[call] <= c.rl.multi_turn.turn_tokens and n[say] + 1 <= c.rl.multi_turn.turn_tokens   # + the end token
  assert n[call] + n[result] + n[say] + 1 <= c.rl.max_new_tokens
  assert n[call] <= c.eval.max_new_tokens                    # the single-turn evaluation grades the call
  assert len(tok.encode("What is 9999 times 9999?\n")) + 1 <= c.data.max_prompt_len   # + BOS


# ---------------------------------------------------------------------------------------------------------------
# Synthetic workdirs: the driver never trains, the summary reads what a run leaves.

def _curve(first: float, final: float, steps: int = STEPS):
  """Call accuracy `first` over the first WINDOW iterations, `final` over the last WINDOW, linear between."""
  mid = steps - 2 * WINDOW
  return [first] * WINDOW + [first + (final - first) * (i + 1) / (mid + 1) for i in range(mid)] + [final] * WINDOW


def _run(path, calls, steps, summary_rule=0.5, eval_every=20, start_eval=0.3):
  rows = [{"stage": "rl", "step": 1, "at_stage_start": True, "eval/accuracy": start_eval}]
  for s, x in enumerate(calls, 1):
    rows.append({"stage": "rl", "step": s, "step_s": 1.0, "reward": x + summary_rule, "reward/execution": x,
                 "reward/summary_rule": summary_rule, "reward/summary": summary_rule, "reward/penalty": 0.0,
                 "informative_groups": 0.5, "accuracy": x * summary_rule, "grad_norm": 1.0})
    if s % eval_every == 0 or s == steps:
      rows.append({"stage": "rl", "step": s, "eval/accuracy": x})
  write_workdir(path, {"stages": ["rl"], "rl": {"steps": steps}}, rows)


def _gate(root, call=0.5, summary_rule=0.4, wall=60.0):
  with open(os.path.join(root, "runs.jsonl"), "a") as f:
    for seed, path in zip(GATE["seeds"], driver.gate_paths(root)):
      _run(path, [call] * GATE["steps"], GATE["steps"], summary_rule)
      f.write(json.dumps({"name": "gate", "seed": seed, "workdir": path, "rc": 0, "wall_s": wall, "commit": "abc1234"})
              + "\n")


# (first, final) call accuracy per arm: SLCA holds up under noise, GRPO's gain falls (every hypothesis holds).
CURVES = {"grpo_n0": (0.4, 0.7), "slca_n0": (0.4, 0.71), "grpo_n0.5": (0.4, 0.6), "slca_n0.5": (0.4, 0.68),
          "grpo_n1.5": (0.4, 0.5), "slca_n1.5": (0.4, 0.65)}


def _arms(root, curves=CURVES, seeds=(0, 1, 2)):
  for arm, (first, final) in curves.items():
    for seed in seeds:
      _run(os.path.join(root, f"{arm}_s{seed}"), _curve(first, final + 0.01 * seed), STEPS)


def test_gate_checks_each_bound():
  def failed(**measured):
    return [c.name.split()[0] for c in driver.gate_checks(measured) if not c.passed]
  assert failed(call_accuracy=0.5, summary_rule=0.4) == []
  assert failed(call_accuracy=0.9, summary_rule=0.4) == ["G1"]           # no room to learn
  assert failed(call_accuracy=0.1, summary_rule=0.4) == ["G1"]           # nothing to reinforce
  assert failed(call_accuracy=0.5, summary_rule=0.2) == ["G2"]
  assert failed() == ["G1", "G2"]                                        # values the runs did not log fail


def test_a_failed_gate_stops_the_driver_before_any_arm(tmp_path, capsys, monkeypatch):
  root, dest = str(tmp_path / "runs"), str(tmp_path / "archive")
  os.makedirs(root)
  _gate(root, call=0.95)                     # the base already calls right: no room to learn (G1)
  no_training(monkeypatch, driver)           # an arm launch would train: the test fails there
  assert driver.main([f"--root={root}", f"--archive={dest}"]) == driver.GATE_FAILED
  out = capsys.readouterr().out
  assert "FAILED: no arm runs" in out and ":grpo_n0 " not in out
  gate = json.load(open(os.path.join(dest, "gate.json")))
  assert gate["passed"] is False and [c["passed"] for c in gate["checks"]] == [False, True]
  assert gate["measured"]["call_accuracy"] == pytest.approx(0.95) and gate["measured"]["iterations"] == 9
  assert sorted(os.listdir(dest)) == ["gate.json", "gate_s0", "gate_s1", "gate_s2", "runs.jsonl"]
  summarize.main([f"--root={dest}"])
  assert summarize.NOT_TESTED in capsys.readouterr().out


def test_the_gate_runs_then_every_arm_and_the_archive_reads_like_the_runs(tmp_path, capsys, monkeypatch):
  root, dest = str(tmp_path / "runs"), str(tmp_path / "archive")
  assert driver.main([f"--root={root}", "--dry_run", "--seeds=0", "--model=/some/base"]) == 0
  out = capsys.readouterr().out
  for seed in GATE["seeds"]:                 # the gate is pooled over its own seeds, whatever --seeds says
    assert f"configs/slca_grpo.py:gate --workdir={root}/gate_s{seed} --config.seed={seed}" in out
  assert out.index(":gate ") < out.index("the gate and the budget are checked here") < out.index(":grpo_n0 ")
  for arm in ARMS:
    assert f"configs/slca_grpo.py:{arm} --workdir={root}/{arm}_s0 --config.seed=0 --config.model.path=/some/base" in out
  _gate(root)
  _arms(root)
  no_training(monkeypatch, driver)
  assert driver.main([f"--root={root}", f"--archive={dest}"]) == 0
  out = capsys.readouterr().out
  assert "calibration gate passed" in out and out.count("finished, skipped") == 3 + 3 * len(ARMS)
  gate = json.load(open(os.path.join(dest, "gate.json")))
  # 3 gate runs of 60 s; each arm a gate run, 57 more iterations of 1 s and 2 more evaluations.
  per_arm = 60.0 - GATE["steps"] + STEPS + 2 * driver.EVAL_S
  assert gate["budget"]["minutes"] == pytest.approx((180 + 18 * per_arm) / 60)
  assert sorted(os.listdir(dest)) == sorted(["gate.json", "runs.jsonl", *(f"gate_s{s}" for s in range(3)),
                                             *(f"{a}_s{s}" for a in ARMS for s in range(3))])
  summarize.main([f"--root={root}", f"--out={tmp_path / 'a'}"])
  from_runs = capsys.readouterr().out
  summarize.main([f"--root={dest}", f"--out={tmp_path / 'b'}"])
  from_archive = capsys.readouterr().out.replace(dest, root).replace(str(tmp_path / "b"), str(tmp_path / "a"))
  assert from_archive == from_runs and "**supported**" in from_runs


def test_over_budget_stops_before_any_arm_unless_told(tmp_path, capsys, monkeypatch):
  root = str(tmp_path / "runs")
  os.makedirs(root)
  _gate(root, wall=600.0)                    # 10 minutes a gate run: 18 arms cannot fit 90 minutes
  no_training(monkeypatch, driver)
  assert driver.main([f"--root={root}", "--archive="]) == driver.BUDGET_EXCEEDED
  out = capsys.readouterr().out
  assert "over budget: no arm runs" in out and "STEPS that fit: 0" in out   # not even 2 windows fit
  _arms(root)
  assert driver.main([f"--root={root}", "--archive=", "--ignore_budget"]) == 0
  b = driver.budget(root, 1.0)
  assert b["minutes"] > cfg_module.BUDGET_MINUTES


def test_budget_gives_the_steps_that_fit(tmp_path):
  root = str(tmp_path)
  _gate(root, wall=30.0)
  b = driver.budget(root, 2.0)
  per_arm = 30.0 + (STEPS - GATE["steps"]) * 2.0 + 2 * driver.EVAL_S
  assert b["minutes"] == pytest.approx((90 + 18 * per_arm) / 60)
  fit = b["steps_that_fit"]
  assert fit > STEPS and fit % WINDOW == 0
  assert driver.budget(root, 2.0, fit)["minutes"] <= 90 < driver.budget(root, 2.0, fit + WINDOW)["minutes"]
  assert driver.budget(str(tmp_path / "none"), 2.0)["steps_that_fit"] is None     # no gate walls: not measured


def _verdicts(out: str) -> dict:
  return {line.split(":")[0].lstrip("| "): line.rstrip(" |").rsplit("**", 2)[-2]
          for line in out.splitlines() if line.startswith("| H")}


def test_summary_renders_results_and_verdicts_from_the_numbers(tmp_path, capsys):
  root = str(tmp_path / "runs")
  os.makedirs(root)
  _gate(root)
  driver.record_gate(root, "slca_grpo", driver.gate_checks(driver.gate_measure(driver.gate_paths(root))))
  _arms(root)
  summarize.main([f"--root={root}"])
  out = capsys.readouterr().out
  assert _verdicts(out) == {"H1": "supported", "H2 (control)": "supported", "H3": "supported"}
  text = open(os.path.join(root, "results.md")).read()
  assert "Calibration gate: **passed**" in text and "- Pre-registration: commit `" in text
  assert "- Runs: commit(s) `abc1234`; 3 command(s), 3.0 wall minutes in all" in text
  assert "SLCA - GRPO per seed +0.150, +0.150, +0.150; mean +0.150" in text
  assert "| slca_n1.5 | 0,1,2 | 0.400 (0.400-0.400) | 0.660 (0.650-0.670) | 0.260 (0.250-0.270) |" in text
  assert "| grpo_n1.5 | 2 | 0.400 | 0.520 | 0.120 | 0.500 | 0.520 |" in text
  assert "None recorded" in text and (tmp_path / "runs" / "calls.png").exists()
  # GRPO ahead at noise 1.5 on two seeds, SLCA's gain collapsing with noise, a gap at noise 0 beyond the spread.
  other = str(tmp_path / "other")
  os.makedirs(other)
  _arms(other, {**CURVES, "slca_n1.5": (0.4, 0.49), "slca_n0": (0.4, 0.9)})
  with open(os.path.join(other, "changes.md"), "w") as f:
    f.write("STEPS 60 -> 50 before any arm ran (the gate's timing).")
  summarize.main([f"--root={other}", f"--out={tmp_path / 'o'}"])
  out = capsys.readouterr().out
  assert _verdicts(out) == {"H1": "not supported", "H2 (control)": "not supported", "H3": "not supported"}
  assert "STEPS 60 -> 50" in open(tmp_path / "o" / "results.md").read()
  # A seed short: nothing is judged on two seeds.
  summarize.main([f"--root={root}", "--seeds=0,1,2,3", f"--out={tmp_path / 'x'}"])
  assert set(_verdicts(capsys.readouterr().out).values()) == {"incomplete"}
