"""Attention maps, positional-encoding figures and run comparisons of tiny models and runs."""

import json

import jax
import matplotlib.image
import numpy as np
import pytest
from helpers import init_params, random_tokens, tiny_model_config

from transformer.model.positions.sinusoidal import sinusoidal_encoding
from transformer.model.transformer import EOS_ID, Transformer
from transformer.visualisation import attention_maps, plot

PIECES = [f"t{i}" for i in range(24)]


def panels(fig):
  """The heatmap axes of a figure (colour bars left out)."""
  return [ax for ax in fig.axes if ax.get_label() != "<colorbar>"]


def tick_labels(axis):
  return [t.get_text() for t in axis.get_ticklabels() if t.get_visible()]


@pytest.fixture(scope="module")
def maps():
  model = Transformer(tiny_model_config(num_layers=2, num_heads=4))
  params = init_params(model)
  source = [5, 9, 7, 11, 6, EOS_ID]
  target = [8, 12, 4, EOS_ID]
  return model, params, attention_maps.attention_maps(model, params, source, target, PIECES)


def test_maps_have_one_layer_by_head_block_per_kind_with_token_axes(maps):
  _, _, m = maps
  assert m.source_tokens == ["t5", "t9", "t7", "t11", "t6", "t1"]
  assert m.decoder_tokens == ["t2", "t8", "t12", "t4"]  # BOS, then the target without its EOS
  assert m.weights["encoder_self_attention"].shape == (2, 4, 6, 6)
  assert m.weights["decoder_self_attention"].shape == (2, 4, 4, 4)
  assert m.weights["cross_attention"].shape == (2, 4, 4, 6)


def test_maps_of_a_decoder_shallower_than_its_encoder_have_each_stacks_layers():
  model = Transformer(tiny_model_config(num_layers=3, decoder_layers=1, num_heads=4))
  m = attention_maps.attention_maps(model, init_params(model), [5, 9, EOS_ID], [8, EOS_ID], PIECES)
  assert m.weights["encoder_self_attention"].shape == (3, 4, 3, 3)
  assert m.weights["decoder_self_attention"].shape == (1, 4, 2, 2)
  assert m.weights["cross_attention"].shape == (1, 4, 2, 3)


def test_attention_rows_are_distributions_and_decoder_self_attention_is_causal(maps):
  _, _, m = maps
  for kind, weights in m.weights.items():
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5, err_msg=kind)
    assert (weights >= 0).all()
  causal = m.weights["decoder_self_attention"]
  above = np.triu(np.ones(causal.shape[-2:], bool), k=1)
  assert (causal[..., above] == 0).all()
  assert (causal[..., ~above] > 0).all()  # every allowed position gets some weight


def test_first_encoder_layer_matches_a_numpy_computation(maps):
  """softmax(Q K^T / sqrt(d_k)) from the first layer's own projections of the embedded source."""
  model, params, m = maps
  cfg = model.config
  src = np.array([5, 9, 7, 11, 6, EOS_ID])
  x = np.asarray(params["embed"]["embedding"])[src] * np.sqrt(cfg.d_model)
  x = x + np.asarray(sinusoidal_encoding(jax.numpy.arange(len(src)), cfg.d_model))
  layer = params["encoder"]["layer_0"]["self_attention"]
  q = np.einsum("sd,dhk->hsk", x, layer["query"]["kernel"]) + np.asarray(layer["query"]["bias"])[:, None]
  k = np.einsum("sd,dhk->hsk", x, layer["key"]["kernel"]) + np.asarray(layer["key"]["bias"])[:, None]
  logits = np.einsum("hqk,hsk->hqs", q, k) / np.sqrt(cfg.key_dim)
  expected = np.exp(logits - logits.max(-1, keepdims=True))
  expected /= expected.sum(-1, keepdims=True)
  np.testing.assert_allclose(m.weights["encoder_self_attention"][0], expected, atol=2e-5)


def test_padding_keys_get_no_weight_and_scanned_layers_record_maps_too(rng):
  model = Transformer(tiny_model_config(scan_layers=True))
  params = init_params(model)
  src = random_tokens(rng, 1, 6, 24)[0].tolist()
  m = attention_maps.attention_maps(model, params, src, [8, EOS_ID], PIECES)
  assert m.weights["cross_attention"].shape == (2, 4, 2, 6)
  np.testing.assert_allclose(m.weights["encoder_self_attention"].sum(-1), 1.0, rtol=1e-5)
  # Padding inside a sequence would be a caller's bug; the model masks id 0 all the same.
  padded = attention_maps.attention_maps(model, params, src[:-1] + [0], [8, EOS_ID], PIECES)
  assert (padded.weights["cross_attention"][..., -1] == 0).all()


def test_grid_has_a_panel_per_layer_and_head_with_tokens_on_the_outer_axes(maps):
  _, _, m = maps
  fig = attention_maps.attention_grid(m, "cross_attention")
  grid = panels(fig)
  assert len(grid) == 2 * 4
  assert fig._suptitle.get_text() == "Encoder-decoder attention"
  assert [ax.get_title() for ax in grid[:4]] == [f"layer 1, head {h}" for h in range(1, 5)]
  bottom_left = grid[4]
  assert tick_labels(bottom_left.xaxis) == m.source_tokens
  assert tick_labels(bottom_left.yaxis) == m.decoder_tokens
  assert bottom_left.get_xlabel() == "source (key)"
  assert bottom_left.get_ylabel() == "decoder input (query)"
  assert tick_labels(grid[1].xaxis) == [] and tick_labels(grid[1].yaxis) == []  # inner panel


def test_head_figure_labels_every_token(maps):
  _, _, m = maps
  fig = attention_maps.head_figure(m, "decoder_self_attention", layer=1, head=2)
  (ax,) = panels(fig)
  assert ax.get_title() == "Decoder self-attention (causal), layer 2, head 3"
  assert tick_labels(ax.xaxis) == m.decoder_tokens and tick_labels(ax.yaxis) == m.decoder_tokens
  np.testing.assert_array_equal(ax.images[0].get_array(), m.weights["decoder_self_attention"][1, 2])


def test_positional_figures_show_the_table_and_its_similarity(maps):
  model, params, _ = maps
  tables = attention_maps.positional_tables(params, model.config, positions=10)
  np.testing.assert_allclose(tables["sinusoidal (encoder and decoder)"].values[3, :2],
                             [np.sin(3.0), np.cos(3.0)], rtol=1e-6)
  fig = attention_maps.positional_figure(tables)
  assert [(ax.get_xlabel(), ax.get_ylabel()) for ax in panels(fig) if ax.axison] == [
      ("dimension", "position"), ("position", "position")]
  similarity = panels(fig)[1].images[0].get_array()
  np.testing.assert_allclose(np.diag(similarity), 1.0, rtol=1e-6)

  learned = Transformer(tiny_model_config(positional="learned"))
  tables = attention_maps.positional_tables(init_params(learned), learned.config, positions=10)
  assert list(tables) == ["learned (encoder)", "learned (decoder)"]
  assert tables["learned (encoder)"].values.shape == (10, 16)
  assert len(panels(attention_maps.positional_figure(tables))) == 4


@pytest.mark.parametrize("kind", ["t5", "rotary", "none"])
def test_the_positional_figure_draws_what_a_kind_declares(kind):
  """A bias by offset per head (T5), rotation angles (rotary), or a panel saying there is nothing."""
  model = Transformer(tiny_model_config(positional=kind))
  tables = attention_maps.positional_tables(init_params(model), model.config, positions=6)
  fig = attention_maps.positional_figure(tables)
  drawn = [ax for ax in panels(fig) if ax.axison]
  if kind == "none":
    assert tables == {} and drawn == []
    return
  assert drawn and all(ax.images for ax in drawn)
  if kind == "t5":
    assert [ax.get_ylabel() for ax in drawn] == ["head", "head"]
    assert drawn[0].images[0].get_array().shape == (4, 11)  # heads x offsets -5 .. 5


def test_all_figures_are_written(maps, tmp_path):
  model, params, m = maps
  files = attention_maps.write_figures(m, attention_maps.positional_tables(params, model.config, 8), tmp_path)
  assert len(files) == 3 + 3 * 2 * 4 + 2  # grids, heads, positions and the .npz
  assert matplotlib.image.imread(tmp_path / "heads" / "cross_attention_layer2_head4.png").ndim == 3
  saved = np.load(tmp_path / "attention.npz")
  np.testing.assert_array_equal(saved["cross_attention"], m.weights["cross_attention"])
  assert saved["source_tokens"].tolist() == m.source_tokens


# ------------------------------------------------------------------------------- run comparisons

def write_run(workdir, records):
  workdir.mkdir(parents=True)
  (workdir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def train(step, loss, elapsed):
  return {"event": "train", "step": step, "time": 0, "loss": loss, "elapsed": elapsed}


def test_run_curves_follow_resumes_and_interpolate_training_time(tmp_path):
  write_run(tmp_path / "run", [
      train(100, 5.0, 360.0), train(200, 4.0, 720.0),
      {"event": "eval", "step": 200, "time": 0, "nll": 3.5},
      train(200, 4.1, 700.0),  # a second process resumed from step 100 and logged step 200 again
      train(300, 3.0, 1080.0),  # ... its elapsed restarts from 0
      {"event": "eval", "step": 300, "time": 0, "nll": 3.0},
      {"event": "bleu", "step": 250, "time": 0, "test_set": "dev", "bleu": 20.0, "averaged": 1},
      {"event": "bleu", "step": 300, "time": 0, "test_set": "dev", "bleu": 25.0, "averaged": 5},
      {"event": "bleu", "step": 250, "time": 0, "test_set": "dev", "bleu": 21.0, "averaged": 1,
       "ema": True},
      {"event": "bleu", "step": 250, "time": 0, "test_set": "dev", "bleu": 22.0, "averaged": 1,
       "ema": True, "min_len": 1},  # another search of the same checkpoint: its own curve
  ])
  curves = plot.run_curves(tmp_path / "run")
  # Training hours: the first process trained 720 s; the second's 700 s and 1,080 s come on top.
  np.testing.assert_allclose(curves["train loss (label-smoothed)"],
                             [(100, 0.1, 5.0), (200, (720 + 700) / 3600, 4.1),
                              (300, (720 + 1080) / 3600, 3.0)])
  np.testing.assert_allclose(curves["dev loss (nats per token)"],
                             [(200, (720 + 700) / 3600, 3.5), (300, 0.5, 3.0)])
  np.testing.assert_allclose(curves["BLEU (dev)"], [(250, (720 + 890) / 3600, 20.0)])  # no avg5
  np.testing.assert_allclose(curves["BLEU (dev, moving average)"], [(250, (720 + 890) / 3600, 21.0)])
  np.testing.assert_allclose(curves["BLEU (dev, min_len 1, moving average)"],
                             [(250, (720 + 890) / 3600, 22.0)])
  bleu_of = lambda min_len: sorted(k for k in plot.run_curves(tmp_path / "run", min_len) if "BLEU" in k)
  assert bleu_of(0) == ["BLEU (dev)", "BLEU (dev, moving average)"]
  assert bleu_of(1) == ["BLEU (dev, min_len 1, moving average)"]


def test_comparison_has_a_row_per_metric_and_columns_for_steps_and_hours(tmp_path):
  for variant, offset in (("a", 0.0), ("b", 0.5)):
    for seed in (0, 1):
      records = [train(s, 5.0 - s / 100 + offset + seed * 0.1, s * 3.0 + seed) for s in (100, 200)]
      records.append({"event": "eval", "step": 200, "time": 0, "nll": 3.0 + offset})
      records.append({"event": "bleu", "step": 200, "time": 0, "test_set": "dev", "bleu": 20.0})
      write_run(tmp_path / variant / f"seed{seed}", records)
  runs = sorted(tmp_path.glob("*/seed*"))
  assert [plot.run_label(r) for r in runs] == ["a", "a", "b", "b"]
  fig = plot.compare_runs({"a": runs[:2], "b": runs[2:]}, tmp_path / "c.png", title="t")
  axes = fig.axes
  assert len(axes) == 3 * 2
  assert [ax.get_ylabel() for ax in axes[::2]] == ["train loss (label-smoothed)",
                                                  "dev loss (nats per token)", "BLEU (dev)"]
  assert {ax.get_xlabel() for ax in axes[::2]} == {"step"}
  assert {ax.get_xlabel() for ax in axes[1::2]} == {"training hours"}
  legend = [t.get_text() for t in axes[0].get_legend().get_texts()]
  assert legend == ["a (n=2)", "b (n=2)"]
  mean_line = [line for line in axes[0].get_lines() if line.get_label() == "a (n=2)"][0]
  np.testing.assert_allclose(mean_line.get_ydata(), [4.05, 3.05])  # the mean of the two seeds
  assert matplotlib.image.imread(tmp_path / "c.png").ndim == 3


def test_a_big_grid_gets_a_colour_per_variant():
  import matplotlib.pyplot as plt
  fig, ax = plt.subplots()
  plot.draw_groups(ax, {f"v{i}": [[(0, i), (1, i + 1)]] for i in range(18)})
  colours = {line.get_color() for line in ax.get_lines()}
  plt.close(fig)
  assert len(colours) == 18  # the default cycle has 10: variants 0 and 10 would share one


def test_a_big_grid_puts_its_legend_beside_the_panels(tmp_path):
  records = [train(s, 5.0 - s / 100, float(s)) for s in (100, 200)]
  for i in range(7):
    write_run(tmp_path / f"v{i}", records)
  fig = plot.compare_runs({f"v{i}": [tmp_path / f"v{i}"] for i in range(7)}, tmp_path / "c.png")
  assert fig.axes[0].get_legend() is None
  assert [t.get_text() for t in fig.legends[0].get_texts()] == [f"v{i} (n=1)" for i in range(7)]
