"""Models by role: load_model from an rlkit checkpoint / workdir / HF folder, build_models, sharding, errors."""
import functools
import json

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest
import tokenizers
import torch
import transformers

from rlkit.models import hf
from rlkit.models.tokenizer import CharTokenizer, HFTokenizer
from rlkit.parallel.mesh import make_mesh
from rlkit.parallel.rules import param_shardings
from rlkit.train import checkpoint as ckpt
from rlkit.train.checkpoint import Checkpointer
from rlkit.train.models import (build_model, build_models, load_model, model_spec, role_model_defaults,
                                transformer_config)
from rlkit.train.steps import TrainState

TOKENS = np.random.RandomState(0).randint(3, 40, (2, 7)).astype(np.int32)


def _section(**kw):
  s = role_model_defaults()
  s.update({**dict(hidden_size=32, intermediate_size=48, num_layers=2, num_heads=4, num_kv_heads=2,
                   head_dim=8), **kw})
  return s


def _models_section(**roles):
  return ml_collections.ConfigDict(roles)


@functools.partial(jax.jit, static_argnums=0)
def _forward(module, params):
  return module.apply({"params": params}, jnp.asarray(TOKENS))


def _logits(module, params):
  return np.asarray(_forward(module, params))


def _state(params, tx):
  """A stage state as the trainer saves it, with the optimizer state after one real update."""
  @jax.jit
  def update(params):
    updates, opt_state = tx.update(jax.tree.map(jnp.ones_like, params), tx.init(params), params)
    return TrainState(jnp.ones((), jnp.int32), optax.apply_updates(params, updates), opt_state)
  return {"train": update(params), "ref_params": params}


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
  """A workdir whose checkpoints/ holds steps 3 and 7 of a tiny char-tokenizer model (adam state inside),
  saved under two different optimizers."""
  workdir = tmp_path_factory.mktemp("run")
  tokenizer = CharTokenizer()
  module, params = build_model(_section(), tokenizer, jax.random.key(0), make_mesh({"data": 1},
                                                                                   jax.devices()[:1]))
  spec = model_spec(module.cfg, {"kind": "char", "path": ""})
  saver = Checkpointer(str(workdir / "checkpoints"), every=1, model_spec=spec)
  states = {}
  for step, tx in ((3, optax.adam(1e-2)), (7, optax.chain(optax.clip_by_global_norm(1.0), optax.adam(1e-1)))):
    states[step] = _state(params, tx)
    saver.save(step, states[step], {"stage_index": 0})
  saver.close()
  # What an interrupted save leaves behind: a newer temporary folder, which loading must skip.
  (workdir / "checkpoints" / "9.orbax-checkpoint-tmp-1" / "state").mkdir(parents=True)
  return workdir, module, states


# ------------------------------------------------------------------------------------- rlkit checkpoints

def test_checkpoint_and_workdir_load_the_policy_params(run_dir):
  workdir, module, states = run_dir
  for path, step in ((workdir / "checkpoints" / "3", 3), (workdir, 7)):   # a workdir gives its newest step
    loaded, params, tokenizer = load_model(str(path))
    assert loaded.cfg == module.cfg
    assert isinstance(tokenizer, CharTokenizer) and tokenizer.vocab_size == CharTokenizer().vocab_size
    want = states[step]["train"].params
    jax.tree.map(np.testing.assert_array_equal, params, want)
    np.testing.assert_array_equal(_logits(loaded, params), _logits(module, want))
  # The two steps differ, so the newest really was picked (and ref_params were not).
  assert not np.array_equal(_logits(module, states[3]["train"].params), _logits(module, states[7]["train"].params))


def test_checkpointer_save_and_restore_unchanged_by_the_model_spec(run_dir):
  workdir, module, states = run_dir
  reader = Checkpointer(str(workdir / "checkpoints"), every=1)
  assert reader.latest_step() == 7
  restored, meta = reader.restore(7, states[7])
  assert meta == {"stage_index": 0} and reader.restore_meta(3) == meta
  jax.tree.map(np.testing.assert_array_equal, restored, states[7])
  reader.close()
  spec_reader = ckpt.CheckpointReader(str(workdir / "checkpoints"))
  assert spec_reader.model_spec(7) == json.loads(json.dumps(model_spec(module.cfg, {"kind": "char", "path": ""})))
  spec_reader.close()


def test_transient_state_entries_are_not_saved(tmp_path):
  """The sampler's weight copy (rl.sync) is remade from the master when a stage starts: checkpoints leave it
  out at every depth (a graft peer's too) and restore onto the rest."""
  from rlkit.train import weight_sync
  state = {"train": {"w": jnp.arange(3.0)}, weight_sync.SAMPLER: jnp.ones(5),
           "peer": {"train": {"w": jnp.arange(2.0)}, weight_sync.SAMPLER: jnp.ones(4)}}
  saver = Checkpointer(str(tmp_path / "checkpoints"), every=1)
  saver.save(1, state, {})
  kept = ckpt.persistent(state)
  expected = {"train": state["train"], "peer": {"train": state["peer"]["train"]}}
  assert jax.tree.structure(kept) == jax.tree.structure(expected)
  restored, _ = saver.restore(1, kept)
  jax.tree.map(np.testing.assert_array_equal, restored, kept)
  saver.close()


def test_dtype_and_attention_overrides(run_dir):
  workdir, module, _ = run_dir
  loaded, params, _ = load_model(str(workdir), param_dtype="bfloat16", dtype="bfloat16")
  assert (loaded.cfg.param_dtype, loaded.cfg.dtype) == ("bfloat16", "bfloat16")
  assert loaded.cfg.replace(param_dtype="float32", dtype="float32") == module.cfg
  assert {x.dtype for x in jax.tree.leaves(params)} == {jnp.dtype(jnp.bfloat16)}


# ------------------------------------------------------------------------------------------ HF folders

@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory):
  """A tiny random Qwen3 written by transformers, with a word-level tokenizer.json beside it."""
  path = tmp_path_factory.mktemp("qwen3")
  torch.manual_seed(0)
  config = transformers.Qwen3Config(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                                    num_key_value_heads=2, head_dim=8, intermediate_size=48)
  model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation="eager",
                                                        dtype=torch.float32).eval()
  with torch.no_grad():
    for name, p in model.named_parameters():
      p.copy_(torch.randn_like(p) * 0.1 + (1.0 if "norm" in name else 0.0))
  model.save_pretrained(path)
  vocab = {w: i for i, w in enumerate(["<pad>", "<eos>"] + [f"w{i}" for i in range(30)])}
  tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<pad>"))
  tok.pre_tokenizer = tokenizers.pre_tokenizers.WhitespaceSplit()
  tok.save(str(path / "tokenizer.json"))
  (path / "tokenizer_config.json").write_text(json.dumps({"eos_token": "<eos>", "pad_token": "<pad>"}))
  return path


def test_hf_folder_loads_like_hf_load(hf_dir, tmp_path):
  module, params, tokenizer = load_model(str(hf_dir))
  ref_module, ref_params = hf.load(hf_dir)
  assert module.cfg == ref_module.cfg
  np.testing.assert_array_equal(_logits(module, params), _logits(ref_module, ref_params))
  assert isinstance(tokenizer, HFTokenizer) and tokenizer.encode("w3 w0") == [5, 2] and tokenizer.eos_id == 1
  bare = tmp_path / "bare"          # no tokenizer.json: the model alone
  bare.mkdir()
  for name in ("config.json", "model.safetensors"):
    (bare / name).write_bytes((hf_dir / name).read_bytes())
  assert load_model(str(bare))[2] is None


# --------------------------------------------------------------------------------------------- sharding

@pytest.mark.parametrize("source", ["checkpoint", "hf"])
def test_loaded_params_follow_the_partition_rules(run_dir, hf_dir, source):
  mesh = make_mesh({"data": 2, "fsdp": 2, "tensor": 2})
  path = str(run_dir[0]) if source == "checkpoint" else str(hf_dir)
  module, params, _ = load_model(path, mesh=mesh)
  want = param_shardings(params, mesh)
  got = jax.tree.map(lambda x: x.sharding, params)
  assert jax.tree.leaves(got) == jax.tree.leaves(want)
  assert any(not s.is_fully_replicated for s in jax.tree.leaves(got))   # the rules really split something
  _, plain, _ = load_model(path)
  jax.tree.map(np.testing.assert_array_equal, params, plain)


# ---------------------------------------------------------------------------------------------- by role

def test_build_models_two_roles(run_dir):
  workdir, saved_module, states = run_dir
  tokenizer = CharTokenizer("0123456789+-=")           # the run's: smaller than the checkpoint's
  mesh = make_mesh({"data": -1})
  section = _models_section(reference=_section(path=str(workdir / "checkpoints" / "3")),
                            critic=_section(num_layers=1))
  out = build_models(section, tokenizer, jax.random.key(1), mesh)
  assert sorted(out) == ["critic", "reference"] and not out["critic"].trainable and not out["reference"].trainable
  ref = out["reference"]
  assert ref.module.cfg == saved_module.cfg and isinstance(ref.tokenizer, CharTokenizer)
  assert ref.tokenizer.vocab_size == CharTokenizer().vocab_size
  jax.tree.map(np.testing.assert_array_equal, ref.params, states[3]["train"].params)
  critic = out["critic"]
  assert critic.tokenizer is tokenizer and critic.module.cfg == transformer_config(section.critic, tokenizer.vocab_size)
  assert critic.module.cfg.num_layers == 1 and critic.module.cfg.vocab_size == tokenizer.vocab_size
  section.critic.trainable = True
  again = build_models(section, tokenizer, jax.random.key(1), mesh)
  assert again["critic"].trainable
  jax.tree.map(np.testing.assert_array_equal, again["critic"].params, critic.params)   # same key, same init


def test_transformer_config_vocab():
  assert transformer_config(_section(), 50).vocab_size == 50
  assert transformer_config(_section(vocab_size=64), 50).vocab_size == 64
  with pytest.raises(ValueError, match="smaller than the tokenizer's 50"):
    transformer_config(_section(vocab_size=40), 50)


# ------------------------------------------------------------------------------------------------- errors

def test_bad_paths_are_named(tmp_path):
  missing = tmp_path / "nowhere"
  with pytest.raises(FileNotFoundError, match=f"{missing} does not exist.*Hugging Face folder"):
    load_model(str(missing))
  (tmp_path / "file.txt").write_text("x")
  with pytest.raises(NotADirectoryError, match="file.txt is a file"):
    load_model(str(tmp_path / "file.txt"))
  (tmp_path / "other").mkdir()
  (tmp_path / "other" / "notes.md").write_text("x")
  with pytest.raises(ValueError, match=r"other is none of the sources.*notes\.md.*rlkit workdir"):
    load_model(str(tmp_path / "other"))
  (tmp_path / "empty_run" / "checkpoints").mkdir(parents=True)
  with pytest.raises(FileNotFoundError, match="empty_run has no finished checkpoint"):
    load_model(str(tmp_path / "empty_run"))
  (tmp_path / "crashed_run").mkdir()
  (tmp_path / "crashed_run" / "config.json").write_text(json.dumps({"stages": ["sft"], "seed": 0}))
  with pytest.raises(FileNotFoundError, match="crashed_run is an rlkit workdir without checkpoints"):
    load_model(str(tmp_path / "crashed_run"))


def test_checkpoint_without_model_spec_is_refused(tmp_path, run_dir):
  _, module, states = run_dir
  old = Checkpointer(str(tmp_path / "old" / "checkpoints"), every=1)   # as runs before the model spec saved
  old.save(5, states[3], {})
  old.close()
  for path in (tmp_path / "old", tmp_path / "old" / "checkpoints" / "5"):
    with pytest.raises(FileNotFoundError, match=r"checkpoints/5 has no model spec.*model_spec="):
      load_model(str(path))


def test_checkpoint_whose_params_do_not_match_its_spec(tmp_path, run_dir):
  _, module, states = run_dir
  spec = model_spec(module.cfg.replace(hidden_size=16), {"kind": "char"})
  bad = Checkpointer(str(tmp_path / "checkpoints"), every=1, model_spec=spec)
  bad.save(1, states[3], {})
  bad.close()
  with pytest.raises(ValueError, match=r"do not match the expected model: .*embedding: checkpoint \(\d+, 32\)"):
    load_model(str(tmp_path))


def test_role_model_vocabulary_must_cover_its_tokenizer(hf_dir):
  big = CharTokenizer()                                # 84 ids; the HF model has 64 ...
  section = _section(path=str(hf_dir))
  with pytest.raises(ValueError, match=r"model.path=.*vocab_size=64, smaller than its tokenizer's"):
    build_model(section, big, jax.random.key(0), make_mesh({"data": -1}))
  # ... but as a role it brings its own tokenizer (32 ids), which fits.
  out = build_models(_models_section(teacher=section), big, jax.random.key(0), make_mesh({"data": -1}))
  assert isinstance(out["teacher"].tokenizer, HFTokenizer)


def test_a_role_reads_text_through_the_tokenizer_its_section_names(tmp_path, run_dir):
  """models.<role>.tokenizer: a role built from the fields gets that tokenizer and its vocabulary (a teacher with
  other merges than the policy's), one loaded from a path is checked against it, and kind '' keeps the old rule
  (the source's, else the run's)."""
  from rlkit.models.bpe import bpe_tokenizer
  folder = str(tmp_path / "bpe")
  bpe = bpe_tokenizer([f"{a}+{b}={a + b}" for a in range(60) for b in range(0, 60, 3)], 280, folder=folder)
  run_tok, mesh = CharTokenizer(), make_mesh({"data": -1})
  named = _section()
  named.tokenizer.kind, named.tokenizer.path = "hf", folder
  out = build_models(_models_section(teacher=named, plain=_section()), run_tok, jax.random.key(0), mesh)
  teacher = out["teacher"]
  assert isinstance(teacher.tokenizer, HFTokenizer) and teacher.tokenizer.get_vocab() == bpe.get_vocab()
  assert teacher.module.cfg.vocab_size == bpe.vocab_size == 280
  assert out["plain"].tokenizer is run_tok and out["plain"].module.cfg.vocab_size == run_tok.vocab_size
  named.path = str(run_dir[0])                 # a char checkpoint: fewer ids than the BPE it is told to read
  with pytest.raises(ValueError, match=r"models.teacher.path=.*smaller than its tokenizer's 280"):
    build_models(_models_section(teacher=named), run_tok, jax.random.key(0), mesh)

