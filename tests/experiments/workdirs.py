"""What the experiment-driver tests share: finished workdirs written by hand (a config and metrics rows, as a run
leaves them) and a guard that lets a driver's `launch` through only for finished workdirs, so a test never trains."""
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
