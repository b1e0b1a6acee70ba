"""Registries: every pluggable family (tasks, rewards, advantages, losses, optimizers, ...) is keyed by
the string that appears in configs.

A registry refuses a duplicate name (two modules silently fighting over one config string is a bug that
is very hard to see in results), and an unknown name fails with the list of valid names, so a config
typo is caught by validation before any work starts.
"""
from __future__ import annotations

import difflib
from typing import Callable, Generic, Iterable, Iterator, TypeVar

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
