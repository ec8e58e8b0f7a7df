"""translate(): order kept, empty and over-long lines handled, the same tokens as a direct search."""

import jax.numpy as jnp
import numpy as np
import pytest
from conftest import init_params, tiny_model_config

from transformer import decode
from transformer.config import base_config
from transformer.data import sources
from transformer.data import vocab as vocab_lib
from transformer.evaluate import translate
from transformer.model import EOS_ID, Transformer


@pytest.fixture(scope="module")
def vocab(tmp_path_factory):
  text = sources.load_split(base_config().data, "validation")
  path = tmp_path_factory.mktemp("vocab") / vocab_lib.VOCAB_FILE
  return vocab_lib.train_vocab(text.source + text.target, path, 300)


@pytest.mark.parametrize("positional", ["sinusoidal", "learned"])
def test_translate_keeps_order_and_handles_empty_and_long_lines(vocab, positional):
  model = Transformer(tiny_model_config(vocab_size=300, positional=positional, max_len=20))
  params = init_params(model, scale=2.0)
  sentences = ["A dog runs on the beach.", "", "Two men are playing football in a big park "
               "while a woman with a red hat watches them from a bench.", "A girl.", "   "]
  hypotheses, stats = translate(model, params, vocab, sentences, beam_size=1, alpha=0.6,
                                max_extra_len=5, tokens_per_batch=64, max_source_len=20)
  assert len(hypotheses) == 5 and hypotheses[1] == "" and hypotheses[4] == ""
  assert stats["truncated_sources"] == 1 and stats["sentences"] == 5
  for sentence, hypothesis in zip(sentences, hypotheses):
    if not sentence.strip():
      continue
    ids = vocab.encode(sentence)[:19] + [EOS_ID]  # truncated to max_source_len with EOS
    src = jnp.asarray([ids])
    limit = min(len(ids) + 5, 20) if positional == "learned" else len(ids) + 5
    tokens = np.asarray(decode.greedy_search(model, params, src, jnp.array([limit]), limit))[0]
    tokens = tokens.tolist()
    tokens = tokens[:tokens.index(EOS_ID)] if EOS_ID in tokens else tokens
    assert hypothesis == vocab.decode(tokens)
