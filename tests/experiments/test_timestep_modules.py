"""experiments/timestep_modules: the presets differ in their optimizer, LoRA and task fields only and validate; the
driver stops at a failed gate before any other run; the analysis reads real (tiny) runs' checkpoints into every
measure (`slow`: `pytest -m slow tests/experiments/test_timestep_modules.py`); the summary's verdicts follow
README's rules on hand-written analyses."""
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "experiments", "timestep_modules"))

from configs import timestep_modules as C  # noqa: E402
from experiments.gate import GATE_FAILED  # noqa: E402
from experiments.timestep_modules import run as R  # noqa: E402
from experiments.timestep_modules import summarize as S  # noqa: E402
from rlkit.cli import changed_keys  # noqa: E402
from tests.experiments.workdirs import write_workdir  # noqa: E402


def test_the_presets_differ_in_their_arm_and_task_fields_only_and_validate():
  from rlkit.train.config_checks import validate
  ref = C.get_config("adam_right")
  for preset in C.PRESETS:
    c = C.get_config(preset)
    validate(c)
    if preset == "bc":
      assert c.stages == ("bc",) and c.bc.steps == C.BC_STEPS
      continue
    changed = set(changed_keys(ref.to_dict(), c.to_dict()))
    assert all(k.startswith(("rl.optimizer.", "rl.expert_lora.", "rl.env_task")) for k in changed), (preset, changed)
  assert C.get_config("lora_ts_up").rl.expert_lora.targets == "timestep"


def test_the_driver_stops_at_a_failed_gate(tmp_path, monkeypatch):
  launched = []

  def launch(root, path, config, args, *rest, **kw):
    launched.append(os.path.basename(path))
    steps = 500 if path.endswith("bc_s0") else C.STEPS
    stage = "bc" if path.endswith("bc_s0") else "rl"
    write_workdir(path, {"stages": [stage], stage: {"steps": steps}}, [{"stage": stage, "step": steps,
                                                                         "eval/success": 0.5}])
    return 0
  monkeypatch.setattr(R, "launch", launch)
  monkeypatch.setattr(R, "gate", lambda args: False)
  assert R.main([f"--root={tmp_path}", "--archive="]) == GATE_FAILED
  assert launched == ["bc_s0", "adam_right_s0"]


@pytest.fixture(scope="module")
def tiny_runs(tmp_path_factory):
  """bc_s0 and every full fine-tuning arm's run of seed 0 at the QUICK sizes, trained in this process."""
  from rlkit.train.config import set_dotted
  from rlkit.train.run import run
  from tests.fast_compile import fast_compile
  root = tmp_path_factory.mktemp("tm")

  def config(preset):
    c = C.get_config(preset)
    for key, value in C.QUICK.items():
      set_dotted(c, key, value)
    c.rl.steps, c.rl.eval_every = 2, 2
    c.checkpoint.every = 1
    return c
  with fast_compile():
    run(config("bc"), str(root / "bc_s0"))
    for arm in ("adam", "sgd"):
      for task in C.TASKS:
        c = config(f"{arm}_{task}")
        c.rl.expert_path = str(root / "bc_s0")
        run(c, str(root / f"{arm}_{task}_s0"))
  return str(root)


@pytest.mark.slow            # nine tiny trainings (about a minute on 2 cores): with the experiment-sized runs
def test_the_analysis_measures_real_runs(tiny_runs):
  from analyze import analyze, pilot_measure, transfer_correlation
  out = analyze(tiny_runs, 0, quick=True)
  assert set(out["s0"]) == {*C.TASKS, "drift_free"} and out["eval_episodes"] == C.QUICK["bc.eval_episodes"]
  for arm in ("adam", "sgd"):
    rows = out["arms"][arm]["tasks"]
    for task, row in rows.items():
      assert 0 <= row["full"] <= 1 and set(row["steer"]) == {str(a) for a in (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)}
      assert row["steer"]["0.0"] == out["s0"][task]               # alpha 0 is theta_0 on the same episodes
      assert row["steer"]["1.0"] == row["graft_timestep"]
      shares = row["shares"]
      assert abs(sum(g["share"] for g in shares.values()) - 1) < 1e-6 and shares["timestep"]["param_share"] > 0.2
      assert (row["gradient_shares"] is None) == (arm == "sgd")
      assert {k["group"] for k in row["kernels"].values()} >= {"timestep", "block_mlp"}
    cos = out["arms"][arm]["cosine_weight"]
    assert len(cos) == 4 and all(abs(cos[i][i] - 1) < 1e-6 for i in range(4))
    rho = transfer_correlation(out["arms"][arm], out["tasks"])
    assert rho != rho or -1 <= rho <= 1                            # NaN where tiny runs transfer nothing
  measured = pilot_measure(tiny_runs, 0, R.PILOT, quick=True)
  assert measured["s0"] == out["s0"]
  assert measured["pilot_gain"] == pytest.approx(out["arms"]["adam"]["tasks"]["right"]["full"] - out["s0"]["right"])


def _analysis(seed, c_ts=1.6, grad=1.4, sgd_c=0.8, recovered=0.8, rho_sign=1.0):
  tasks = list(C.TASKS)
  s0 = {t: 0.2 for t in tasks} | {"drift_free": 1.0}
  shares = lambda c: {"timestep": {"concentration": c, "param_share": 0.33, "share": 0.33 * c},     # noqa: E731
                      "block_mlp": {"concentration": 0.7, "param_share": 0.66, "share": 0.46}}
  kernels = {"time_mlp_in/kernel": {"group": "timestep", "erank_vs_gaussian": 0.3},
             "mlp_0_in/kernel": {"group": "block_mlp", "erank_vs_gaussian": 0.8}}
  steer = {str(a): 0.2 + 0.6 * min(a, 1.0) * recovered + (0.05 if a > 1 else 0.0) for a in (0.0, 0.5, 1.0, 1.25, 1.5)}
  row = lambda c, g: {"full": 0.8, "graft_timestep": 0.2 + 0.6 * recovered, "random_timestep": 0.2,    # noqa: E731
                      "graft_rest": 0.3, "steer": steer, "shares": shares(c),
                      "gradient_shares": shares(g) if g else None, "kernels": kernels}
  drift = {"right": (1, 0), "up": (0, 1), "left": (-1, 0), "diagonal": (0.7, 0.7)}
  cos = [[drift[i][0] * drift[j][0] + drift[i][1] * drift[j][1] for j in tasks] for i in tasks]
  transfer = {i: {j: rho_sign * 0.3 * cos[a][b] for b, j in enumerate(tasks) if j != i} for a, i in enumerate(tasks)}
  arm = lambda c, g: {"tasks": {t: row(c, g) for t in tasks}, "transfer": transfer, "cosine_weight": cos,   # noqa: E731
                      "cosine_function": cos}
  return {"seed": seed, "tasks": tasks, "s0": s0, "groups": {"timestep": "", "block_mlp": ""},
          "arms": {"adam": arm(c_ts, grad), "sgd": arm(sgd_c, None)}}


def test_verdicts_follow_the_rules():
  seeds = (0, 1, 2)
  analyses = {s: _analysis(s) for s in seeds}
  finals = {"lora_ts": {t: {s: 0.8 for s in seeds} for t in C.TASKS},
            "lora_all": {t: {s: 0.7 for s in seeds} for t in C.TASKS}}
  v = S.verdicts(analyses, finals, seeds)
  assert v["H1"].startswith("supported") and v["H1"].count("supported") == 2, v["H1"]
  assert "the opposite" in v["H1-SGD"]
  for h in ("H2", "H3", "H4", "H4-function", "H5", "H6"):
    assert v[h].startswith("supported"), (h, v[h])
  weak = {s: _analysis(s, grad=0.5, recovered=0.3, rho_sign=-1.0) for s in seeds}
  finals["lora_ts"] = {t: {s: 0.6 for s in seeds} for t in C.TASKS}
  v = S.verdicts(weak, finals, seeds)
  assert "not supported: adam, squared gradients" in v["H1"]
  assert v["H3"].startswith("not supported") and v["H4"].startswith("not supported")
  assert v["H5"].startswith("not supported")
  text = "\n".join(S.tables(analyses, finals))
  assert "| adam | right | 0.200 (0.200-0.200) | 0.800 (0.800-0.800) |" in text
  assert json.dumps(v)                                            # verdicts are plain strings
