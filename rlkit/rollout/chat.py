"""Hugging Face chat templates for token-in/token-out multi-turn rollouts: render a conversation as transformers'
`apply_chat_template` does, and compute the text to append after each environment observation.

A multi-turn collector samples the policy's turn into a live KV cache, then appends the observation as tokens.
The trainer must see exactly the sampled tokens, so earlier turns are never re-tokenized: after each turn the
conversation is re-rendered, and only the text past what the model has already seen is encoded and appended:

  seen_k     = rendering_k + sampled_k                 (rendering_0 = start(): [system?, user] + generation prompt)
  rendering' = render(messages + [assistant(sampled_k minus one end text), observation], generation prompt)
  delta      = rendering'[len(seen_k):]                required: rendering'.startswith(seen_k)

The requirement is what makes the delta safe: a template that rewrites an earlier turn (Qwen3's drops the
`<think>` blocks of earlier assistant turns; others trim whitespace, or stamp the date with `strftime_now`) would
give the trainer text the model never saw, so it is refused with `TemplateRewriteError`. When the policy stopped
without an end token (on "</tool_call>", say), the delta starts with the end text the template writes.
"""
from __future__ import annotations

import datetime
import json
import os
from pathlib import Path
from typing import Any, NamedTuple, Sequence, Union

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

from rlkit.models.tokenizer import _read_json, _token_text

_CONTEXT = 40   # characters shown on each side of the first difference in a TemplateRewriteError


class TemplateRewriteError(ValueError):
  """The chat template changes text the model has already seen."""


class _TemplateRaised(Exception):
  """`raise_exception(message)` called by the template; `render` turns it into a ValueError."""


class _Generation(jinja2.ext.Extension):
  """transformers' `{% generation %}...{% endgeneration %}` tag (it marks assistant text for a loss mask);
  here it renders its body unchanged, so that templates which use it compile."""
  tags = {"generation"}

  def parse(self, parser):
    lineno = next(parser.stream).lineno
    body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
    return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

  def _body(self, caller):
    return caller()


class _Namespace(jinja2.utils.Namespace):
  # As transformers does: chat templates are untrusted code from the Hub, and a namespace that accepted
  # underscore attributes would hand them a path to Python internals.
  def __init__(*args, **kwargs):
    self, attrs = args[0], dict(*args[1:], **kwargs)
    for name in attrs:
      _Namespace._check(name)
    jinja2.utils.Namespace.__init__(self, attrs)

  def __setitem__(self, name, value):
    _Namespace._check(name)
    jinja2.utils.Namespace.__setitem__(self, name, value)

  @staticmethod
  def _check(name):
    if isinstance(name, str) and name.startswith("_"):
      raise jinja2.exceptions.SecurityError(f"chat templates cannot set underscore attributes ({name!r}).")


def _raise_exception(message):
  raise _TemplateRaised(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
  # Jinja's own tojson escapes HTML characters ("<" -> "\u003c"), which transformers' does not.
  return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
  return datetime.datetime.now().strftime(fmt)


def _template_source(value: Any, where: Path) -> str:
  """A `chat_template` entry: a string, or a list of {"name", "template"} of which "default" is the one used."""
  if isinstance(value, str):
    return value
  if isinstance(value, list):
    named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
    if isinstance(named.get("default"), str):
      return named["default"]
    raise ValueError(f"{where}: 'chat_template' lists templates {sorted(map(str, named))} but none named "
                     "'default'; write the one to use to chat_template.jinja beside it.")
  raise ValueError(f"{where}: 'chat_template' is a {type(value).__name__}, not a string or a list of "
                   "{'name', 'template'}; write the template to chat_template.jinja beside it.")


class ChatTemplate:
  """A Hugging Face chat template (Jinja), rendered as transformers renders it: sandboxed, `trim_blocks` and
  `lstrip_blocks`, loop controls, and the `raise_exception`, `strftime_now` and `tojson` helpers."""

  def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[_Generation, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now, namespace=_Namespace)
    try:
      self._template = env.from_string(source)   # compiled once; every render reuses it
    except jinja2.TemplateSyntaxError as e:
      raise ValueError(f"The chat template does not compile: {e.message} (template line {e.lineno}). Fix the "
                       "template, or use the plain renderer rl.multi_turn.renderer='plain'.") from None
    self.source, self.bos_token, self.eos_token = source, bos_token, eos_token

  @classmethod
  def from_folder(cls, path: Union[str, os.PathLike]) -> "ChatTemplate":
    """The template of a Hugging Face model or tokenizer folder, looked up where transformers looks:
    chat_template.jinja, else chat_template.json's "chat_template", else tokenizer_config.json's. BOS and EOS
    texts come from tokenizer_config.json (else special_tokens_map.json)."""
    folder = Path(path)
    if not folder.is_dir():
      raise FileNotFoundError(f"{folder} is not a folder; pass the Hugging Face model or tokenizer folder that "
                              "holds the chat template.")
    config = {**_read_json(os.fspath(folder / "special_tokens_map.json")),
              **_read_json(os.fspath(folder / "tokenizer_config.json"))}
    if (folder / "chat_template.jinja").is_file():
      source = (folder / "chat_template.jinja").read_text()
    elif (folder / "chat_template.json").is_file():
      where = folder / "chat_template.json"
      entry = json.loads(where.read_text())
      if not isinstance(entry, dict) or "chat_template" not in entry:
        raise ValueError(f"{where} has no 'chat_template' entry; write the template to chat_template.jinja "
                         "instead.")
      source = _template_source(entry["chat_template"], where)
    elif "chat_template" in config:
      source = _template_source(config["chat_template"], folder / "tokenizer_config.json")
    else:
      raise FileNotFoundError(
          f"{folder} has no chat template: no chat_template.jinja, no chat_template.json, and no 'chat_template' "
          "in tokenizer_config.json. Copy the model's template there (transformers' save_pretrained writes "
          "chat_template.jinja), or use the plain renderer rl.multi_turn.renderer='plain'.")
    return cls(source, bos_token=_token_text(config.get("bos_token")) or "",
               eos_token=_token_text(config.get("eos_token")) or "")

  def render(self, messages: Sequence[dict], add_generation_prompt: bool) -> str:
    """The template's text for `messages` ({"role", "content"} dicts), ending with the assistant's header when
    `add_generation_prompt`. A `raise_exception` in the template becomes a ValueError with its message."""
    try:
      return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt,
                                   bos_token=self.bos_token, eos_token=self.eos_token, tools=None, documents=None)
    except _TemplateRaised as e:
      raise ValueError(f"The chat template refused these messages: {e}") from None


class Conversation(NamedTuple):
  """A conversation in progress. `text` is what the model has seen: the rendering its tokens came from, plus the
  text it sampled since."""
  messages: tuple[dict, ...]   # the messages rendered so far
  text: str


def start(template: ChatTemplate, prompt: str, system: str = "") -> Conversation:
  """The first turn: [system?, user(prompt)] with the generation prompt; `.text` is the prompt to encode."""
  messages = (({"role": "system", "content": system},) if system else ()) + ({"role": "user", "content": prompt},)
  return Conversation(messages, template.render(messages, add_generation_prompt=True))


def _first_difference(a: str, b: str) -> int:
  n = min(len(a), len(b))
  return next((i for i in range(n) if a[i] != b[i]), n)


def observe(template: ChatTemplate, conv: Conversation, sampled: str, observation: str, end_texts: Sequence[str],
            role: str = "tool") -> tuple[Conversation, str]:
  """`(conversation, delta)` after the policy's turn `sampled` and the environment's `observation`; the caller
  encodes `delta` and appends it to the tokens it already has (the prompt, the sampled tokens).

  `sampled` is the decoded turn WITH its special tokens. `end_texts` are the texts of the stop tokens (e.g.
  "<|im_end|>", "<|endoftext|>"); one trailing end text, the longest that matches, is cut from the assistant
  message's content, since the template writes its own. Required, because an end text left in the content
  would be written twice and still pass the prefix check. Raises TemplateRewriteError when the new rendering
  does not start with `conv.text + sampled`.
  """
  content = sampled
  ends = [e for e in end_texts if e and sampled.endswith(e)]
  if ends:
    content = sampled[:-len(max(ends, key=len))]
  messages = conv.messages + ({"role": "assistant", "content": content}, {"role": role, "content": observation})
  rendered = template.render(messages, add_generation_prompt=True)
  seen = conv.text + sampled
  if not rendered.startswith(seen):
    i = _first_difference(seen, rendered)
    lo, turn = max(0, i - _CONTEXT), sum(m.get("role") == "assistant" for m in messages)
    # A difference inside the cut end text: the policy stopped on a token the template does not end turns with.
    hint = (f" (the turn ended with {sampled[len(content):]!r}, which the template does not write after an "
            "assistant turn: stop turns on the template's end token only, or end the episode on this one)"
            if len(conv.text) + len(content) <= i < len(seen) else "")
    raise TemplateRewriteError(
        f"The chat template changes text the model has already seen: after assistant turn {turn} "
        f"and a {role!r} message, the rendering differs from the previous rendering plus the sampled text at "
        f"character {i} (of {len(seen)} seen){hint}.\n  before it, both: {seen[lo:i]!r}\n"
        f"  the model saw:   {seen[i:i + _CONTEXT]!r}\n  now rendered:    {rendered[i:i + _CONTEXT]!r}\n"
        "Appending tokens then would train on text the model never saw. Fix: use a template that only appends "
        "(one that keeps earlier turns verbatim: no stripping of <think> blocks or whitespace, no dates), or the "
        "plain renderer rl.multi_turn.renderer='plain'.")
  return Conversation(messages, rendered), rendered[len(seen):]
