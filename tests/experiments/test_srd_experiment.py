"""experiments/srd: every preset validates (`launch.py --validate_only`) against a stand-in base whose BPE is trained
on the base's own corpus (so it spells the key-door text as the base's tokenizer does), and the token sizes
configs/srd.py states and its budgets hold; the arms differ only in the SRD term and the hindsight; G2's scoring of
the demonstrations runs on the stand-in (zero gain with an empty hindsight block); the driver runs the gate, checks
it (G1, G2) and the budget, and stops before any arm when either fails (training stubbed: every workdir written by
hand); summarize.py renders results.md, the three verdicts computed from the numbers, and the plot, from the runs or
their archive."""
import json
import math
import os

import pytest

from configs import srd as cfg_module
from configs.srd import ARMS, GATE, STEPS, WINDOW
from experiments.srd import run as driver
from experiments.srd import summarize
from tests.cli_in_process import launch_in_process
from rlkit.cli import changed_keys
from tests.experiments.workdirs import no_training, stand_in_model, write_workdir


@pytest.fixture(scope="module")
def stand_in_base(tmp_path_factory):
  """A Hugging Face folder like experiments/base/model, in a second: the base's BPE recipe (experiments/base/build.py)
  on 2,000 examples of its corpus, which never held this task, and a one-layer Qwen3-shaped model of its vocabulary."""
  from experiments.base.build import VOCAB_SIZE, corpus_texts
  from experiments.base.config import get_config
  from rlkit.models.bpe import save_tokenizer_folder, train_bpe
  from rlkit.models.tokenizer import HFTokenizer
  folder = tmp_path_factory.mktemp("base")
  save_tokenizer_folder(train_bpe(corpus_texts(get_config("base"), 2000), VOCAB_SIZE, split_digits=True),
                        str(folder / "tokenizer"))
  tok = HFTokenizer(str(folder / "tokenizer"))
  return stand_in_model(folder, tok)


def _differ(a: str, b: str) -> set:
  return set(changed_keys(cfg_module.get_config(a).to_dict(), cfg_module.get_config(b).to_dict()))


def test_every_preset_validates_from_the_base(stand_in_base, tmp_path, tmp_path_factory):
  rows = driver.write_sft_rows(str(tmp_path_factory.mktemp("rows") / "sft_rows.jsonl"))
  for preset in cfg_module.PRESETS:
    c = cfg_module.get_config(preset)
    assert c.model.path == cfg_module.BASE_MODEL and c.tokenizer.kind == "hf"
    extra = [f"--config.data.train_jsonl={rows}"] if preset == "sft" else []
    code, out, err = launch_in_process(f"--config=configs/srd.py:{preset}", f"--workdir={tmp_path / preset}",
                                       f"--config.model.path={stand_in_base}", "--validate_only", *extra)
    assert code == 0, (preset, out, err)
  code, out, err = launch_in_process("--config=configs/srd.py:srd", f"--workdir={tmp_path / 'short'}",
                                     f"--config.model.path={stand_in_base}", "--validate_only",
                                     f"--config.data.max_prompt_len={cfg_module.PROMPT_TOKENS - 1}")
  assert code != 0 and f"{cfg_module.PROMPT_TOKENS} tokens" in out + err   # the limit is measured, not padded
  assert not any(os.listdir(tmp_path))                       # --validate_only writes nothing


def test_the_arms_differ_only_where_they_should():
  from rlkit.agents.keydoor import KeyDoorEnv
  assert list(ARMS) == ["grpo", "srd", "srd_shuffled"] and list(cfg_module.PRESETS) == ["sft", "gate", *ARMS]
  assert _differ("grpo", "srd") == {"rl.loss_terms.srd_jsd"}
  assert _differ("srd", "srd_shuffled") == {"rl.srd.hindsight"}
  assert _differ("gate", "srd") == {"rl.steps", "rl.optimizer.frozen"}
  c = cfg_module.get_config("srd")
  assert (dict(c.rl.loss_terms), c.rl.srd.hindsight, c.rl.srd.weight_hi, c.rl.srd.weight_lo, c.rl.advantage) == (
      {"srd_jsd": 1.0}, "episode", 1.0, 0.1, "group")
  assert dict(cfg_module.get_config("grpo").rl.loss_terms) == {}
  assert cfg_module.get_config("srd_shuffled").rl.srd.hindsight == "shuffled"
  assert (c.task.name, c.task.kwargs.n_rooms, c.task.kwargs.max_actions, c.task.kwargs.hidden_keys,
          c.rl.multi_turn.max_turns, c.rl.prompts_per_step, c.rl.group_size, c.rl.steps, c.rl.optimizer.lr) == (
      "key_door", 4, 11, True, 11, 4, 8, STEPS, cfg_module.LR)
  assert cfg_module.MAX_ACTIONS == c.rl.multi_turn.env_kwargs.max_actions == 3 * (cfg_module.N_ROOMS - 1) + 2
  assert (c.eval.num_examples, c.eval.batch_size, c.data.num_train + c.data.num_test) == (1, 1, 12)
  sft = cfg_module.get_config("sft")
  assert (sft.stages, sft.task.name, sft.sft.steps, sft.sft.turn_pattern, sft.model.path) == (
      ("sft",), "jsonl", cfg_module.SFT["steps"], cfg_module.SFT["turn_pattern"], cfg_module.BASE_MODEL)
  gate = cfg_module.get_config("gate")
  assert (gate.rl.steps, gate.rl.optimizer.frozen, dict(gate.rl.loss_terms)) == (GATE["steps"], ".", {"srd_jsd": 1.0})
  with pytest.raises(ValueError, match="Unknown preset"):
    cfg_module.get_config("nope")


def test_the_token_sizes_and_the_budgets_hold(stand_in_base):
  from rlkit.train.models import tokenizer_from_spec
  sizes = driver.token_sizes(tokenizer_from_spec({"kind": "hf", "path": stand_in_base}))
  assert sizes == {"prompt": cfg_module.PROMPT_TOKENS, "prompt_min": 161, "action": cfg_module.ACT_TOKENS,
                   "demonstration": cfg_module.DEMO_TOKENS, "success": cfg_module.SUCCESS_TOKENS, "success_spelt": 627,
                   "episode": cfg_module.EPISODE_TOKENS, "hindsight": cfg_module.HINDSIGHT_TOKENS}
  c = cfg_module.get_config("srd")
  assert sizes["prompt"] <= c.data.max_prompt_len and sizes["action"] <= c.rl.multi_turn.turn_tokens
  assert sizes["demonstration"] <= sizes["success_spelt"] <= sizes["success"] <= c.rl.max_new_tokens
  assert len(driver.layouts()) == 144 and len({r["prompt"] for r in driver.world_rows()}) == 12


def test_hindsight_gain_scores_every_demonstration(stand_in_base, monkeypatch):
  from rlkit.train import srd as srd_module
  from rlkit.train.models import tokenizer_from_spec
  tok = tokenizer_from_spec({"kind": "hf", "path": stand_in_base})
  acts = sum(len(tok.encode(text)) for row in driver.world_rows() for text, is_act in driver.segments(row) if is_act)
  monkeypatch.setattr(srd_module, "episode_text", lambda example, field: "")   # no block: the teacher is the student
  g = driver.hindsight_gain(stand_in_base)
  assert (g["gain"], g["layouts_gaining"], g["action_tokens"], g["layouts"]) == (0.0, 0.0, acts, 144)
  assert -20 < g["student_logp"] == g["teacher_logp"] < 0
  # Blind takes: door 1's key in room 0 (keys[1] = 0) and door 2's in room 0 or 1: 7 of every 6 key placements.
  assert (g["blind_gain"], g["blind_actions"]) == (0.0, 24 * 7)
  assert all(r["layout"]["hidden_keys"] and "A key is here." in r["prompt"] for r in driver.world_rows())
  arms = driver.arm_rows()
  on_arms = driver.hindsight_gain(stand_in_base, rows=arms)                    # the gate's G2: the arms' worlds
  assert on_arms["layouts"] == len(arms) and on_arms["blind_actions"] == sum(
      (r["layout"]["keys"][1] == 0) + (r["layout"]["keys"][2] < 2) for r in arms)
  first = driver.hindsight_gain(stand_in_base, False, driver.world_rows(3, 8, hidden_keys=False), 3)
  assert (first["layouts"], first["blind_actions"]) == (24, 12)                 # the first design's measurement


def test_the_sft_rows_read_on_worlds_no_arm_plays():
  arms = driver.arm_rows()
  assert len({r["prompt"] for r in arms}) == 12 and len(arms) > 12          # every prompt, one layout per seed
  rows = driver.sft_rows()
  plain, read = [r for r in rows if r["kind"] == "plain"], [r for r in rows if r["kind"] == "hindsight"]
  assert len(plain) == 3 * cfg_module.PLAIN_COPIES and len({r["prompt"] for r in plain}) == 3
  assert len(read) == 144 - len(arms) and all("<hindsight>The way was: " in r["prompt"] for r in read)
  played = {r["prompt"] + driver.hindsight_block(r["answer"]) for r in arms}
  assert not played & {r["prompt"] for r in read}                              # no arm's world is read in SFT
  assert all(r["solution"].startswith("<act>") and r["solution"].endswith("<obs>You reached the goal.</obs>")
             for r in rows)


def test_blind_takes_are_the_keys_of_doors_further_east():
  layout = {"doors": ["red", "blue", "green"], "keys": [0, 0, 2]}
  assert [driver.blind_take(f"<act>take {c} key</act>", layout) for c in ("red", "blue", "green", "yellow")] == [
      False, True, False, False]
  assert not driver.blind_take("<act>open blue door</act>", layout)


# ---------------------------------------------------------------------------------------------------------------
# Synthetic workdirs: the driver never trains, the summary reads what a run leaves.

def _curve(first: float, final: float, steps: int = STEPS):
  """Success `first` over the first WINDOW iterations, `final` over the last WINDOW (linear between)."""
  mid = steps - 2 * WINDOW
  return [first] * WINDOW + [first + (final - first) * (i + 1) / (mid + 1) for i in range(mid)] + [final] * WINDOW


def _run(path, success, steps, srd=True, zero_var=3, grad_zero=0.0):
  """A finished run: its first `zero_var` iterations have every group of zero variance (informative_groups 0),
  with grad_norm `grad_zero` there (an SRD run's: 0.01)."""
  rows = [{"stage": "rl", "step": 1, "at_stage_start": True, "eval/accuracy": 0.0}]
  for s, x in enumerate(success, 1):
    flat = s <= zero_var
    row = {"stage": "rl", "step": s, "step_s": 1.0, "reward": x, "reward/success": x, "accuracy": x,
           "reward/invalid_actions": 1.0, "informative_groups": 0.0 if flat else 0.25, "collect/turns": 256,
           "collect/episodes": 64, "grad_norm": (0.01 if srd else grad_zero) if flat else 0.5, "loss": 0.1}
    if srd:
      row.update({"srd/gap": -0.05, "srd/jsd": 0.02, "srd/zero_variance_frac": 1.0 if flat else 0.75})
    rows.append(row)
  rows.append({"stage": "rl", "step": steps, "eval/accuracy": 0.0})
  write_workdir(path, {"stages": ["rl"], "rl": {"steps": steps}}, rows)


def _gate(root, success=0.0, wall=60.0):
  with open(os.path.join(root, "runs.jsonl"), "a") as f:
    for seed, path in zip(GATE["seeds"], driver.gate_paths(root)):
      _run(path, [success] * GATE["steps"], GATE["steps"], zero_var=GATE["steps"])
      f.write(json.dumps({"name": "gate", "seed": seed, "workdir": path, "rc": 0, "wall_s": wall, "commit": "abc1234"})
              + "\n")


GAIN = {"gain": 0.01, "student_logp": -0.04, "teacher_logp": -0.03, "action_tokens": 4000, "layouts": 33,
        "layouts_gaining": 0.6, "blind_gain": 0.8, "blind_actions": 38}


@pytest.fixture
def g2(monkeypatch):
  """The driver's G2 measurement, stubbed (the real one needs the SFT policy): returns GAIN updated by the test."""
  measured = dict(GAIN)
  monkeypatch.setattr(driver, "hindsight_gain", lambda model, **kw: dict(measured))
  return measured


def _sft(root):
  """A finished SFT workdir (the driver skips it) and its wall record."""
  path = os.path.join(root, "sft_s0")
  write_workdir(path, {"stages": ["sft"], "sft": {"steps": 2}},
                [{"stage": "sft", "step": 1, "loss": 1.0, "step_s": 1.0}, {"stage": "sft", "step": 2, "loss": 0.5,
                                                                          "step_s": 1.0},
                 {"stage": "sft", "step": 2, "eval/accuracy": 0.0}])
  with open(os.path.join(root, "runs.jsonl"), "a") as f:
    f.write(json.dumps({"name": "sft", "seed": 0, "workdir": path, "rc": 0, "wall_s": 700.0, "commit": "abc1234"})
            + "\n")


# (first, final) success per arm: SRD gets off the plateau, GRPO and the shuffled control do not.
CURVES = {"grpo": (0.0, 0.02), "srd": (0.0, 0.3), "srd_shuffled": (0.0, 0.05)}


def _arms(root, curves=CURVES, seeds=(0, 1, 2), grad_zero=0.0):
  for arm, (first, final) in curves.items():
    for seed in seeds:
      _run(os.path.join(root, f"{arm}_s{seed}"), _curve(first, final + 0.01 * seed), STEPS, srd=arm != "grpo",
           grad_zero=grad_zero)


def test_gate_checks_each_bound():
  def failed(**measured):
    return [c.name.split()[0] for c in driver.gate_checks(measured) if not c.passed]
  ok = {"success": 0.0, "hindsight_blind_gain": 0.8, "turns_per_episode": 6.0}
  assert failed(**ok) == []
  assert failed(success=0.2, hindsight_blind_gain=0.5, turns_per_episode=2.0) == []   # every bound inclusive
  assert failed(**{**ok, "success": 0.25}) == ["G1"]                  # not SRD's all-fail regime
  assert failed(**{**ok, "hindsight_blind_gain": 0.3}) == ["G2"]      # the policy does not read the hindsight
  assert failed(**{**ok, "hindsight_blind_gain": -0.4}) == ["G2"]
  assert failed(**{**ok, "turns_per_episode": 1.0}) == ["G3"]         # the policy does not act
  assert failed() == ["G1", "G2", "G3"]                               # values never measured fail


def test_a_failed_gate_stops_the_driver_before_any_arm(tmp_path, capsys, monkeypatch, g2):
  root, dest = str(tmp_path / "runs"), str(tmp_path / "archive")
  os.makedirs(root)
  _sft(root)
  _gate(root)
  g2["blind_gain"] = 0.2                     # the policy barely reads the hindsight (G2)
  no_training(monkeypatch, driver)           # an arm launch would train: the test fails there
  assert driver.main([f"--root={root}", f"--archive={dest}", "--model=/some/base"]) == driver.GATE_FAILED
  out = capsys.readouterr().out
  assert "FAILED: no arm runs" in out and ":grpo " not in out
  gate = json.load(open(os.path.join(dest, "gate.json")))
  assert gate["passed"] is False and [c["passed"] for c in gate["checks"]] == [True, False, True]
  m = gate["measured"]
  assert (m["success"], m["zero_variance_share"], m["iterations"], m["hindsight_blind_gain"]) == (0.0, 1.0, 9, 0.2)
  assert (m["turns_per_episode"], m["srd_gap"], m["srd_zero_variance_frac"]) == (4.0, -0.05, 1.0)
  assert sorted(os.listdir(dest)) == ["gate.json", "gate_s0", "gate_s1", "gate_s2", "runs.jsonl", "sft_s0"]
  assert os.path.exists(os.path.join(root, "sft_rows.jsonl"))     # the rows the SFT run read, beside it
  summarize.main([f"--root={dest}"])
  assert summarize.NOT_TESTED in capsys.readouterr().out


def test_the_gate_runs_then_every_arm_and_the_archive_reads_like_the_runs(tmp_path, capsys, monkeypatch, g2):
  root, dest = str(tmp_path / "runs"), str(tmp_path / "archive")
  assert driver.main([f"--root={root}", "--dry_run", "--seeds=0", "--model=/some/base"]) == 0
  out = capsys.readouterr().out
  sft = f"{root}/sft_s0"                     # the SFT from --model, then every run from the SFT policy
  assert (f"configs/srd.py:sft --workdir={sft} --config.seed=0 --config.data.train_jsonl={root}/sft_rows.jsonl "
          f"--config.data.test_jsonl={root}/sft_rows.test.jsonl --config.model.path=/some/base") in out
  for seed in GATE["seeds"]:                 # the gate is pooled over its own seeds, whatever --seeds says
    assert f"configs/srd.py:gate --workdir={root}/gate_s{seed} --config.seed={seed} --config.model.path={sft}" in out
  assert out.index(":sft ") < out.index(":gate ") < out.index("the gate and the budget are checked here") < out.index(
      ":grpo ")
  for arm in ARMS:
    assert f"configs/srd.py:{arm} --workdir={root}/{arm}_s0 --config.seed=0 --config.model.path={sft}" in out
  os.makedirs(root, exist_ok=True)
  _sft(root)
  _gate(root)
  _arms(root)
  no_training(monkeypatch, driver)
  assert driver.main([f"--root={root}", f"--archive={dest}"]) == 0
  out = capsys.readouterr().out
  assert "calibration gate passed" in out and out.count("finished, skipped") == 1 + 3 + 3 * len(ARMS)
  gate = json.load(open(os.path.join(dest, "gate.json")))
  # 3 gate runs of 60 s; each arm a gate run, 17 more iterations of 1 s and one more checkpoint.
  per_arm = 60.0 - GATE["steps"] + STEPS + driver.CHECKPOINT_S
  assert gate["budget"]["minutes"] == pytest.approx((180 + 9 * per_arm) / 60)
  assert sorted(os.listdir(dest)) == sorted(["gate.json", "runs.jsonl", "sft_s0", *(f"gate_s{s}" for s in range(3)),
                                             *(f"{a}_s{s}" for a in ARMS for s in range(3))])
  summarize.main([f"--root={root}", f"--out={tmp_path / 'a'}"])
  from_runs = capsys.readouterr().out
  summarize.main([f"--root={dest}", f"--out={tmp_path / 'b'}"])
  from_archive = capsys.readouterr().out.replace(dest, root).replace(str(tmp_path / "b"), str(tmp_path / "a"))
  assert from_archive == from_runs and "**supported**" in from_runs


def test_over_budget_stops_before_any_arm_unless_told(tmp_path, capsys, monkeypatch, g2):
  root = str(tmp_path / "runs")
  os.makedirs(root)
  _sft(root)
  _gate(root, wall=600.0)                    # 10 minutes a gate run: 9 arms cannot fit the budget
  no_training(monkeypatch, driver)
  assert driver.main([f"--root={root}", "--archive="]) == driver.BUDGET_EXCEEDED
  out = capsys.readouterr().out
  assert "over budget: no arm runs" in out and "STEPS that fit: 0" in out and "configs/srd.py" in out
  _arms(root)
  assert driver.main([f"--root={root}", "--archive=", "--ignore_budget"]) == 0
  b = driver.budget(root, 1.0)
  assert b["minutes"] > cfg_module.BUDGET_MINUTES
  fit = driver.budget(str(tmp_path / "cheap"), 1.0)
  assert fit["steps_that_fit"] is None                        # no gate walls: not measured


def _verdicts(out: str) -> dict:
  return {line.split(":")[0].lstrip("| "): line.rstrip(" |").rsplit("**", 2)[-2]
          for line in out.splitlines() if line.startswith("| H")}


def test_summary_renders_results_and_verdicts_from_the_numbers(tmp_path, capsys):
  root = str(tmp_path / "runs")
  os.makedirs(root)
  _gate(root)
  driver.record_gate(root, "srd", driver.gate_checks({"success": 0.0, "hindsight_blind_gain": 0.8,
                                                       "turns_per_episode": 6.0}))
  _arms(root)
  summarize.main([f"--root={root}"])
  out = capsys.readouterr().out
  assert _verdicts(out) == {"H1": "supported", "H2 (control)": "supported", "H3 (mechanical)": "supported"}
  text = open(os.path.join(root, "results.md")).read()
  assert "Calibration gate: **passed**" in text and "- Pre-registration: commit `" in text
  assert "- Runs: commit(s) `abc1234`; 3 command(s), 3.0 wall minutes in all" in text
  assert "SRD - GRPO per seed +0.280, +0.280, +0.280; mean +0.280" in text
  assert "all-zero-variance iterations: GRPO 9, SRD 9; GRPO's grad_norm there max 0; SRD's min 0.01" in text
  # success first, final, gain; zero-variance share first (3 of 10 iterations flat), final; environment steps.
  assert ("| srd | 0,1,2 | 0.000 (0.000-0.000) | 0.310 (0.300-0.320) | 0.310 (0.300-0.320) | 0.825 (0.825-0.825) "
          "| 0.750 (0.750-0.750) | 5120 (5120-5120) | -0.0500 (-0.0500--0.0500) |") in text
  assert "| grpo | 2 | 0.000 | 0.040 | 0.040 | 0.750 | 5120 | 3 | 0-0 |" in text
  assert "None recorded" in text and (tmp_path / "runs" / "success.png").exists()
  # GRPO ahead of SRD on two seeds, its gradient not zero where every group is flat: H1 and H3 fail, H2 has no gain
  # to attribute.
  other = str(tmp_path / "other")
  os.makedirs(other)
  _arms(other, {**CURVES, "grpo": (0.0, 0.305)}, grad_zero=1e-3)
  with open(os.path.join(other, "changes.md"), "w") as f:
    f.write("BUDGET_MINUTES 90 -> 160 before any arm ran (the gate's timing).")
  summarize.main([f"--root={other}", f"--out={tmp_path / 'o'}"])
  out = capsys.readouterr().out
  assert _verdicts(out) == {"H1": "not supported", "H2 (control)": "no evidence (H1 not supported: no SRD gain to "
                            "attribute)", "H3 (mechanical)": "not supported"}
  assert "BUDGET_MINUTES 90 -> 160" in open(tmp_path / "o" / "results.md").read()
  # The shuffled control as good as SRD: H2 not supported; no flat iteration anywhere: H3 no evidence.
  third = str(tmp_path / "third")
  os.makedirs(third)
  for arm, (first, final) in {**CURVES, "srd_shuffled": (0.0, 0.35)}.items():
    for seed in (0, 1, 2):
      _run(os.path.join(third, f"{arm}_s{seed}"), _curve(first, final), STEPS, srd=arm != "grpo", zero_var=0)
  summarize.main([f"--root={third}", f"--out={tmp_path / 't'}"])
  v = _verdicts(capsys.readouterr().out)
  assert (v["H1"], v["H2 (control)"]) == ("supported", "not supported") and v["H3 (mechanical)"].startswith(
      "no evidence (no all-zero-variance iteration in GRPO and SRD")
  # A seed short: nothing is judged on two seeds.
  summarize.main([f"--root={root}", "--seeds=0,1,2,3", f"--out={tmp_path / 'x'}"])
  assert set(_verdicts(capsys.readouterr().out).values()) == {"incomplete"}
  assert math.isnan(summarize.numbers({**summarize.load_run(os.path.join(root, "srd_s0")), "done": False})["final"])
