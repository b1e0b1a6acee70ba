"""The rlkit command line (`python launch.py ...`, or the `rlkit` command of the installed package).

  rlkit --config=configs/grpo_arith.py[:preset] [--config.a.b=value ...] --workdir=DIR
  rlkit --config=... --print_config        # the resolved, validated config with each field's comment
  rlkit --config=... --validate_only       # check everything a run would check, run nothing
  rlkit --config=... --help                # where keys are documented, and this config's presets

Every mistake in the config (an unknown key, a wrong type, an unknown registry or preset name, a length
limit the data does not fit) stops with one `Config error: ...` line naming the key and the valid choices,
closest match first, exit code 2, and nothing written. Then the resolved config is saved to DIR/config.json
and the keys where it differs from the config file's own are printed (the overrides, derived lengths; none on
a plain rerun), the CPU is split into `mesh.cpu_devices` devices if set, multi-host JAX is initialised if the
environment asks for it, and the stages run. Rerunning the same command on an existing DIR resumes from its
newest checkpoint; a changed config stops with the list of changed keys unless --allow_config_change.
"""
from __future__ import annotations

import importlib.util
import json
import os
import sys

from absl import app, flags, logging
from ml_collections import config_flags

CONFIG_ERROR = 2   # the exit code of every config mistake

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
_PRINT_CONFIG = flags.DEFINE_bool("print_config", False, "Print the resolved, validated config with each "
                                  "field's comment, and exit (no --workdir needed).")
_VALIDATE_ONLY = flags.DEFINE_bool("validate_only", False, "Check the config and the data against it as a run "
                                   "would, then exit without running (no --workdir needed).")


class _Stop(Exception):
  """A config mistake found before any work: printed as one line, exit CONFIG_ERROR."""


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


# ------------------------------------------------------------------------------------ the config file

def _config_arg(argv) -> tuple[str, str] | None:
  for i, arg in enumerate(argv):
    value = arg.split("=", 1)[1] if arg.startswith("--config=") else argv[i + 1] if (
        arg == "--config" and i + 1 < len(argv)) else None
    if value is not None:
      path, _, preset = value.partition(":")
      return path, preset
  return None


def _load_module(path: str):
  if not os.path.isfile(path):
    raise _Stop(f"--config={path}: no such file. Give a config file, e.g. --config=configs/grpo_arith.py.")
  spec = importlib.util.spec_from_file_location("rlkit_user_config", path)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def presets(module) -> dict[str, str]:
  """{preset: description} a config file declares in its module-level `PRESETS` (empty if none)."""
  return dict(getattr(module, "PRESETS", {}) or {})


def _check_preset(path: str, preset: str) -> None:
  from rlkit.core.registry import closest_first
  known = presets(_load_module(path))
  if preset and known and preset not in known:
    raise _Stop(f"--config={path}:{preset}: unknown preset {preset!r}; presets of {path}: "
                f"{', '.join(closest_first(preset, known))}.")


def _help(argv) -> str:
  lines = [__doc__.split("\n\n", 1)[0], "",
           "Keys: every field is documented once, with its default, in rlkit/train/config.py (stage sections: "
           "sft_defaults, rl_defaults; optimizer: rlkit/optim/optimizers.py); `--print_config` lists them with "
           "their comments. Override any with --config.<section>.<key>=value. Presets: `--config=FILE:preset`, "
           "declared in the config file's PRESETS.", ""]
  found = _config_arg(argv)
  if found:
    path, _ = found
    known = presets(_load_module(path))
    lines.append(f"Presets of {path}:" if known else f"{path} declares no presets (no PRESETS).")
    lines += [f"  {name:10s} {text}" for name, text in known.items()]
    lines.append("")
  lines.append("Flags:")
  for flag in (_CONFIG, _WORKDIR, _PRINT_CONFIG, _VALIDATE_ONLY, _ALLOW_CHANGE, _TUNED_MALLOC):
    lines.append(f"  --{flag.name}: {flags.FLAGS[flag.name].help}")
  return "\n".join(lines)


def _override_error(argv, error: Exception) -> str:
  """One line for an override ml_collections refused: the key, and the valid keys of its section."""
  from rlkit.core.registry import closest_first
  bad = [a.split("=", 1)[0][len("--config."):] for a in argv[1:] if a.startswith("--config.")]
  found = _config_arg(argv)
  if found:
    module = _load_module(found[0])
    config = module.get_config(found[1] or None)
    for key in bad:
      node, parts = config, key.split(".")
      for depth, part in enumerate(parts):
        if not hasattr(node, "keys") or part not in node:
          where = ".".join(parts[:depth]) or "the top level"
          valid = closest_first(part, node.keys()) if hasattr(node, "keys") else []
          return (f"unknown key --config.{key}: {where} has no key {part!r}. Valid keys of {where}: "
                  f"{', '.join(valid) or 'none (an empty section)'}.")
        node = node[part]
  return f"cannot apply the override(s) {', '.join('--config.' + k for k in bad)}: {error!s}."


def parse_flags(argv):
  """absl's parser, with --help answered here and every bad flag or override reported in one line."""
  try:
    if any(a in ("--help", "-h", "--helpfull", "--helpshort", "-?") for a in argv[1:]):
      print(_help(argv))
      sys.exit(0)
    found = _config_arg(argv)
    if found:
      _check_preset(*found)
    try:
      return flags.FLAGS(argv)
    except flags.Error as e:
      message = str(e).replace("flag --config.", "--config.")
      if "Traceback" in message:   # the config file raised: its own message is the last line
        message = f"{found[0] if found else '--config'}: {message.strip().splitlines()[-1]}"
      raise _Stop(message) from None
    except (AttributeError, KeyError, TypeError, ValueError) as e:   # raised by ml_collections' override parser
      raise _Stop(_override_error(argv, e)) from None
  except _Stop as e:
    print(f"Config error: {e}", file=sys.stderr)
    sys.exit(CONFIG_ERROR)


# ------------------------------------------------------------------------------------------- the run

def _reset_kwargs_of_a_renamed_task(config, argv) -> None:
  """`--config.task.name=X` on the command line drops the config file's task.kwargs (they are the parameters
  of the file's task, which X does not take) unless task.kwargs is also given."""
  if not any(a.startswith("--config.task.name=") for a in argv) or any(
      a.startswith("--config.task.kwargs") for a in argv):
    return
  found = _config_arg(argv)
  original = _load_module(found[0]).get_config(found[1] or None)
  if original.task.name != config.task.name and config.task.kwargs.keys():
    print(f"note: task.name={config.task.name!r} replaces {original.task.name!r}; its parameters "
          f"{dict(config.task.kwargs)} are dropped (--config.task.kwargs sets {config.task.name!r}'s own).",
          file=sys.stderr)
    import ml_collections
    config.task.kwargs = ml_collections.ConfigDict()


def _checked(config):
  """The validated config, with derived length limits; raises _Stop."""
  from rlkit.core.errors import ConfigError
  from rlkit.train.config_checks import validate
  from rlkit.train.lengths import resolve_lengths
  from rlkit.train.models import run_tokenizer
  from rlkit.train.catalog import stage_needs
  try:
    validate(config)
    if "data" in stage_needs(config):
      config, notes = resolve_lengths(config, run_tokenizer(config))
      for note in notes:
        print(f"note: {note}", file=sys.stderr)
  except ConfigError as e:
    raise _Stop(str(e)) from None
  return config


def _file_config(argv) -> dict | None:
  """The config as its file builds it (`get_config(preset)`, before the command line's overrides), as JSON;
  None when the command line names no config file."""
  found = _config_arg(argv)
  if found is None:
    return None
  return json.loads(_load_module(found[0]).get_config(found[1] or None).to_json_best_effort())


def config_lines(file_config: dict | None, resolved: dict, name: str, workdir: str) -> list[str]:
  """What a run prints of its config: the keys whose value differs from the config file's, each with the
  file's value, under one line that names the file and where the whole resolved config is.

  Against the file rather than the library defaults: the file (and its preset) is in the command, so the
  difference is exactly what this command line changed (overrides, lengths derived from the data, a renamed
  task's dropped kwargs), a handful of lines, and none on a plain rerun; the ~270 lines of the whole config
  stay in config.json and `--print_config`.
  """
  where = (f"the whole resolved config is in {os.path.join(workdir, 'config.json')} (--print_config prints it "
           "with each field's comment)")
  if file_config is None:
    return [f"config: {where}"]
  a, b = _flat(file_config), _flat(resolved)
  changed = changed_keys(file_config, resolved)
  if not changed:
    return [f"config: {name} as the file sets it; {where}"]
  show = lambda flat, key: json.dumps(flat[key]) if key in flat else "(absent)"   # noqa: E731
  width, value_width = max(len(key) for key in changed), max(len(show(b, key)) for key in changed)
  return [f"config: {name} with {len(changed)} key{'s' * (len(changed) > 1)} changed from the file; {where}:",
          *(f"  {key:{width}s} = {show(b, key):{value_width}s}   (file: {show(a, key)})" for key in changed)]


def _write_config(config, workdir: str, file_config: dict | None = None) -> None:
  import jax
  resolved = config.to_json_best_effort(indent=2, sort_keys=True)
  path = os.path.join(workdir, "config.json")
  if os.path.exists(path):
    changed = changed_keys(json.load(open(path)), json.loads(resolved))
    if changed and not _ALLOW_CHANGE.value:
      raise _Stop(f"{workdir} holds a run with a different config; changed keys: {', '.join(changed)}. Use a "
                  "new --workdir, or pass --allow_config_change to resume with the new values.")
    if changed:
      logging.warning("Resuming %s with changed keys: %s", workdir, ", ".join(changed))
  if jax.process_index() == 0:
    name = ":".join(p for p in _config_arg(sys.argv) or () if p)
    print("\n".join(config_lines(file_config, json.loads(resolved), name, workdir)), flush=True)
    os.makedirs(workdir, exist_ok=True)
    with open(path + ".tmp", "w") as f:
      f.write(resolved + "\n")
    os.replace(path + ".tmp", path)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"Unexpected arguments: {' '.join(argv[1:])}")
  if _TUNED_MALLOC.value:
    from rlkit.parallel.host_memory import reexec_with_tuned_malloc
    reexec_with_tuned_malloc()
  if not flags.FLAGS["verbosity"].present:
    logging.set_verbosity(logging.WARNING)   # Orbax logs every save at INFO; -v 0 brings it back
  try:
    if _CONFIG.value is None:
      raise _Stop("--config is required, e.g. --config=configs/grpo_arith.py (see --help).")
    config = _CONFIG.value
    _reset_kwargs_of_a_renamed_task(config, sys.argv)
    config = _checked(config)
    if _PRINT_CONFIG.value:
      from rlkit.train.config_docs import annotated
      print(annotated(config))
      return
    if _VALIDATE_ONLY.value:
      print(f"config OK: {_config_arg(sys.argv)[0]} with stages {', '.join(config.stages)} (nothing was run).")
      return
    if not _WORKDIR.value:
      raise _Stop("--workdir is required to run (it holds checkpoints, metrics and plots).")
    from rlkit.parallel.mesh import maybe_initialize_distributed, set_cpu_devices
    set_cpu_devices(config.mesh.cpu_devices)
    maybe_initialize_distributed()
    import jax
    from rlkit.core.errors import ConfigError
    from rlkit.train.config_checks import validate_for_processes
    try:
      validate_for_processes(config, jax.process_count())
      from rlkit.train.weight_sync import check_sampler_meshes
      check_sampler_meshes(config, jax.devices())      # a sampler mesh (rl.sync.mesh) needs the devices
    except ConfigError as e:
      raise _Stop(str(e)) from None
    _write_config(config, _WORKDIR.value, _file_config(sys.argv))
  except _Stop as e:
    print(f"Config error: {e}", file=sys.stderr)
    sys.exit(CONFIG_ERROR)
  from rlkit.train.run import run
  from rlkit.core.errors import TrainingError
  try:
    final = run(config, _WORKDIR.value)
  except TrainingError as e:
    print(f"Training stopped: {e}", file=sys.stderr)
    sys.exit(1)
  if final:
    print(json.dumps({k: v for k, v in final.items() if k.startswith("eval/") or k in ("step", "stage")}))


def console_main() -> None:
  """The `rlkit` console script."""
  app.run(main, flags_parser=parse_flags)
