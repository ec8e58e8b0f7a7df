"""The distillation teacher of the Multi30k levers: it waits for its pool, is made once, and its
gzipped translations are the ensemble's, reproducibly packed."""

import gzip

from experiments.recipes import multi30k_levers, multi30k_teacher
from transformer.data import pretokenize
from transformer.decoding import translator
from transformer.training.workdir import load_runs


def keep(record, name):
  model = record / "runs" / name / "seed0" / "model"
  model.mkdir(parents=True)
  (model / "params.msgpack").write_bytes(b"kept")
  return model


def test_a_teacher_waits_for_its_pool_and_names_what_is_missing(tmp_path, monkeypatch, capsys):
  record = tmp_path / multi30k_levers.LEVERS_RECORD
  first_pool = multi30k_levers.TEACHERS["teacher"].pool
  first = keep(record, first_pool[0])
  kept, missing = multi30k_teacher.pool_models(first_pool, record)
  assert kept == [str(first)] and missing == list(first_pool[1:])
  monkeypatch.chdir(tmp_path)
  multi30k_teacher.main(["multi30k_teacher"])
  out = capsys.readouterr().out
  assert f"teacher waits for the kept models of {', '.join(missing)}" in out
  second_missing = [n for n in multi30k_levers.TEACHERS["teacher2"].pool if n != first_pool[0]]
  assert f"teacher2 waits for the kept models of {', '.join(second_missing)}" in out
  assert ("backward waits for the kept models of de_en (the grid of "
          f"{multi30k_levers.BACKWARD_RECORD} trains them") in out
  assert not any((record / name).exists() for name in multi30k_levers.TEACHERS)


def test_translations_made_already_are_left_alone(tmp_path, monkeypatch, capsys):
  monkeypatch.chdir(tmp_path)
  for teacher in multi30k_levers.TEACHERS:
    targets = tmp_path / multi30k_levers.teacher_targets(teacher)
    targets.parent.mkdir(parents=True)
    targets.write_bytes(b"made")
  multi30k_teacher.main(["multi30k_teacher"])
  out = capsys.readouterr().out
  assert all(f"The translations of {t} are made already" in out for t in multi30k_levers.TEACHERS)
  assert (tmp_path / multi30k_levers.teacher_targets("teacher2")).read_bytes() == b"made"


def test_the_targets_are_the_ensembles_translations_gzipped_without_a_time_stamp(two_step_run,
                                                                                tmp_path):
  """A run ensembled with itself translates as the run alone (the same distributions averaged):
  the file holds the run's own translations, in order, and packs alike every time."""
  sentences = ["A dog runs.", "Two men play football in a park.", "A woman reads."]
  source = tmp_path / "train.en"
  source.write_text("\n".join(sentences) + "\n")
  target = tmp_path / "teacher" / "train.de.gz"
  target.parent.mkdir()
  multi30k_teacher.translate([str(two_step_run), str(two_step_run)], str(source), target)
  run = load_runs([two_step_run])[0]
  expected = translator.translate(run.model, run.params(), run.vocab, sentences,
                                  translator.SearchSettings.from_config(run.config),
                                  max_source_len=run.config.data.max_len,
                                  text_form=pretokenize.text_form(run.config.data)).hypotheses
  assert gzip.decompress(target.read_bytes()).decode().splitlines() == expected
  assert target.read_bytes()[4:8] == b"\0\0\0\0"  # gzip's MTIME field: no time stamp
  assert sorted(p.name for p in target.parent.iterdir()) == ["train.de.gz"]  # no .partial left


def test_each_student_reads_its_teachers_files_from_the_record_and_trains_after_its_pool():
  """The students' targets and vocabulary are committed files of the record, not a machine's runs;
  the second teacher's pool holds the first student."""
  names = [v.name for v in multi30k_levers.LEVERS]
  students = {v.name: v for v in multi30k_levers.LEVERS if "data.train_tgt" in v.overrides}
  assert sorted(students) == ["distilled", "distilled2", "distilled2_fi", "distilled2_mix",
                              "distilled2_wd", "diversified"]
  real_src, real_tgt = (f"{multi30k_levers.BUNDLED}/train.{lang}.gz" for lang in ("en", "de"))
  for name, student in students.items():
    teacher = "teacher" if name == "distilled" else "teacher2"
    targets = student.overrides["data.train_tgt"].split(",")
    assert multi30k_levers.teacher_targets(teacher) in targets
    assert student.overrides["data.vocab_file"].startswith(multi30k_levers.LEVERS_RECORD + "/runs/")
    assert all(names.index(p) < names.index(name) for p in multi30k_levers.TEACHERS[teacher].pool)
  assert "distilled" in multi30k_levers.TEACHERS["teacher2"].pool
  assert students["distilled2_wd"].overrides["model.word_dropout"] == 0.1
  mix = students["distilled2_mix"].overrides  # each source with its reference, then the teacher's
  assert mix["data.train_src"].split(",") == [real_src] * 2
  assert mix["data.train_tgt"].split(",") == [real_tgt, multi30k_levers.teacher_targets("teacher2")]
  # data diversification: those pairs, then each real target with its back-translation
  diversified = students["diversified"].overrides
  back = multi30k_levers.teacher_targets("backward")
  assert back == f"{multi30k_levers.LEVERS_RECORD}/backward/train.en.gz"
  assert diversified["data.train_src"].split(",") == [real_src, real_src, back]
  assert diversified["data.train_tgt"].split(",") == [*mix["data.train_tgt"].split(","), real_tgt]


def test_the_backward_teacher_is_the_de_en_grid_run_trained_before_the_teachers_are_made():
  """The back-translations come from the backward grid's one run (German to English), which the
  queue trains before it makes the teachers."""
  from pathlib import Path

  from configs.multi30k_tiny import get_config
  from experiments.recipes import multi30k_backward
  from transformer.sweeps.plan import variant_config

  grid = multi30k_backward.get_grid()
  backward = multi30k_levers.TEACHERS["backward"]
  assert (backward.source, backward.target) == ("de", "en")
  assert backward.record == multi30k_levers.BACKWARD_RECORD
  assert backward.pool == tuple(v.name for v in grid.variants)
  config = variant_config(get_config(), grid.variants[0], seed=0)
  assert (config.data.src_lang, config.data.tgt_lang) == ("de", "en")
  assert grid.keep_models
  queue = (Path(__file__).parents[1] / "experiments/recipes/multi30k_literature.sh").read_text()
  assert f"--record={multi30k_levers.BACKWARD_RECORD}" in queue
  assert queue.index("multi30k_backward.py") < queue.index("python -m experiments.recipes.multi30k_teacher")


def test_the_best_recipe_trains_its_teachers_runs_and_student_and_scores_the_tabulated_ensemble():
  """multi30k_best.sh trains what its ensemble needs (the teacher's pool, the teacher, the student),
  and ensembles the members the README's table names and counts."""
  import re
  from pathlib import Path

  from experiments.tables.results import LEVERS_ENSEMBLE
  script = (Path(__file__).parents[1] / "experiments/recipes/multi30k_best.sh").read_text()
  steps = [line.split("#")[0].strip() for line in script.splitlines()
           if line.startswith(('"${levers[@]}"', "python -m", "for name"))]
  only = [re.search(r"--only=(\S+)", s).group(1).split(",") for s in steps if "--only=" in s]
  assert only == [list(multi30k_levers.TEACHERS["teacher"].pool), ["distilled"]]
  assert steps.index("python -m experiments.recipes.multi30k_teacher") == 1  # between the two
  members = re.search(r"for name in ([\w ]+);", script).group(1).split()
  _, tabulated, teacher = LEVERS_ENSEMBLE
  assert members == list(tabulated) and teacher == "teacher"
