"""experiments/diffusion_art: the arms differ in their method (and ART's restoration) only and validate; the
summary's NFE ratios and verdicts follow README's rules on hand-written runs; the driver stops at a failed gate."""
import json
import math
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, ROOT)

from configs import diffusion_art as C  # noqa: E402
from experiments.diffusion_art import run as R  # noqa: E402
from experiments.diffusion_art import summarize as S  # noqa: E402
from experiments.gate import GATE_FAILED  # noqa: E402
from rlkit.cli import changed_keys  # noqa: E402
from tests.experiments.workdirs import write_workdir  # noqa: E402


def test_the_arms_differ_in_their_method_only_and_validate():
  from rlkit.train.config_checks import validate
  ref = C.get_config("art")
  for preset in C.PRESETS:
    c = C.get_config(preset)
    validate(c)
    if preset in C.ARMS:
      want = {"rl.method"} if c.rl.method != "art" else set()
      want |= {"rl.art.restore"} if preset == "art_norestore" else set()
      assert set(changed_keys(ref.to_dict(), c.to_dict())) == want, preset
  assert C.get_config("pretrain").stages == ("pretrain",) and ref.rl.reward.gamma == C.GAMMA


def _rows(rewards, nfe_per_step):
  return [{"stage": "rl", "step": i + 1, "reward": r, "nfe": (i + 1) * nfe_per_step, "opt_mmd": 0.1}
          for i, r in enumerate(rewards)]


def _write(root, name, rows, final=None):
  write_workdir(os.path.join(root, name), {"stages": ["rl"], "rl": {"steps": len(rows)}}, rows)
  if final is not None:
    arm, seed = name.rsplit("_s", 1)
    with open(os.path.join(root, f"samples_{arm}_s{seed}.json"), "w") as f:
      json.dump({"reward": -1.0, "true_reward": -1.0, "opt_mmd": final, "data_mmd": 0.01, "samples": [[[0, 0]]]}, f)


def test_ratios_and_verdicts_follow_the_rules(tmp_path):
  root, n = str(tmp_path), 100
  ramp = [-5 + 4 * i / (n - 1) for i in range(n)]             # ends at -1; its last 10% average ~ -1.18
  for seed in (0, 1, 2):
    _write(root, f"flow_grpo_s{seed}", _rows(ramp, 100))
    _write(root, f"dance_grpo_s{seed}", _rows(ramp, 100))
    _write(root, f"nft_s{seed}", _rows(ramp, 10))
    _write(root, f"art_s{seed}", _rows([-1.0] * n, 10), final=0.05)    # reaches every target at once
    _write(root, f"art_norestore_s{seed}", _rows([-1.0] * n, 10), final=0.10)
  runs = S.load_all(root, (0, 1, 2))
  own = S.nfe_to(runs["flow_grpo"][0], runs["flow_grpo"][0]["late"])
  assert own == 100 * n and S.ratios(runs, "art", "flow_grpo")[0] == 10 / own    # ART: at its first iteration
  assert math.isinf(S.nfe_to(runs["nft"][0], 0.0))
  v = S.verdicts(runs)
  assert v["H1"].startswith("supported") and v["H3"].startswith("supported"), v
  for seed in (0, 1):
    _write(root, f"art_s{seed}", _rows([-6.0] * n, 10), final=0.20)            # never reaches, worse quality
  v = S.verdicts(S.load_all(root, (0, 1, 2)))
  assert v["H1"].startswith("not supported") and v["H3"].startswith("not supported") and "never" in v["H1"], v


def test_the_driver_stops_at_a_failed_gate(tmp_path, monkeypatch):
  launched = []

  def launch(root, path, config, args, *rest, **kw):
    launched.append(os.path.basename(path))
    write_workdir(path, {"stages": ["rl"], "rl": {"steps": 1}}, _rows([-1.0], 10))
    return 0
  monkeypatch.setattr(R, "launch", launch)
  monkeypatch.setattr(R, "run_script", lambda out, *a, **k: 0)
  monkeypatch.setattr(R, "gate", lambda args: False)
  assert R.main([f"--root={tmp_path}", "--archive="]) == GATE_FAILED
  assert launched == ["pretrain_s0", "art_s0"]
