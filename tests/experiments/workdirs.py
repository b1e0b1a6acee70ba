"""What the experiment-driver tests share: finished workdirs written by hand (a config and metrics rows, as a run
leaves them), a guard that lets a driver's `launch` through only for finished workdirs, so a test never trains, and
a one-layer stand-in for the pretrained base."""
import json
import os


def write_workdir(path, config, rows):
  """A workdir as a finished run leaves it: config.json and metrics.jsonl (one JSON object a row)."""
  os.makedirs(path, exist_ok=True)
  with open(os.path.join(path, "config.json"), "w") as f:
    json.dump(config, f)
  with open(os.path.join(path, "metrics.jsonl"), "w") as f:
    f.writelines(json.dumps(r) + "\n" for r in rows)


def no_training(monkeypatch, module):
  """`module.launch` allowed only for finished workdirs (which `launch` skips): the test fails where a driver
  would have trained."""
  real = module.launch

  def launch(root, path, *args, **kw):
    assert module.finished(path), f"the test would have trained {path}"
    return real(root, path, *args, **kw)
  monkeypatch.setattr(module, "launch", launch)


def stand_in_model(folder, tok) -> str:
  """A Hugging Face folder like experiments/base/model, in a second: a one-layer Qwen3-shaped model of `tok`'s
  vocabulary, random weights, saved with the tokenizer under `folder`/model."""
  import jax
  from rlkit.models import hf
  from rlkit.models.transformer import TransformerConfig, init_params
  cfg = TransformerConfig(vocab_size=tok.vocab_size, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=1,
                          num_kv_heads=1, head_dim=16, tie_word_embeddings=True)
  return str(hf.save(os.path.join(str(folder), "model"), cfg, init_params(cfg, jax.random.key(0)), tokenizer=tok))
