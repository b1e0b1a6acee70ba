"""Chat templates for token-in/token-out multi-turn rollouts: exact ChatML prompts and deltas over three turns
(conversation text + delta is always the full rendering), refusal of templates that rewrite seen text (Qwen3-style
<think> stripping, trimmed content), template exceptions, the three folder layouts, determinism, and parity with
transformers' renderer."""
import json

import pytest

from rlkit.rollout.chat import ChatTemplate, Conversation, TemplateRewriteError, observe, start

# Qwen2.5's basic structure, without its default system prompt and tool-call formatting.
CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# Like Qwen3's: earlier assistant turns lose their <think> block (and the newlines after it); only the latest
# assistant turn is kept as written.
THINK_STRIPPING = (
    "{% set ns = namespace(last=-1) %}"
    "{% for message in messages %}{% if message.role == 'assistant' %}{% set ns.last = loop.index0 %}{% endif %}"
    "{% endfor %}"
    "{% for message in messages %}"
    "{% set content = message.content %}"
    "{% if message.role == 'assistant' and loop.index0 < ns.last and '</think>' in content %}"
    "{% set content = content.split('</think>')[-1].lstrip('\n') %}"
    "{% endif %}"
    "{{ '<|im_start|>' + message.role + '\n' + content + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

TRIMMING = CHATML.replace("message['content']", "(message['content'] | trim)")
ENDS = ("<|im_end|>", "<|endoftext|>")


def test_chatml_prompt_and_deltas_over_three_turns():
  t = ChatTemplate(CHATML)
  conv = start(t, "What is 2+2?", system="Be brief.")
  assert conv.text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is 2+2?<|im_end|>\n"
                       "<|im_start|>assistant\n")
  assert isinstance(conv, Conversation) and conv.messages == ({"role": "system", "content": "Be brief."},
                                                               {"role": "user", "content": "What is 2+2?"})
  assert start(t, "hi").text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
  turns = [("<tool_call>add(2, 2)</tool_call><|im_end|>", "4"),
           ("Checking.<|im_end|>", "ok"),
           ("<think>\nsure\n</think>\n\nDone <|im_end|>", "bye")]
  for sampled, obs in turns:
    conv_before = conv
    conv, delta = observe(t, conv, sampled, obs, ENDS)
    assert delta == f"\n<|im_start|>tool\n{obs}<|im_end|>\n<|im_start|>assistant\n"
    assert conv_before.text + sampled + delta == conv.text == t.render(conv.messages, add_generation_prompt=True)
    assert conv.messages[-2:] == ({"role": "assistant", "content": sampled.rsplit("<|", 1)[0]},
                                  {"role": "tool", "content": obs})
  assert len(conv.messages) == 2 + 2 * len(turns)


def test_a_turn_stopped_without_an_end_text_gets_the_templates_end_in_the_delta():
  t = ChatTemplate(CHATML)
  conv = start(t, "Add 2 and 2.")
  sampled = '<tool_call>{"name": "add"}</tool_call>'
  new, delta = observe(t, conv, sampled, "4", ENDS, role="user")
  assert delta == "<|im_end|>\n<|im_start|>user\n4<|im_end|>\n<|im_start|>assistant\n"
  assert conv.text + sampled + delta == new.text
  # Only one trailing end text is cut: a second one is the model's own content.
  new, delta = observe(t, conv, "x<|im_end|><|im_end|>", "4", ENDS)
  assert new.messages[-2]["content"] == "x<|im_end|>" and delta.startswith("\n<|im_start|>tool\n")


def test_think_stripping_template_is_refused_at_the_second_observation():
  t = ChatTemplate(THINK_STRIPPING)
  conv = start(t, "q")
  conv, _ = observe(t, conv, "<think>\nplan\n</think>\n\n<tool_call>a</tool_call><|im_end|>", "r1", ENDS)
  with pytest.raises(TemplateRewriteError) as info:
    observe(t, conv, "<think>\nmore\n</think>\n\nanswer<|im_end|>", "r2", ENDS)
  # The first assistant turn starts right after the prompt; "<think>" and "<tool_call>" share their first 2 chars.
  position = len(start(t, "q").text) + len("<t")
  message = str(info.value)
  assert f"at character {position} " in message
  assert "saw:   'hink>\\nplan\\n</think>\\n\\n<tool_" in message and "rendered:    'ool_call>a</tool_call>" in message
  assert "rl.multi_turn.renderer='plain'" in message and isinstance(info.value, ValueError)


def test_trimming_template_is_refused_when_the_turn_ends_with_whitespace():
  t = ChatTemplate(TRIMMING)
  conv = start(t, "q")
  conv, delta = observe(t, conv, "fine<|im_end|>", "r", ENDS)       # nothing to trim: accepted
  assert delta == "\n<|im_start|>tool\nr<|im_end|>\n<|im_start|>assistant\n"
  with pytest.raises(TemplateRewriteError, match=r"(?s)at character \d+ .*the model saw: +' \\n<\|im_end\|>'"):
    observe(t, conv, "answer \n<|im_end|>", "r", ENDS)


def test_a_turn_ended_by_another_stop_token_is_refused_with_the_reason():
  # The model saw "<|endoftext|>" where the template writes "<|im_end|>": appending would leave a context that no
  # rendering of the conversation gives.
  t = ChatTemplate(CHATML)
  with pytest.raises(TemplateRewriteError, match="the turn ended with '<\\|endoftext\\|>', which the template"):
    observe(t, start(t, "q"), "Checking.<|endoftext|>", "r", ENDS)


def test_raise_exception_surfaces_as_a_value_error_with_the_templates_message():
  t = ChatTemplate("{% if messages[0].role != 'user' %}{{ raise_exception('Conversations must start with a "
                   "user message.') }}{% endif %}{{ messages[0].content }}")
  assert t.render([{"role": "user", "content": "hi"}], add_generation_prompt=False) == "hi"
  with pytest.raises(ValueError, match="Conversations must start with a user message."):
    t.render([{"role": "system", "content": "s"}], add_generation_prompt=False)
  with pytest.raises(ValueError, match="does not compile.*line 1"):
    ChatTemplate("{% for m in messages %}")


@pytest.mark.parametrize("layout", ["jinja", "json", "config_str", "config_list"])
def test_from_folder_reads_each_layout(tmp_path, layout):
  source = "{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}"
  config = {"bos_token": "<s>", "eos_token": {"content": "</s>", "special": True}}
  if layout == "jinja":
    (tmp_path / "chat_template.jinja").write_text(source)
    config["chat_template"] = "ignored: chat_template.jinja comes first"
  elif layout == "json":
    (tmp_path / "chat_template.json").write_text(json.dumps({"chat_template": source}))
  elif layout == "config_str":
    config["chat_template"] = source
  else:
    config["chat_template"] = [{"name": "tool_use", "template": "wrong"}, {"name": "default", "template": source}]
  (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
  t = ChatTemplate.from_folder(tmp_path)
  assert t.render([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], False) == "<s>a</s>b</s>"


def test_from_folder_errors_name_the_folder_and_what_is_missing(tmp_path):
  with pytest.raises(FileNotFoundError, match=f"{tmp_path} has no chat template: no chat_template.jinja"):
    ChatTemplate.from_folder(tmp_path)
  with pytest.raises(FileNotFoundError, match="is not a folder"):
    ChatTemplate.from_folder(tmp_path / "missing")
  (tmp_path / "tokenizer_config.json").write_text(json.dumps({"chat_template": [{"name": "rag", "template": "x"}]}))
  with pytest.raises(ValueError, match=r"lists templates \['rag'\] but none named 'default'"):
    ChatTemplate.from_folder(tmp_path)


def test_rendering_is_deterministic_and_keeps_no_state_between_calls():
  t = ChatTemplate("{% set ns = namespace(n=0) %}{% for m in messages %}{% set ns.n = ns.n + 1 %}"
                   "{{ ns.n }}:{{ m | tojson }};{% endfor %}")
  one, two = [{"role": "user", "content": "é <b>"}], [{"role": "user", "content": "x"}] * 3
  first = t.render(one, add_generation_prompt=False)
  t.render(two, add_generation_prompt=True)
  assert t.render(one, add_generation_prompt=False) == first == '1:{"role": "user", "content": "é <b>"};'


def test_matches_transformers_rendering():
  chat_template_utils = pytest.importorskip("transformers.utils.chat_template_utils")
  source = ("{{ bos_token }}{% for m in messages %}{% if m.role == 'skip' %}{% continue %}{% endif %}"
            "{% generation %}  {{ m.role }}: {{ m | tojson(indent=2) }}\n{% endgeneration %}\n"
            "  {% if loop.index > 3 %}{% break %}{% endif %}\n{% endfor %}"
            "{% if add_generation_prompt %}{{ eos_token }}>{% endif %}")
  messages = [{"role": "user", "content": "é \"q\" <x>"}, {"role": "skip", "content": "-"},
              {"role": "assistant", "content": "a\n"}, {"role": "tool", "content": "t"},
              {"role": "user", "content": "late"}]
  for gen in (False, True):
    ours = ChatTemplate(source, bos_token="<s>", eos_token="</s>").render(messages, gen)
    theirs = chat_template_utils.render_jinja_template([messages], chat_template=source, add_generation_prompt=gen,
                                                       bos_token="<s>", eos_token="</s>")[0][0]
    assert ours == theirs
