"""Each config field's one-line comment, read from the source of the `*_defaults()` functions that define it,
and the resolved config printed with them (`launch.py --print_config`).

Fields are documented once, as the trailing comment of their assignment in `rlkit/train/config.py` (and the
optimizer and role-model sections), so the printout can never disagree with the code: it *is* the code's
comments. A defaults function that builds a section from another (`c = model_defaults()`, `c.optimizer =
optimizer_defaults()`) contributes that function's comments under the section's prefix, and a helper that adds
shared fields to the section (`env_fields(c)`, any `*_fields(c)` call on its own line) contributes its own.
"""
from __future__ import annotations

import functools
import inspect
import io
import re
import tokenize
from typing import Callable

import ml_collections

from rlkit.core.sections import RL_SECTIONS
from rlkit.train.catalog import STAGES
from rlkit.train.config import base_config
from rlkit.train.models import role_model_defaults

_ASSIGN = re.compile(r"^\s*c((?:\.\w+)*)\s*=\s*(\w+)?")
_CALL = re.compile(r"^\s*c(?:\.\w+)*\s*=\s*(\w+)\(\)\s*$")
_FIELDS = re.compile(r"^\s*(\w+_fields)\(c\)\s*$")   # a helper that adds shared fields to the section, e.g. env_fields(c)


@functools.lru_cache(maxsize=None)
def field_comments(fn: Callable[[], ml_collections.ConfigDict]) -> dict[str, str]:
  """{dotted key relative to the section fn builds: comment} for every commented field of `fn`."""
  source = inspect.getsource(fn)
  comments: dict[int, str] = {}
  for tok in tokenize.generate_tokens(io.StringIO(source).readline):
    if tok.type == tokenize.COMMENT:
      comments[tok.start[0]] = tok.string.lstrip("#").strip()
  out, last = {}, None
  for number, line in enumerate(source.splitlines(), start=1):
    helper = _FIELDS.match(line.split("#", 1)[0])
    if helper and callable(fn.__globals__.get(helper.group(1))):
      out.update(field_comments(fn.__globals__[helper.group(1)]))
      last = None
      continue
    match = _ASSIGN.match(line)
    if match:
      key = match.group(1).lstrip(".")
      called = _CALL.match(line.split("#", 1)[0])
      sub = fn.__globals__.get(called.group(1)) if called else None
      if callable(sub) and sub.__name__.endswith("_defaults"):   # a section built by another defaults fn
        out.update({f"{key}.{k}" if key else k: v for k, v in field_comments(sub).items()})
      last = key if key else None
      if key and number in comments:
        out[key] = comments[number]
    elif last and line.strip().startswith("#") and number in comments and last in out:
      out[last] += " " + comments[number]                      # a comment continued on the next line
    else:
      last = None
  return out


def config_comments(config: ml_collections.ConfigDict) -> dict[str, str]:
  """{dotted key: comment} for a whole run config: the base sections, every stage section by its kind (with the
  components' registered sections, `rlkit.core.sections`), and every model role."""
  out = dict(field_comments(base_config))
  for key in config.keys():
    section = config[key]
    if isinstance(section, ml_collections.ConfigDict) and "kind" in section and section.kind in STAGES:
      out.update({f"{key}.{k}": v for k, v in field_comments(STAGES.get(section.kind).defaults).items()})
      for name in RL_SECTIONS:
        if name in section:
          entry = RL_SECTIONS.get(name)
          out.update({f"{key}.{name}.{k}": v for k, v in field_comments(entry.defaults).items()})
          if entry.doc:
            out[f"{key}.{name}"] = entry.doc
  for role in config.get("models", {}).keys():
    out.update({f"models.{role}.{k}": v for k, v in field_comments(role_model_defaults).items()})
  return out


def _leaves(tree, prefix: str = ""):
  for key, value in tree.items():
    if isinstance(value, (dict, ml_collections.ConfigDict)) and len(value):
      yield from _leaves(value, f"{prefix}{key}.")
    else:
      yield f"{prefix}{key}", value


def _get(config, dotted: str):
  for part in dotted.split("."):
    config = config[part]
  return config


def annotated(config: ml_collections.ConfigDict) -> str:
  """One `key = value  # comment` line per field, in the config's order, sections separated by a blank."""
  comments = config_comments(config)
  lines, section = [], None
  for key, value in _leaves(config.to_dict()):
    top = key.split(".", 1)[0]
    if section is not None and top != section:
      lines.append("")
    section = top
    value = repr(value) if not isinstance(value, dict) else "{}"
    note = comments.get(key)
    if note is None and ".kwargs." in key:   # free-form: the parameters of the component the section names
      owner = key.split(".kwargs.", 1)[0]
      note = f"a parameter of {owner}.name={_get(config, owner + '.name')!r}"
    lines.append(f"{key} = {value}" + (f"  # {note}" if note else ""))
  return "\n".join(lines)
