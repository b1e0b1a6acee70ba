"""The README's paths off the toy task, followed literally through launch.py: a Hugging Face model folder
(config, safetensors, tokenizer.json, tokenizer_config.json) trained through SFT and RL on natural-language
JSONL, its result saved back to a folder `transformers` loads with equal logits, the console lines of a run,
a rerun of a complete workdir, and RL started from the SFT stage's kept checkpoint."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.cli_in_process import launch_in_process
from tests.xla_flags import FAST_COMPILE

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CONFIG = os.path.join(ROOT, "configs", "jsonl.py")

NAMES = ["Tom", "Ann", "Li", "Sara", "Omar", "Ines"]
THINGS = ["apples", "pens", "cards", "books"]


def _rows(n, seed):
  rng = np.random.default_rng(seed)
  rows = []
  for _ in range(n):
    name, thing = rng.choice(NAMES), rng.choice(THINGS)
    a, b = (int(x) for x in rng.integers(1, 20, 2))
    rows.append({"prompt": f"{name} has {a} {thing} and gets {b} more. How many {thing} does {name} have now?",
                 "answer": f"{name} has {a} + {b} = {a + b} {thing}. #### {a + b}"})
  return rows


def _write_jsonl(path, rows):
  path.write_text("".join(json.dumps(r) + "\n" for r in rows))
  return str(path)


def hf_folder(folder, texts, size):
  """A random Qwen3 written by transformers, with a BPE tokenizer trained on `texts`."""
  import tokenizers
  import torch
  import transformers
  from tokenizers import decoders, models, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(texts, trainers.BpeTrainer(
      vocab_size=400, special_tokens=["<|endoftext|>", "<|im_end|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  torch.manual_seed(0)
  config = transformers.Qwen3Config(vocab_size=tok.get_vocab_size(), tie_word_embeddings=True, **size)
  transformers.Qwen3ForCausalLM(config).save_pretrained(folder)
  tok.save(os.path.join(folder, "tokenizer.json"))
  with open(os.path.join(folder, "tokenizer_config.json"), "w") as f:
    json.dump({"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}, f)
  return folder


TINY = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            num_key_value_heads=1, head_dim=16)


def _launch(*args, timeout=600):
  env = dict(os.environ, XLA_FLAGS=FAST_COMPILE, JAX_PLATFORMS="cpu", JAX_DISABLE_MOST_OPTIMIZATIONS="1")
  proc = subprocess.run([sys.executable, os.path.join(ROOT, "launch.py"), *args], cwd=ROOT, env=env,
                        capture_output=True, text=True, timeout=timeout)
  return proc.returncode, proc.stdout, proc.stderr


def _real_model_path(tmp_path, size, preset):
  train = _write_jsonl(tmp_path / "train.jsonl", _rows(48, 0))
  test = _write_jsonl(tmp_path / "test.jsonl", _rows(8, 1))
  texts = [r["prompt"] + " " + r["answer"] for r in _rows(200, 2)]
  model = hf_folder(str(tmp_path / "qwen3"), texts, size)
  workdir = str(tmp_path / "run")
  args = (f"--config={CONFIG}:{preset}", f"--workdir={workdir}", f"--config.model.path={model}",
          "--config.tokenizer.kind=hf", f"--config.data.train_jsonl={train}", f"--config.data.test_jsonl={test}",
          "--config.wandb.mode=offline")
  code, out, err = _launch(*args)
  assert code == 0, err[-3000:]
  # the console: each stage's start and end, each evaluation, the summary with both stages side by side
  # (the loaded model is evaluated once before its first stage's first update, so the gain shows)
  for line in ("stage sft (sft): 2 steps", "eval sft @ step 1, the stage's start (before its first update): "
               "accuracy", "eval sft @ step 2: accuracy", "stage sft: finished 2 steps",
               "stage rl (rl): 2 steps", "eval rl @ step 4: accuracy", "summary"):
    assert line in out, out[-3000:]
  summary = [row.split()[:2] for row in out[out.index("summary"):].splitlines()[2:6]]
  assert summary == [["sft", "start"], ["sft", "2"], ["sft", "gain"], ["rl", "4"]], summary
  assert "note: data.max_prompt_len=0: derived" in err and "note: sft.max_len=0: derived" in err
  assert "Downloading and preparing" not in out + err

  # the result, saved as a Hugging Face folder, loads in transformers with our logits
  import torch
  import transformers
  from rlkit.models import hf
  from rlkit.train.models import load_model
  module, params, tokenizer = load_model(workdir)
  assert tokenizer.vocab_size == module.cfg.vocab_size
  saved = hf.save(str(tmp_path / "saved"), module, params)
  theirs = transformers.AutoModelForCausalLM.from_pretrained(saved, attn_implementation="eager").eval()
  ids = np.asarray([tokenizer.encode("Tom has 3 apples and gets 4 more.")], np.int32)
  ours = np.asarray(module.apply({"params": params}, ids))
  with torch.no_grad():
    ref = theirs(torch.from_numpy(ids).long()).logits.numpy()
  np.testing.assert_allclose(ours, ref, atol=2e-5, rtol=1e-4)

  # rerunning a complete workdir says so, runs nothing and starts no new wandb run
  metrics = open(os.path.join(workdir, "metrics.jsonl")).read()
  runs = sorted(os.listdir(os.path.join(workdir, "wandb")))
  code, out, err = _launch(*args)
  assert code == 0 and "is complete: every stage finished" in out, (out + err)[-3000:]
  assert "stage sft (sft)" not in out and open(os.path.join(workdir, "metrics.jsonl")).read() == metrics
  assert sorted(os.listdir(os.path.join(workdir, "wandb"))) == runs

  # RL alone, from the SFT stage's final checkpoint (kept although max_to_keep=2 rotated past it), no test file
  sft_final = os.path.join(workdir, "checkpoints", "2")
  assert os.path.isdir(sft_final), os.listdir(os.path.join(workdir, "checkpoints"))
  code, out, err = _launch(f"--config={CONFIG}:{preset}", f"--workdir={tmp_path / 'rl_only'}",
                           f"--config.model.path={sft_final}", "--config.tokenizer.kind=hf", "--config.stages=('rl',)",
                           f"--config.data.train_jsonl={train}", "--config.wandb.mode=disabled")
  assert code == 0, err[-3000:]
  assert "stage rl (rl): 2 steps (global steps 1..2)" in out and "evaluation is off" in out, out[-3000:]


def test_hugging_face_model_through_sft_and_rl_on_jsonl(tmp_path):
  _real_model_path(tmp_path, TINY, "test")


@pytest.mark.slow
def test_hugging_face_model_at_qwen3_0_6b_width(tmp_path):
  """The same path with the layer shapes of Qwen3-0.6B (hidden 1024, 16/8 heads of 128, MLP 3072; 4 of its 28
  layers, the small vocabulary of the test tokenizer), to catch what only shows at real widths."""
  _real_model_path(tmp_path, dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=4,
                                  num_attention_heads=16, num_key_value_heads=8, head_dim=128), "test")


def test_readme_jsonl_command_drops_the_arithmetic_parameters(tmp_path):
  train = _write_jsonl(tmp_path / "train.jsonl", _rows(8, 0))
  base = (f"--config={os.path.join(ROOT, 'configs', 'grpo_arith.py')}", f"--workdir={tmp_path / 'run'}",
          "--config.task.name=jsonl", f"--config.data.train_jsonl={train}")
  code, out, err = launch_in_process(*base, "--config.data.max_prompt_len=0", "--config.sft.max_len=0", "--validate_only")
  assert code == 0 and "config OK" in out, err[-2000:]
  assert "its parameters {'max_digits': 2, 'min_digits': 1, 'ops': '+'} are dropped" in err
  code, _, err = launch_in_process(*base)        # the arithmetic config's limits (8 prompt tokens) are too short
  assert code == 2 and "Traceback" not in err, err[-2000:]
  assert "data.max_prompt_len=8 is shorter than the longest example" in err
  assert "raise --config.data.max_prompt_len to at least" in err
  assert not (tmp_path / "run").exists()


def test_print_config_help_and_validate_only(tmp_path):
  arith = os.path.join(ROOT, "configs", "grpo_arith.py")
  code, out, err = launch_in_process(f"--config={arith}:test", "--print_config")
  assert code == 0, err[-2000:]
  assert "rl.advantage = 'group'  # group | batch | none (Dr. GRPO) | rloo" in out
  assert "rl.optimizer.lr = 0.0001  # peak learning rate" in out
  assert "task.kwargs.ops = '+'  # a parameter of task.name='arithmetic'" in out
  code, out, _ = launch_in_process(f"--config={arith}", "--help")
  assert code == 0 and "rlkit/train/config.py" in out and "Presets of" in out
  assert all(f"  {p} " in out for p in ("cpu", "gpu", "test"))
  code, _, err = launch_in_process(f"--config={arith}:tpu", "--validate_only")
  assert code == 2 and err.strip().startswith(f"Config error: --config={arith}:tpu: unknown preset 'tpu'; "
                                              f"presets of {arith}: ") and "\n" not in err.strip(), err
  code, out, _ = launch_in_process(f"--config={arith}", "--validate_only", f"--workdir={tmp_path / 'run'}")
  assert code == 0 and "config OK" in out and not (tmp_path / "run").exists()


def test_readme_python_snippet_runs_outside_the_repository(tmp_path):
  """The README's loading-and-sampling snippet, as written, from another directory: the installed package."""
  readme = open(os.path.join(ROOT, "README.md")).read()
  section = readme[readme.index("## Loading a Hugging Face model"):]
  snippet = section[section.index("```python\n") + len("```python\n"):section.index("```\n", section.index("```python"))]
  model = hf_folder(str(tmp_path / "qwen3"), [r["prompt"] for r in _rows(100, 0)] + ["The capital of France is"],
                    TINY)
  snippet = snippet.replace("/path/to/Qwen3-0.6B", model).replace('"/tmp/out"', repr(str(tmp_path / "out")))
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(XLA_FLAGS=FAST_COMPILE, JAX_PLATFORMS="cpu")
  proc = subprocess.run([sys.executable, "-c", snippet], cwd=str(tmp_path), env=env, capture_output=True,
                        text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-3000:]
  assert (tmp_path / "out" / "model.safetensors").exists() and (tmp_path / "out" / "config.json").exists()


def _readme_commands() -> list[list[str]]:
  """Every `python launch.py --config=configs/grpo_arith.py...` command of the README's bash blocks that sets
  config fields (the recipes), as argv. (The JSONL and HF commands name files of the user's.)"""
  import re
  import shlex
  readme = open(os.path.join(ROOT, "README.md")).read()
  blocks = re.findall(r"```bash\n(.*?)```", readme, re.S)
  commands = []
  for block in blocks:
    for line in block.replace("\\\n", " ").splitlines():
      argv = shlex.split(line, comments=True)
      if (argv[:2] == ["python", "launch.py"] and argv[2].startswith("--config=configs/grpo_arith.py")
          and any(a.startswith("--config.") for a in argv)):
        commands.append(argv[2:])
  return commands


def _rlkit_workdir(path: str) -> str:
  """An rlkit workdir holding one checkpoint of a tiny char model: what the README recipe that starts RL from
  the main job's workdir (/tmp/grpo_arith, which a fresh machine does not have) points at here."""
  import jax
  import optax
  from rlkit.models.tokenizer import CharTokenizer
  from rlkit.parallel.mesh import make_mesh
  from rlkit.train.checkpoint import Checkpointer
  from rlkit.train.models import build_model, model_spec, role_model_defaults
  from rlkit.train.steps import init_train_state
  section = role_model_defaults()
  section.update(hidden_size=32, intermediate_size=48, num_layers=1, num_heads=2, num_kv_heads=1, head_dim=16)
  module, params = build_model(section, CharTokenizer(), jax.random.key(0), make_mesh({"data": 1}, jax.devices()[:1]))
  saver = Checkpointer(os.path.join(path, "checkpoints"), every=1, model_spec=model_spec(module.cfg, {"kind": "char"}))
  saver.save(1, {"train": init_train_state(params, optax.adam(1e-3))}, {"stage_index": 0})
  saver.close()
  return path


def test_readme_recipes_validate(tmp_path):
  """Each README recipe (a launch.py command with --config.* overrides), as written, passes validation; the
  main job's workdir a recipe starts from is a tiny rlkit workdir here."""
  commands = _readme_commands()
  assert len(commands) >= 8
  main_job = _rlkit_workdir(str(tmp_path / "grpo_arith"))
  assert any("--config.model.path=/tmp/grpo_arith" in argv for argv in commands)
  for argv in commands:
    argv = [a.replace("=/tmp/grpo_arith", f"={main_job}") if a.startswith("--config.model.path=") else a
            for a in argv if not a.startswith("--workdir=")]
    code, out, err = launch_in_process(*argv, "--validate_only", f"--workdir={tmp_path / 'run'}")
    assert code == 0 and "config OK" in out, (argv, err[-2000:])
