"""Config validation: every preset is valid; typos, wrong types and unknown names fail with the key named."""
import copy
import importlib.util
import json
import os

import inspect

import ml_collections
import pytest

from rlkit.core.errors import ConfigError
from rlkit.train.config import base_config
from rlkit.train.rl_config import rl_defaults
from rlkit.train.config_checks import validate
from rlkit.core.sections import RL_SECTIONS

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
# The pretrained base (experiments/base/README.md) is built outside the tests, which never depend on it: where it
# is missing, a preset that reads its tokenizer validates against a committed BPE folder instead.
BASE = os.path.join(ROOT, "experiments", "base", "model")
BASE_STAND_IN = os.path.join(ROOT, "experiments", "xtok_opd", "bpe", "b")


def _base_tokenizer(path: str) -> str:
  """`path`, or the stand-in when it names the base and the base is not built."""
  named = os.path.normpath(os.path.join(ROOT, path)) == BASE
  return BASE_STAND_IN if named and not os.path.isdir(BASE) else path


def _load(name):
  spec = importlib.util.spec_from_file_location(name, os.path.join(ROOT, "configs", f"{name}.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def _validated(c) -> dict:
  """Validates `c` and checks that validation only reads it: it returns nothing and leaves every field as it
  was (a check that rewrote a field would hide the user's value). Returns the config as a dict."""
  before = copy.deepcopy(c.to_dict())
  assert validate(c) is None
  assert c.to_dict() == before
  return before


@pytest.mark.parametrize("preset", ["cpu", "gpu", "test", "ci"])
def test_presets_validate(preset):
  """Each preset validates unchanged, and (cpu, test: gpu's 200k prompts take 12 s to generate) its length
  limits are the data's: none is too short (that raises) and none is left to derive (that would add a note and
  change the config launch.py writes)."""
  from rlkit.train.lengths import resolve_lengths
  from rlkit.train.models import run_tokenizer
  c = _load("grpo_arith").get_config(preset)
  before = _validated(c)
  assert before["stages"] == ("sft", "rl") and before["task"]["name"] == "arithmetic"
  if preset != "gpu":
    resolved, notes = resolve_lengths(c, run_tokenizer(c))
    assert notes == [] and resolved.to_dict() == before


def test_more_prompts_than_the_task_has_is_a_config_error_naming_the_keys():
  from rlkit.core.errors import ConfigError
  from rlkit.train.lengths import resolve_lengths
  from rlkit.train.models import run_tokenizer
  c = _load("grpo_arith").get_config("test")
  c.task.kwargs.update(ops="+", min_digits=1, max_digits=1)      # 100 distinct prompts
  c.data.num_train = 200
  with pytest.raises(ConfigError, match="distinct prompts.*--config.data.num_train"):
    resolve_lengths(c, run_tokenizer(c))


@pytest.mark.parametrize("name", ["baselines", "calif", "drm", "embodied", "graft", "logra", "onepo", "opd_scale",
                                  "prorubric", "rquest", "tips", "xtok_opd"])
def test_experiment_presets_validate(name):
  """Every preset of the experiment configs validates, with the SFT checkpoints they start from left empty
  (the model then comes from its fields; a tokenizer that came with them is the base's); given, the paths are
  checked by `_check_path`."""
  module = _load(name)
  seen = {}
  for preset in module.PRESETS:
    c = module.get_config(preset)
    key = json.dumps(c.to_dict(), sort_keys=True, default=str)
    assert key not in seen, f"{name}: preset {preset!r} is the same config as {seen.get(key)!r}"
    seen[key] = preset
    from_model = c.tokenizer.kind == "hf" and not c.tokenizer.path     # the model folder's or checkpoint's
    c.tokenizer.path = _base_tokenizer(BASE if from_model else c.tokenizer.path)
    c.model.path = ""
    for role in c.models.keys():
      c.models[role].path = ""
    _validated(c)


def test_unknown_preset_is_named():
  with pytest.raises(ValueError, match="cpu, gpu, test"):
    _load("grpo_arith").get_config("tpu")


def _replace(c, section, **kw):
  """Swap a whole section (ConfigDict refuses a wrong-typed field assignment itself; files can still do this)."""
  c[section] = ml_collections.ConfigDict({**c[section].to_dict(), **kw})


def _config():
  c = _load("grpo_arith").get_config("test")
  c.unlock()
  return c


@pytest.mark.parametrize("mutate,needle", [
    (lambda c: c.rl.__setitem__("advantge", "group"), "Unknown config key rl.advantge"),
    (lambda c: c.rl.__setitem__("advantage", "grpo"), "rl.advantage='grpo' is not a known advantage estimator"),
    (lambda c: c.rl.__setitem__("aggregation", "mean"), "token-mean"),
    (lambda c: _replace(c, "rl", steps="ten"), "rl.steps='ten' has type str"),
    (lambda c: _replace(c, "rl", filter=1), "rl.filter=1 has type int; expected str"),
    (lambda c: c.rl.__setitem__("filter", "dapo"), "rl.filter='dapo' is not a known group filter"),
    (lambda c: c.rl.__setitem__("augment", "teacher"), "rl.augment='teacher' is not a known augmenter"),
    (lambda c: c.rl.reward.__setitem__("name", "rubrik"), "rl.reward.name='rubrik' is not a known reward"),
    (lambda c: c.rl.reward.kwargs.__setitem__("bonus", 1.0), "rl.reward.kwargs: reward 'verifier': unknown"),
    (lambda c: c.rl.loss_terms.__setitem__("distill", 1.0), "rl.loss_terms.distill='distill' is not a known"),
    (lambda c: c.rl.loss_terms.__setitem__("kl", 1.0), "configured by its own fields"),
    (lambda c: c.rl.__setitem__("top_p", 0.0), "rl.top_p=0.0 must be in (0, 1]"),
    (lambda c: c.rl.__setitem__("top_k", -1), "rl.top_k=-1 must be >= 0"),
    (lambda c: c.rl.__setitem__("temperature", 0.0), "rl.temperature=0.0 must be > 0"),
    (lambda c: c.rl.__setitem__("eps_low", 1.0), "policy loss 'ppo_clip': Need 0 <= eps_low < 1"),
    (lambda c: c.rl.__setitem__("dual_clip", 0.5), "policy loss 'ppo_clip': dual_clip must be > 1"),
    (lambda c: c.rl.update(policy_loss="sapo", dual_clip=3.0), "SAPO has no hard clip to dual-clip"),
    (lambda c: c.rl.__setitem__("group_size", 1), "rl.group_size=1 is too small"),
    (lambda c: c.rl.__setitem__("overlong_cache", 99), "rl.overlong_cache=99 must be in [0, max_new_tokens"),
    (lambda c: c.rl.__setitem__("max_skipped_updates", -1), "rl.max_skipped_updates=-1 must be >= 0"),
    (lambda c: c.rl.reward.__setitem__("timeout_s", -1.0), "reward.timeout_s >= 0"),
    (lambda c: c.rl.optimizer.__setitem__("lr", 0.0), "rl.optimizer.lr=0.0 must be > 0"),
    (lambda c: c.task.kwargs.__setitem__("max_digits", 0), "task.kwargs: task 'arithmetic'"),
    (lambda c: c.task.kwargs.__setitem__("digits", 3), "unknown parameter(s) ['digits']"),
    (lambda c: c.eval.__setitem__("pass_n", 1), "eval.pass_n=1 must be 0 or >= eval.pass_k=2"),
    (lambda c: (c.eval.__setitem__("by_category", True), c.task.__setitem__("name", "countdown"),
                c.task.__setitem__("kwargs", ml_collections.ConfigDict())), "task 'countdown' has no categories"),
    (lambda c: c.data.__setitem__("max_prompt_len", -1), "data.max_prompt_len=-1 must be >= 0"),
    (lambda c: c.models.__setitem__("reference", ml_collections.ConfigDict({"paht": "x"})),
     "Unknown config key models.reference.paht"),
    (lambda c: c.sft.optimizer.__setitem__("schedule", "exp"), "sft.optimizer.schedule"),
    (lambda c: c.model.__setitem__("path", os.path.dirname(__file__)), "model.path: Model path"),
    (lambda c: c.task.__setitem__("name", "gsm8k"), "task.name='gsm8k'"),
    (lambda c: c.__setitem__("stages", ("sft", "ppo")), "no config.ppo section"),
    (lambda c: c.__setitem__("optimiser", 1), "Unknown config key optimiser"),
    (lambda c: c.rl.__setitem__("kind", "dpo"), "rl.kind='dpo'"),
    (lambda c: c.rl.__setitem__("minibatches", 3), "minibatches"),
    (lambda c: c.wandb.__setitem__("mode", "cloud"), "wandb.mode"),
    (lambda c: c.sft.__setitem__("stop_at_loss", -0.5), "sft.stop_at_loss=-0.5 must be >= 0"),
    (lambda c: c.mesh.__setitem__("cpu_devices", -2), "mesh.cpu_devices=-2 must be >= 0"),
    (lambda c: c.model.__setitem__("attention", "flash"), "model.attention='flash'; choose one of xla, cpu_kernel"),
    (lambda c: (c.model.__setitem__("attention", "cpu_kernel"), c.model.__setitem__("head_dim", 24)),
     "model.head_dim % 32 == 0 (got 24)"),
    (lambda c: c.model.__setitem__("kv_cache_dtype", "int8"), "model.kv_cache_dtype='int8'; choose one of"),
    (lambda c: c.model.__setitem__("trace_record", "lsb"), "model.trace_record='lsb'; choose one of"),
    (lambda c: c.model.__setitem__("expert_quant_layers", (-1,)), "model.expert_quant_layers=(-1,) must list"),
    (lambda c: c.rl.moe.__setitem__("trace", True), "rl.moe.trace=True rounds the FP4 experts as the rollout did"),
    (lambda c: (c.model.update(expert_quant="nvfp4", expert_quant_layers=(1,)),
                c.rl.sync.update(kind="dense", quantizer="nvfp4_experts")),
     "rl.sync.quant_layers=() differs from model.expert_quant_layers=(1,)"),
])
def test_invalid_configs_fail_with_the_key_named(mutate, needle):
  c = _config()
  mutate(c)
  with pytest.raises(ConfigError) as e:
    validate(c)
  assert needle in str(e.value)


def test_valid_model_roles_pass():
  """A declared role that a stage names passes, unchanged; the same stage without the role fails: the pass is
  the role check's verdict, not a check that never looked."""
  from rlkit.train.models import role_model_defaults
  c = _config()
  c.rl.score_roles = ("reference",)
  with pytest.raises(ConfigError, match="rl.score_roles names 'reference'"):
    validate(c)
  c.models.reference = role_model_defaults()
  assert _validated(c)["models"]["reference"] == role_model_defaults().to_dict()


@pytest.mark.parametrize("kind,path,needle", [
    ("hf", "", r"models.teacher.tokenizer.kind='hf' needs models.teacher.tokenizer.path"),
    ("", "some/folder", r"tokenizer.path='some/folder' is set but models.teacher.tokenizer.kind is ''"),
    ("char", "some/folder", r"read by kind 'hf' only"),
    ("hf", "/nowhere/tok", r"no tokenizer file at '/nowhere/tok'"),
    ("bpe", "", r"models.teacher.tokenizer.kind='bpe'.*char, hf"),
])
def test_a_role_tokenizer_mistake_is_named(kind, path, needle):
  from rlkit.train.models import role_model_defaults
  c = _config()
  c.models.teacher = role_model_defaults()
  c.models.teacher.tokenizer.kind, c.models.teacher.tokenizer.path = kind, path
  with pytest.raises(ConfigError, match=needle):
    validate(c)


def test_validate_for_processes_names_the_batch_that_does_not_split():
  from rlkit.train.config_checks import validate_for_processes
  c = _config()
  before = c.to_dict()
  for processes in (1, 2, 4):                     # eval 16, sft 8 and rl 4 rows split evenly
    assert validate_for_processes(c, processes) is None and c.to_dict() == before
  with pytest.raises(ConfigError, match=r"rl.prompts_per_step=4 must be a multiple of the 8 processes"):
    validate_for_processes(c, 8)
  with pytest.raises(ConfigError, match=r"must be a multiple of the 3 processes"):
    validate_for_processes(c, 3)
  c.rl.filter = "dynamic_sampling"
  with pytest.raises(ConfigError, match="not supported with 2 processes"):
    validate_for_processes(c, 2)


def test_every_rl_default_field_is_documented_once():
  """Each generic field of the RL section has exactly one defining line in `rl_defaults`, with a comment; each
  component section (correction, distill, ...) comes from its registered defaults, with a one-line doc."""
  src = inspect.getsource(rl_defaults)
  for key in rl_defaults().keys():
    if key == "optimizer":
      continue
    lines = [l for l in src.splitlines() if l.strip().startswith(f"c.{key} =")]
    if key in RL_SECTIONS:
      assert not lines and RL_SECTIONS.get(key).doc, key
      continue
    assert len(lines) == 1 and "#" in lines[0], key
  assert {"correction", "critic", "distill", "onepo", "rollout_mismatch", "sync"} <= set(RL_SECTIONS)
  assert "rl" not in base_config()


def test_validation_does_not_start_the_xla_backend():
  """launch.py validates before `jax.distributed.initialize`, which must come before any JAX computation:
  validation (policy losses are checked by tracing them) must not initialise a backend."""
  import subprocess
  import sys
  code = ("import jax; from jax._src import xla_bridge as xb; from rlkit.train.config_checks import validate; "
          "from configs.grpo_arith import get_config; c = get_config('test'); c.rl.policy_loss = 'cispo'; "
          "validate(c); assert not xb._backends, 'validation initialised a backend'; print('ok')")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
  assert out.returncode == 0 and "ok" in out.stdout, out.stderr[-2000:]


def test_the_fewest_completions_per_prompt_follow_the_estimator():
  """One completion per prompt is its own group mean: group estimators need two, REINFORCE++ (a batch
  baseline) and GAE (a critic) need one."""
  c = _config()
  c.rl.update(advantage="reinforce_pp", group_size=1)
  assert _validated(c)["rl"]["group_size"] == 1
  c.rl.advantage = "batch"
  with pytest.raises(ConfigError, match=r"rl.group_size=1 is too small: advantage 'batch' needs at least 2"):
    validate(c)
