"""`hf.save(..., tokenizer=...)`: the saved folder carries the tokenizer, so that `HFTokenizer(folder)` and
`transformers.AutoTokenizer.from_pretrained(folder)` load it and encode, decode and stop as the source did."""
import json
import os

import jax
import pytest
import transformers

from rlkit.models import hf
from rlkit.models.tokenizer import CharTokenizer, HFTokenizer
from rlkit.models.transformer import TransformerConfig, init_params

TEXTS = ["Tom has 3 apples and gets 4 more.", "How many pens does Ann have now?", "The capital of France is"]
CHAT_TEMPLATE = "{% for m in messages %}<|im_start|>{{ m['content'] }}<|im_end|>{% endfor %}"


@pytest.fixture(scope="module")
def source(tmp_path_factory):
  """A Hugging Face tokenizer folder: byte-level BPE, EOS <|im_end|>, pad <|endoftext|>, a chat template,
  and a generation config that also stops on <|endoftext|> (as Qwen instruct models do)."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers
  tok = tokenizers.Tokenizer(models.BPE())
  tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
  tok.decoder = decoders.ByteLevel()
  tok.train_from_iterator(TEXTS * 10, trainers.BpeTrainer(
      vocab_size=300, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
      initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
  folder = tmp_path_factory.mktemp("source")
  tok.save(str(folder / "tokenizer.json"))
  (folder / "tokenizer_config.json").write_text(json.dumps(
      {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
       "chat_template": CHAT_TEMPLATE, "clean_up_tokenization_spaces": False}))
  (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": [2, 0]}))
  return folder


@pytest.fixture(scope="module")
def model():
  cfg = TransformerConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                          num_kv_heads=1, head_dim=16)
  return cfg, init_params(cfg, jax.random.key(0))


def _assert_same_tokenizer(saved: HFTokenizer, want: HFTokenizer):
  assert (saved.vocab_size, saved.eos_id, saved.pad_id, saved.bos_id) == (
      want.vocab_size, want.eos_id, want.pad_id, want.bos_id)
  assert saved.stop_ids == want.stop_ids == (2, 0)      # generation_config.json's second stop token kept
  for text in TEXTS:
    ids = want.encode(text)
    assert saved.encode(text) == ids and saved.decode(ids) == text


@pytest.mark.parametrize("how", ["object", "folder"])
def test_saved_folder_loads_the_tokenizer_in_rlkit_and_transformers(source, model, tmp_path, how):
  cfg, params = model
  want = HFTokenizer(source)
  out = hf.save(tmp_path / "out", cfg, params, tokenizer=want if how == "object" else str(source))
  _assert_same_tokenizer(HFTokenizer(out), want)
  theirs = transformers.AutoTokenizer.from_pretrained(out)
  assert (theirs.eos_token, theirs.pad_token) == ("<|im_end|>", "<|endoftext|>")
  for text in TEXTS:
    assert theirs(text, add_special_tokens=False)["input_ids"] == want.encode(text)
    assert theirs.decode(want.encode(text)) == text
  assert json.loads((out / "generation_config.json").read_text())["eos_token_id"] == [2, 0]
  # A copied folder keeps what an HFTokenizer does not hold, e.g. the chat template.
  rendered = "<|im_start|>hi<|im_end|>"
  if how == "folder":
    assert theirs.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False) == rendered
  # The weights beside it are untouched by the tokenizer.
  _, reloaded = hf.load(out)
  jax.tree.map(lambda a, b: (a == b).all() or pytest.fail("weights changed"), reloaded, params)


def test_without_a_tokenizer_no_tokenizer_files_are_written(model, tmp_path):
  cfg, params = model
  out = hf.save(tmp_path / "out", cfg, params)
  assert sorted(os.listdir(out)) == ["config.json", "model.safetensors"]


def test_an_explicit_generation_config_wins(source, model, tmp_path):
  cfg, params = model
  out = hf.save(tmp_path / "out", cfg, params, generation_config={"eos_token_id": 2}, tokenizer=HFTokenizer(source))
  assert json.loads((out / "generation_config.json").read_text()) == {"eos_token_id": 2}
  assert HFTokenizer(out).stop_ids == (2,)


def test_a_tokenizer_without_hf_form_or_too_large_is_refused_before_writing(source, tmp_path):
  small = TransformerConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=2,
                            num_kv_heads=1, head_dim=16)
  params = init_params(small, jax.random.key(0))
  with pytest.raises(TypeError, match="no Hugging Face form"):
    hf.save(tmp_path / "char", small, params, tokenizer=CharTokenizer())
  with pytest.raises(ValueError, match="do not fit the model's vocab_size=100"):
    hf.save(tmp_path / "big", small, params, tokenizer=HFTokenizer(source))
  with pytest.raises(FileNotFoundError, match="no tokenizer file"):
    hf.save(tmp_path / "missing", small, params, tokenizer=str(tmp_path / "nowhere"))
  assert not os.listdir(tmp_path)
