"""rlkit entry point.

  python launch.py --config=configs/grpo_arith.py[:preset] [--config.a.b=value ...] --workdir=DIR

The whole config is validated before any work: unknown keys, wrong types and unknown registry names stop the
run with one message and a non-zero exit, and nothing is written. Then the resolved config is printed and
saved to DIR/config.json, the CPU is split into `mesh.cpu_devices` devices if set, multi-host JAX is
initialised if the environment asks for it, and the stages run.
Rerunning the same command on an existing DIR resumes from its newest checkpoint; a changed config stops
with the list of changed keys unless --allow_config_change is given.
"""
import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

_CONFIG = config_flags.DEFINE_config_file("config", None, "Experiment config file (configs/x.py[:preset]).",
                                          lock_config=True)
_WORKDIR = flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and plots.")
_TUNED_MALLOC = flags.DEFINE_bool(
    "tuned_malloc", False, "Rerun this command with glibc malloc tuned for large XLA:CPU steps (freed memory "
    "kept, on huge pages; rlkit/parallel/host_memory.py): the M-size train step ran about 1.15x faster; the "
    "main job's small-model RL iteration did not gain.")
_ALLOW_CHANGE = flags.DEFINE_bool(
    "allow_config_change", False, "Resume a workdir whose config.json differs from this run's config (the "
    "changed keys are printed). Without it such a resume stops before any work.")
flags.mark_flags_as_required(["config", "workdir"])


def _flat(tree, prefix=""):
  if isinstance(tree, dict):
    out = {}
    for k, v in tree.items():
      out.update(_flat(v, f"{prefix}{k}."))
    return out
  return {prefix[:-1]: tree}


def changed_keys(old: dict, new: dict) -> list[str]:
  """Dotted keys whose value differs between two resolved configs (added and removed keys included)."""
  a, b = _flat(old), _flat(new)
  return sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))


def _exit_on_config_error(check, *args) -> None:
  from rlkit.train.config import ConfigError
  try:
    check(*args)
  except ConfigError as e:
    print(f"Config error: {e}", file=sys.stderr)
    sys.exit(2)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  if _TUNED_MALLOC.value:
    from rlkit.parallel.host_memory import reexec_with_tuned_malloc
    reexec_with_tuned_malloc()
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)   # Orbax logs every save at INFO; -v 0 brings it back
  from rlkit.train.config import validate, validate_for_processes
  config, workdir = _CONFIG.value, _WORKDIR.value
  _exit_on_config_error(validate, config)
  from rlkit.parallel.mesh import maybe_initialize_distributed, set_cpu_devices
  set_cpu_devices(config.mesh.cpu_devices)
  maybe_initialize_distributed()
  import jax
  _exit_on_config_error(validate_for_processes, config, jax.process_count())
  resolved = config.to_json_best_effort(indent=2, sort_keys=True)
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    changed = changed_keys(json.load(open(path)), json.loads(resolved))
    if changed and not _ALLOW_CHANGE.value:
      print(f"Config error: {workdir} holds a run with a different config; changed keys: {', '.join(changed)}. "
            "Use a new --workdir, or pass --allow_config_change to resume with the new values.", file=sys.stderr)
      sys.exit(2)
    if changed:
      logging.warning("Resuming %s with changed keys: %s", workdir, ", ".join(changed))
  if jax.process_index() == 0:
    print(resolved, flush=True)
    os.makedirs(workdir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
      f.write(resolved + "\n")
    os.replace(path + ".tmp", path)
  from rlkit.train.run import run
  from rlkit.train.stages import TrainingError
  try:
    final = run(config, workdir)
  except TrainingError as e:
    print(f"Training stopped: {e}", file=sys.stderr)
    sys.exit(1)
  if final:
    print(json.dumps({k: v for k, v in final.items() if k.startswith("eval/") or k in ("step", "stage")}))


def _parse_flags(argv):
  """absl's parser, with a bad `--config.<key>=...` override reported in one line instead of a traceback."""
  try:
    return flags.FLAGS(argv)
  except flags.Error as e:
    print(f"Flag error: {e}", file=sys.stderr)
  except (AttributeError, KeyError, TypeError, ValueError) as e:   # raised by ml_collections' override parser
    bad = [a.split("=", 1)[0] for a in argv[1:] if a.startswith("--config.")]
    print(f"Config error: cannot apply the override(s) {', '.join(bad)}: {e!s}. Check the key names in "
          "rlkit/train/config.py (and the value types).", file=sys.stderr)
  sys.exit(2)


if __name__ == "__main__":
  app.run(main, flags_parser=_parse_flags)
