"""Config sections owned by components: each component registers its section's defaults, its checks and the
model roles it reads beside its code, and a stage kind composes the sections registered for it.

A stage section (e.g. `rl`) is its generic fields plus one sub-section per registered component
(`rl.correction`, `rl.distill`, `rl.sync`, ...). The stage's defaults function adds every registered section
(`add_sections`), its validation runs every section's `check` (`check_sections`), and generic validation asks
every section which `config.models` roles it reads (`section_roles`). So a method that needs a config section
of its own registers a `Section` in `RL_SECTIONS` (its module imported by the config file, before
`get_config` builds the stage) and touches neither the config module nor the generic validation.
"""
from __future__ import annotations

from typing import Callable, Iterable, NamedTuple

import ml_collections

from rlkit.core.errors import ConfigError
from rlkit.core.registry import Registry


def _no_roles(stage, name: str) -> tuple:
  return ()


class Section(NamedTuple):
  """One component's config section.

  defaults: () -> the section's ConfigDict (each field with one trailing comment: the config printer reads them).
  check: (stage section, stage name) -> None; raises ConfigError (or ValueError, reported as one) naming the
    key and the fix. It reads the whole stage section, since some checks relate the component's fields to
    the stage's (e.g. the distillation's cross-tokenizer mode needs `advantage='opd'`).
  roles: (stage section, stage name) -> [(role, why)]: the `config.models` roles this section reads as
    configured, so validation can require them before any work (`why` says which key names the role and why).
  trains: the roles whose weights this component trains if the run declares them (e.g. the critic's
    `models.critic`, its starting point): such a role must be `trainable`, and only trained roles may be.
  """
  defaults: Callable[[], ml_collections.ConfigDict]
  check: Callable[[ml_collections.ConfigDict, str], None]
  roles: Callable[[ml_collections.ConfigDict, str], Iterable[tuple[str, str]]] = _no_roles
  doc: str = ""                 # one line on what the section is, printed beside it by --print_config
  trains: tuple[str, ...] = ()  # `config.models` roles this component trains when the run declares them


RL_SECTIONS: Registry[Section] = Registry("rl config section")


def add_sections(c: ml_collections.ConfigDict, registry: Registry[Section] = RL_SECTIONS) -> ml_collections.ConfigDict:
  """`c` with every registered section's defaults under its name."""
  for name in registry:
    c[name] = registry.get(name).defaults()
  return c


def check_sections(stage: ml_collections.ConfigDict, name: str, registry: Registry[Section] = RL_SECTIONS) -> None:
  """Every registered section's check on stage section `name`; a ValueError becomes a ConfigError."""
  for section in registry:
    if section in stage:
      try:
        registry.get(section).check(stage, name)
      except ConfigError:
        raise
      except ValueError as e:
        raise ConfigError(str(e)) from None


def section_roles(stage: ml_collections.ConfigDict, name: str,
                  registry: Registry[Section] = RL_SECTIONS) -> list[tuple[str, str]]:
  """[(role, why)] of every registered section present in stage section `name`."""
  return [r for section in registry if section in stage for r in registry.get(section).roles(stage, name)]


def section_trains(stage: ml_collections.ConfigDict, registry: Registry[Section] = RL_SECTIONS) -> dict[str, str]:
  """{role: section name} of the roles the sections present in `stage` train when declared."""
  return {role: section for section in registry if section in stage for role in registry.get(section).trains}
