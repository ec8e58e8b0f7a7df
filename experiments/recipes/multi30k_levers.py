"""Levers on the literature's Transformer-Tiny (configs/multi30k_tiny.py), chosen on validation only.

    transformer-experiment experiments/recipes/multi30k_levers.py --base=configs/multi30k_tiny.py \
        --seeds=1 --root=runs/experiments/multi30k_levers --record=experiments/results/multi30k_levers

Each variant changes one thing of the reproduced recipe; every run is scored as the literature
scores (the mean of its last 10 epoch checkpoints, beam 5) on the validation set only, with the
paired bootstrap against the same seed of the first row. No `--test_dir`: the held-out test sets
are scored once for each final candidate (experiments/recipes/multi30k_test_sets.py), never here.

The first row is the reproduction itself: its runs are multi30k_wu_tiny's (same config, same
seeds), copied into this record before the grid starts rather than trained twice, and `steps16k`
continues the reproduction's seed 0 from its step-8,000 checkpoint (the schedule has no end, so it
is the same run as one trained to 16,000): experiments/recipes/multi30k_literature.sh does both and
runs this grid after the reproduction's. `distilled` is sequence-level knowledge distillation (Kim
and Rush, 2016): the same model trained on the training sources paired with their translations by
an ensemble of the runs trained before it (TEACHERS' first pool), chosen on validation and made by
experiments/recipes/multi30k_teacher.py, which the same script runs first; its budget counts the
teacher's runs and its translating. `distilled2` is its second generation: its teacher is chosen
among the first student and the first teacher's runs; `distilled2_wd` and `distilled2_fi` are
students of the same teacher with a lever its ensemble took, so that students can be ensembled, and
`distilled2_mix` learns from the real pairs and the teacher's together (58,000 pairs).
`diversified` is data diversification (Nguyen et al., 2020): those 58,000 pairs and the training
targets paired with their back-translations by a De->En model of the same shape (the `backward`
teacher, made from experiments/recipes/multi30k_backward.py's run): 87,000 pairs.

`vocab5k` learns its own vocabulary, so it cannot join the others' ensembles (they share one).

Every run's scored parameters (the mean of its last 10 checkpoints, in float16: 5 MB) are kept in
the record beside its results (`keep_models`), so that runs trained on different machines and days
can be ensembled: `transformer-eval --workdir=experiments/results/multi30k_levers/runs/A/seed0/model
--ensemble=.../B/seed0/model`.

A run is ~1.6-2.5 hours of a 2-core CPU alone (R-Drop in four micro-batches ~2.4x that, measured in
experiments/results/cpu/rdrop_speed/, its batches' rows a multiple of 4, which moves a bucket's
batch by at most 3 rows; twice the updates 2x, 1x when continued). `rdrop1_4k` is R-Drop at the
reproduction's cost: half the tokens an update, each passed twice (8,192 tokens in its two passes),
so an update costs 1.28x (the record's notes) and a run fits one sitting. The grid resumes where it
stopped. Variants whose difference is under the seeds' spread get more seeds
(`--seeds=3 --only=NAME`).
"""

import dataclasses

from transformer.sweeps.grids import Grid, Variant

LEVERS_RECORD = "experiments/results/multi30k_levers"
BACKWARD_RECORD = "experiments/results/multi30k_backward"  # the De->En run (multi30k_backward.py)
BUNDLED = "transformer/data/multi30k"


@dataclasses.dataclass(frozen=True)
class Teacher:
  """An ensemble chosen on validation among `pool`, the kept runs of the grid recorded in `record`,
  that translates the `source` side of the training pairs into the other language."""
  pool: tuple[str, ...]
  record: str = LEVERS_RECORD
  source: str = "en"

  @property
  def target(self) -> str:
    return "de" if self.source == "en" else "en"


# The teachers, whose translations of the training pairs' side experiments/recipes/multi30k_teacher.py
# writes in the teacher's folder of the levers' record (teacher_targets), in the order they are
# made. The second teacher's pool holds the first student; `backward` back-translates the targets.
TEACHERS = {"teacher": Teacher(("fairseq_init", "act_dropout", "word_dropout")),
            "teacher2": Teacher(("distilled", "word_dropout", "fairseq_init", "act_dropout")),
            "backward": Teacher(("de_en",), BACKWARD_RECORD, source="de")}
# The teachers' vocabulary (every pool's runs share one), which the students keep (data.vocab_file),
# so that they can join their teachers' runs in an ensemble.
TEACHER_VOCAB = f"{LEVERS_RECORD}/runs/fairseq_init/seed0/model/vocab.model"


def teacher_targets(teacher: str) -> str:
  """The teacher's gzipped translations of its side of the training pairs, in its folder of the
  levers' record."""
  return f"{LEVERS_RECORD}/{teacher}/train.{TEACHERS[teacher].target}.gz"


def student(teacher: str, originals: bool = False, backward: str = "") -> dict[str, str]:
  """Overrides that train on the training sources paired with the teacher's translations (files
  committed in the record, so any machine trains the student), validated on the real pairs. With
  `originals`, on the real pairs as well: each source twice, with its reference and with the
  teacher's translation (file pairs read as one corpus). With a `backward` teacher, also each
  training target paired with its back-translation."""
  source, target = f"{BUNDLED}/train.en.gz", teacher_targets(teacher)
  if originals:
    source, target = f"{source},{source}", f"{BUNDLED}/train.de.gz,{target}"
  if backward:
    source, target = f"{source},{teacher_targets(backward)}", f"{target},{BUNDLED}/train.de.gz"
  return {"data.source": "files", "data.train_src": source,
          "data.train_tgt": target, "data.eval_src": f"{BUNDLED}/val.en.gz",
          "data.eval_tgt": f"{BUNDLED}/val.de.gz", "data.vocab_file": TEACHER_VOCAB}


LEVERS = [  # in the order they train: those a machine finishes in ~2.5 hours first
    Variant("wu_tiny"),                                      # the reproduction: the first row
    Variant("fairseq_init", {"model.qkv_init_gain": 2 ** -0.5}),  # their fork's q/k/v init
    Variant("act_dropout", {"model.activation_dropout": 0.1}),  # the feed-forward's hidden units
    Variant("word_dropout", {"model.word_dropout": 0.1}),    # whole tokens (Sennrich and Zhang)
    # sequence-level knowledge distillation: the teacher's translations as the training targets
    Variant("distilled", student("teacher")),
    Variant("rdrop1_4k", {"train.rdrop_alpha": 1.0,         # R-Drop at Guo et al.'s weight on half
                          "data.tokens_per_batch": 4096,    # the tokens, each passed twice: an
                          "train.grad_accum_steps": 2}),    # update costs 1.28x the reproduction's
    Variant("distilled2", student("teacher2")),              # the first student among teachers
    # students of the second teacher on more pairs: data diversification (with back-translations)
    Variant("diversified", student("teacher2", originals=True, backward="backward")),
    Variant("distilled2_mix", student("teacher2", originals=True)),  # real and teacher's targets
    # students of the second teacher with the levers its ensemble took: members of one ensemble
    Variant("distilled2_wd", {**student("teacher2"), "model.word_dropout": 0.1}),
    Variant("distilled2_fi", {**student("teacher2"), "model.qkv_init_gain": 2 ** -0.5}),
    Variant("attn_dropout", {"model.attention_dropout": 0.1}),
    Variant("smooth2", {"train.label_smoothing": 0.2}),
    Variant("rotary", {"model.positional": "rotary"}),       # led within the training lengths
    Variant("bpe_dropout", {"data.subword_dropout": 0.1}),   # subword regularisation
    Variant("vocab5k", {"data.vocab_size": 5000}),           # fewer subwords for small data
    # Longer than one sitting of the 2-core machine (~5-6 CPU-hours each): they need a machine
    # that keeps its runs folder until they finish.
    Variant("steps16k", {"train.steps": 16000}),             # twice the training, same averaging
    Variant("rdrop5", {"train.rdrop_alpha": 5.0,            # R-Drop at its paper's weight for
                       "train.grad_accum_steps": 4}),       # small data (IWSLT'14), 4 micro-batches
    Variant("rdrop1", {"train.rdrop_alpha": 1.0,            # R-Drop at Guo et al.'s weight (their
                       "train.grad_accum_steps": 4}),       # 0.5 KL of two passes)
    Variant("deep6", {"model.num_layers": 6}),               # shape: 6 + 6 layers of d_model 128
]


def get_grid():
  return Grid("multi30k_levers", LEVERS, average_last=10, select_on="dev", keep_models="float16")
