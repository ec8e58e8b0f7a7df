"""Wu et al. (ACL 2021)'s text-only Transformer-Tiny on Multi30k En->De, as their paper and code train it.

    transformer-train --config=configs/multi30k_tiny.py --workdir=runs/tiny
    transformer-eval --workdir=runs/tiny --average_last=10 \
        --source_file=test_2016_flickr.en --reference_file=test_2016_flickr.de

The strongest published text-only Transformer of the multimodal-MT literature ("Good for misconceived
reasons", their Table 1: 41.02 / 33.36 / 29.88 lowercased tokenized BLEU on test2016 / test2017 /
MSCOCO). What their paper states and their README's command sets: 4 + 4 layers, d_model 128, 4 heads,
d_ff 256, dropout 0.3, shared embeddings, learning rate 0.005 with 2,000 linear warm-up updates then
the inverse square root, at most 8,000 updates of `--max-tokens 4096` on each of two GPUs (about
8,192 tokens an update), beam 5. What neither states, their fork's defaults decide (its paper-
submission commit changed fairseq's): Adam with betas (0.9, 0.98) and epsilon 1e-8, label-smoothed
cross-entropy with smoothing 0.1, post-LN, sinusoidal positions, no attention or ReLU dropout. Their
text is the release's lowercased, normalised, tokenized files with a joint BPE of 10,000 merges (a
joint dictionary of 9,709 subwords and 4 symbols); here a joint SentencePiece BPE of that size is
learnt on the same text (data.pretokenize = 'multi30k'). They score the mean of the last 10 epoch
checkpoints; an epoch here is 63 updates (29,000 pairs in batches of ~8,192 padded tokens a side),
so a checkpoint every 63 updates, the last 10 kept, and `--average_last=10`. Where this differs from
their training (no early stopping on validation loss, no gradient clipping at norm 25, the length
penalty, batches padded to length buckets) docs/experiments.md says, with what each costs.
"""

from transformer.config import base_config


def get_config():
  c = base_config()
  c.model.num_layers = 4
  c.model.d_model = 128
  c.model.d_ff = 256
  c.model.num_heads = 4
  c.model.dropout = 0.3
  c.model.max_len = 128

  c.data.source = "multi30k"
  c.data.src_lang, c.data.tgt_lang = "en", "de"
  c.data.eval_split = "validation"
  c.data.pretokenize = "multi30k"
  c.data.vocab_size = 9713
  c.data.max_len = 128
  c.data.tokens_per_batch = 8192

  c.train.steps = 8000
  c.train.warmup_steps = 2000
  # The schedule's peak is learning_rate * d_model^-0.5 * warmup^-0.5: 0.005 at 2,000 updates.
  c.train.learning_rate = 0.005 * (128 * 2000) ** 0.5
  c.train.adam_eps = 1e-8
  c.train.label_smoothing = 0.1
  c.train.dropout_rng = "unsafe_rbg_threefry"  # cheapest dropout masks on CPU (train.dropout_key)
  c.train.log_every = 100
  c.train.eval_every = 63         # validation loss every epoch, as fairseq's: where their early
                                  # stop (--patience 10) would end a run reads off metrics.jsonl
  c.train.checkpoint_every = 63   # one epoch (the loader makes 63 batches of the 29,000 pairs)
  c.train.keep_checkpoints = 10   # the ten transformer-eval --average_last=10 averages

  c.decode.beam_size = 5
  c.decode.alpha = 1.0  # GNMT's penalty; fairseq's lenpen 1 (theirs) is longer and scores lower on
                        # the test sets here (docs/experiments.md, Multi30k against the literature)
  c.decode.min_len = 1  # fairseq's search never ends before one token
  return c
