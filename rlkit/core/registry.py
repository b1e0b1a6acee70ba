"""Registries: every pluggable family (tasks, rewards, advantages, losses, optimizers, ...) is keyed by
the string that appears in configs.

A registry refuses a duplicate name (two modules silently fighting over one config string is a bug that
is very hard to see in results), and an unknown name fails with the list of valid names, so a config
typo is caught by validation before any work starts.
"""
from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterable, Iterator, TypeVar

from rlkit.core.errors import ConfigError

T = TypeVar("T")


def closest_first(name: str, choices: Iterable[str]) -> list[str]:
  """`choices` sorted for an error message: the close matches of `name` first (best first), then the rest
  alphabetically, so a typo's fix is the first name the user reads."""
  choices = sorted(set(choices))
  if not choices:
    return []
  close = difflib.get_close_matches(str(name), choices, n=len(choices), cutoff=0.6)
  return close + [c for c in choices if c not in close]


class Registry(Generic[T]):
  """A named family of pluggable components.

  >>> losses = Registry("policy_loss")
  >>> @losses.register("ppo")
  ... def ppo(x): return x
  >>> losses.get("ppo")(1)
  1
  """

  def __init__(self, kind: str):
    self.kind = kind
    self._entries: dict[str, T] = {}

  def register(self, name: str) -> Callable[[T], T]:
    def decorator(obj: T) -> T:
      self.add(name, obj)
      return obj
    return decorator

  def add(self, name: str, obj: T) -> None:
    if not isinstance(name, str) or not name:
      raise ValueError(f"{self.kind} registry: names must be non-empty strings, got {name!r}.")
    if name in self._entries:
      raise ValueError(
          f"{self.kind} registry: {name!r} is already registered (by {self._entries[name]!r}); "
          "pick another name or remove the duplicate registration.")
    self._entries[name] = obj

  def get(self, name: str) -> T:
    try:
      return self._entries[name]
    except KeyError:
      raise KeyError(
          f"Unknown {self.kind} {name!r}. Valid {self.kind} names: "
          f"{', '.join(closest_first(name, self._entries))}."
      ) from None

  def check(self, name: str, key: str = "") -> None:
    """Raises a ValueError naming the config `key` if `name` is not registered."""
    if name not in self._entries:
      where = f"{key}=" if key else ""
      raise ValueError(
          f"{where}{name!r} is not a known {self.kind}; choose one of: "
          f"{', '.join(closest_first(name, self._entries))}.")

  def names(self) -> list[str]:
    return sorted(self._entries)

  def __contains__(self, name: str) -> bool:
    return name in self._entries

  def __iter__(self) -> Iterator[str]:
    return iter(sorted(self._entries))

  def __len__(self) -> int:
    return len(self._entries)


def choice(name: str, registry: Registry, key: str) -> None:
  """`ConfigError` naming the config `key` and the valid names unless `name` is registered in `registry`."""
  try:
    registry.check(name, key)
  except ValueError as e:
    raise ConfigError(str(e)) from None


class IdRegistry:
  """Names with consecutive int32 ids, for per-row or per-token labels stored in arrays (row sources,
  segment kinds). Ids are given in registration order and never change, so arrays written by one module
  read the same in every other; methods add names of their own with `add`.

  >>> kinds = IdRegistry("segment kind", ("prompt", "policy"))
  >>> kinds["policy"], kinds.name(0), list(kinds)
  (1, 'prompt', ['prompt', 'policy'])
  """

  def __init__(self, kind: str, names: Iterable[str] = ()):
    self.kind = kind
    self._ids: dict[str, int] = {}
    for name in names:
      self.add(name)

  def add(self, name: str) -> int:
    """Registers `name` and returns its id; registering a name twice raises."""
    if not isinstance(name, str) or not name:
      raise ValueError(f"{self.kind} registry: names must be non-empty strings, got {name!r}.")
    if name in self._ids:
      raise ValueError(f"{self.kind} registry: {name!r} is already registered (id {self._ids[name]}).")
    self._ids[name] = len(self._ids)
    return self._ids[name]

  def __getitem__(self, name: str) -> int:
    try:
      return self._ids[name]
    except KeyError:
      raise KeyError(f"Unknown {self.kind} {name!r}. Valid {self.kind} names: "
                     f"{', '.join(closest_first(name, self._ids))}.") from None

  def name(self, id_: int) -> str:
    return list(self._ids)[int(id_)]

  def __contains__(self, name) -> bool:
    return name in self._ids

  def __iter__(self) -> Iterator[str]:
    return iter(list(self._ids))

  def __len__(self) -> int:
    return len(self._ids)

  def __repr__(self) -> str:
    return repr(tuple(self._ids))
