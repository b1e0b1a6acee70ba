"""configs/logra.py and experiments/logra: every preset validates, each arm changes only its own fields, every
arm's optimizer initialises on the model it trains (LoGRA's rank fits every projection), the verdict rule, and
the driver's commands (dry run)."""
import jax
import jax.numpy as jnp

from configs import logra as L
from experiments.logra import run, summarize
from rlkit.models import lora
from rlkit.models.transformer import Transformer
from rlkit.optim.optimizers import gradient_path, make_optimizer
from rlkit.train.config_checks import validate
from rlkit.train.models import tokenizer_from_spec, transformer_config
from rlkit.train.steps import init_train_state


def _config(preset):
  c = L.get_config(preset)
  c.model.path = ""               # the SFT checkpoint the arms start from; empty, the model comes from its fields
  return c


def test_every_preset_validates_and_each_arm_differs_from_adamw_only_in_its_fields():
  for preset in L.PRESETS:
    validate(_config(preset))
  base = _config("adamw").to_dict()

  def flat(d, prefix=""):
    return {k2: v2 for k, v in d.items()
            for k2, v2 in (flat(v, f"{prefix}{k}.").items() if isinstance(v, dict) else [(f"{prefix}{k}", v)])}
  for arm, changes in L.ARMS.items():
    got = flat(_config(arm).to_dict())
    assert {k for k, v in flat(base).items() if got[k] != v} <= set(changes), arm
    assert all(got[k] == v for k, v in changes.items()), arm
    assert _config(f"{arm}:quick").rl.steps == L.QUICK_STEPS
  assert _config("sft").stages == ("sft",) and _config("adamw").stages == ("rl",)
  assert L.ARMS["full_rank"]["rl.optimizer.logra_rank"] == _config("adamw").model.hidden_size


def test_every_arm_initialises_its_optimizer_on_the_model():
  """Abstract shapes only: the LoGRA ranks fit every sketched kernel (n >= rank), LoRA adds its adapters."""
  for arm in L.ARMS:
    c = _config(arm)
    model = Transformer(transformer_config(c.model, tokenizer_from_spec(c.tokenizer).vocab_size))
    tx, path = make_optimizer(c.rl.optimizer, c.rl.steps), gradient_path(c.rl.optimizer)

    def init(key, c=c, model=model, tx=tx, path=path):
      params = model.init(key, jnp.zeros((1, 1), jnp.int32))["params"]
      return init_train_state(lora.add_adapters(params, c.model.lora, key), tx, path)
    state = jax.eval_shape(init, jax.random.key(0))
    assert lora.has_adapters(state.params) == (arm == "lora_r16"), arm


def test_verdict_rule():
  assert summarize.verdict([0.01, -0.02, 0.0]) == "parity"
  assert summarize.verdict([-0.05, -0.04, -0.01]) == "below"
  assert summarize.verdict([0.05, 0.06, 0.04]) == "above"
  assert summarize.verdict([0.10, -0.05, -0.04]) == "parity (seeds split)"
  assert summarize.verdict([]) == "-"


def test_driver_dry_run_prints_one_sft_and_every_arm_from_it(tmp_path, capsys):
  assert run.main([f"--root={tmp_path}", "--seeds=0", "--dry_run"]) == 0
  lines = [l for l in capsys.readouterr().out.splitlines() if "launch.py" in l]
  assert len(lines) == 1 + len(L.ARMS)
  assert "configs/logra.py:sft" in lines[0] and f"--workdir={tmp_path}/sft_s0" in lines[0]
  for line, arm in zip(lines[1:], L.ARMS):
    assert f"configs/logra.py:{arm} " in line and f"--config.model.path={tmp_path}/sft_s0" in line


def test_kl_prediction_error_and_its_verdict(tmp_path):
  """Per-step realised / applied KL over the applied steps (a skipped step, scale 0, is counted apart)."""
  import json
  steps = [(1.0, 1e-3, 1.0e-3), (0.5, 2e-3, 2.2e-3), (0.0, 0.0, 0.0), (1.0, 1e-3, 0.9e-3)]
  rows = [{"step": i, "kl/scale": s, "kl/applied": a, "kl/realised": r} for i, (s, a, r) in enumerate(steps)]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
  k = summarize.kl_prediction(str(tmp_path))
  assert k["steps"] == 4 and k["skipped"] == 1 and abs(k["median"] - 1.0) < 1e-9 and abs(k["scaled"] - 0.5) < 1e-9
  assert summarize.kl_verdict([k]) == "supported"
  assert summarize.kl_verdict([k, dict(k, median=1.2)]) == "not supported"
  assert summarize.kl_verdict([dict(k, p95=1.3)]) == "not supported" and summarize.kl_verdict([]) == "-"
