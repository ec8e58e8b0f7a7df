"""Data preparation as a cluster treats it: stopped by SIGTERM or SIGHUP (one line, exit 75,
nothing half-built left, no worker left), its parent killed with -9 (the workers follow), read-only
cache directories (one line naming the directory and the setting), and several processes
preparing one corpus at once (one vocabulary, one cache per split, nothing made twice)."""

import concurrent.futures
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from helpers import REPO, live_processes, tiny_run_config

from transformer import files
from transformer.data import sources, text_files
from transformer.data import token_cache as cache_lib
from transformer.data import vocab as vocab_lib
from transformer.errors import UserError


def children(pid: int) -> set[int]:
  return live_processes(parent=pid)


def alive(pids) -> set[int]:
  out = set()
  for pid in pids:
    try:
      state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
      continue
    if state != "Z":
      out.add(pid)
  return out


def wait_until(condition, timeout: float, step: float = 0.05):
  deadline = time.time() + timeout
  while time.time() < deadline:
    value = condition()
    if value:
      return value
    time.sleep(step)
  return condition()


PARENT = """
import sys, time
from transformer.data import workers
with workers.worker_processes(2, time.sleep, (0,)) as pool:
  futures = [pool.submit(time.sleep, 600) for _ in range(2)]
  print("ready", flush=True)
  time.sleep(600)
"""


def test_workers_end_within_a_second_of_their_parents_kill_9():
  parent = subprocess.Popen([sys.executable, "-c", PARENT], cwd=REPO, stdout=subprocess.PIPE,
                            text=True)
  try:
    assert parent.stdout.readline().strip() == "ready"
    spawned = wait_until(lambda: children(parent.pid) if len(children(parent.pid)) >= 3 else None,
                         10)  # two workers and multiprocessing's resource tracker
    assert spawned and len(spawned) >= 3, spawned
    parent.kill()
    parent.wait()
    gone = wait_until(lambda: not alive(spawned), 5)
    assert gone, f"still alive 5 s after their parent's kill -9: {alive(spawned)}"
  finally:
    parent.kill()


def test_a_worker_watches_its_parent_and_exits_when_it_is_gone():
  """The watcher itself: a parent pid that is not this process's parent ends the worker at once."""
  code = ("from transformer.data import workers\n"
          "import os\nworkers._watch_parent(os.getppid() + 10**6)\n")
  done = subprocess.run([sys.executable, "-c", code], cwd=REPO, timeout=30)
  assert done.returncode == 1


def test_a_killed_vocabulary_trainings_folder_is_removed_by_the_next_and_a_live_ones_kept(tmp_path):
  import socket
  host = socket.gethostname()
  dead = tmp_path / f".vocab.model.partial-{host}-999999999-abc"  # no such process
  live = tmp_path / f".vocab.model.partial-{host}-{os.getpid()}-abc"
  for partial in (dead, live):
    partial.mkdir()
    (partial / "spm.vocab").write_text("half")
  lines = text_files.read_lines(sources.BUNDLED_DIR / "train.en.gz")[:500]
  vocab_lib.train_vocab(lines, tmp_path / "vocab.model", 100)
  assert sorted(p.name for p in tmp_path.iterdir()) == sorted([live.name, "vocab.model"])


# ----------------------------------------------------------------- read-only cache directories

def never_opened():
  raise AssertionError("the corpus was opened before the directory was checked")


@pytest.mark.parametrize("folder", ["existing", "fresh/vocab"])
def test_a_read_only_vocabulary_cache_is_one_line_before_any_work(tmp_path, read_only_filesystem,
                                                                  folder):
  data = tiny_run_config(tmp_path).data
  data.vocab_cache_dir = str(read_only_filesystem / folder)
  with pytest.raises(UserError) as error:
    vocab_lib.cached_vocab(data, never_opened, 0, corpus_pairs=300)
  assert str(error.value) == (
      f"cannot write in {read_only_filesystem / folder} (Read-only file system): point "
      "config.data.vocab_cache_dir at a directory this job can write, or make it writable")


@pytest.mark.parametrize("folder", ["existing", "fresh/tokens"])
def test_a_read_only_token_cache_directory_is_one_line_that_does_not_say_free_space(
    tmp_path, read_only_filesystem, small_vocab, folder):
  _, vocab_path = small_vocab
  data = tiny_run_config(tmp_path).data
  data.token_cache_dir = str(read_only_filesystem / folder)
  with pytest.raises(sources.DataError) as error:
    cache_lib.open_or_build(data, "train", vocab_path, cache_lib.Filters(), never_opened)
  message = str(error.value)
  assert message.startswith("cannot build the token cache files-")
  assert (f"cannot write in {read_only_filesystem / folder} (Read-only file system): point "
          "config.data.token_cache_dir at a directory this job can write") in message
  assert "free" not in message.lower() and "\n" not in message


def test_an_existing_cache_in_a_read_only_directory_is_read(tmp_path, read_only_filesystem,
                                                            small_vocab):
  """A cache prepared once and shared read-only (a cluster's data disk) opens without writing."""
  _, vocab_path = small_vocab
  data = tiny_run_config(tmp_path).data
  open_source = lambda: sources.open_split(data, "train")
  built = cache_lib.open_or_build(data, "train", vocab_path, cache_lib.Filters(), open_source)
  subprocess.run(["mount", "-o", "remount,rw", str(read_only_filesystem)], check=True)
  subprocess.run(["cp", "-r", str(built.directory), str(read_only_filesystem / "existing")],
                 check=True)
  subprocess.run(["mount", "-o", "remount,ro", str(read_only_filesystem)], check=True)
  data.token_cache_dir = str(read_only_filesystem / "existing")
  opened = cache_lib.open_or_build(data, "train", vocab_path, cache_lib.Filters(), never_opened)
  assert len(opened) == len(built)


# ------------------------------------------------------------------- several processes at once

def test_a_lock_makes_the_second_process_wait_and_leaves_no_file(tmp_path, caplog):
  lock, order = tmp_path / ".thing.lock", []
  first_in = threading.Event()

  def first():
    with files.exclusive(lock, "the thing"):
      first_in.set()
      time.sleep(0.5)
      order.append("first")

  def second():
    first_in.wait()
    with files.exclusive(lock, "the thing"):
      order.append("second")

  with caplog.at_level(logging.INFO, logger="transformer"):
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # flocks of two opens exclude each other
      for future in [pool.submit(first), pool.submit(second)]:
        future.result()
  assert order == ["first", "second"]
  assert f"Waiting for the thing, which {os.uname().nodename} pid {os.getpid()} is making" in caplog.text
  assert not lock.exists()


def test_a_file_system_without_locks_is_said_and_the_work_still_runs(tmp_path, monkeypatch,
                                                                    caplog):
  import errno
  import fcntl

  def no_locks(*args):
    raise OSError(errno.ENOLCK, "No locks available")
  monkeypatch.setattr(fcntl, "flock", no_locks)
  ran = []
  with caplog.at_level(logging.WARNING, logger="transformer"):
    with files.exclusive(tmp_path / ".thing.lock", "the thing"):
      ran.append(True)
  assert ran and not (tmp_path / ".thing.lock").exists()
  assert (f"cannot lock {tmp_path / '.thing.lock'} (No locks available): processes making the "
          "thing at once will each make it") in caplog.text


def test_two_prepares_of_one_corpus_at_once_make_one_vocabulary_and_one_cache_per_split(tmp_path):
  cfg = tiny_run_config(tmp_path, train_lines=3000)
  args = [f"--config.data.{k}={cfg.data[k]}" for k in
          ("source", "train_src", "train_tgt", "eval_src", "eval_tgt", "vocab_cache_dir",
           "token_cache_dir", "vocab_size")]
  command = [sys.executable, "-m", "transformer.training.prepare", "--config=configs/multi30k.py",
             *args]
  env = dict(os.environ, JAX_PLATFORMS="cpu")
  both = [subprocess.Popen(command, cwd=REPO, env=env, stderr=subprocess.PIPE, text=True)
          for _ in range(2)]
  logs = [p.communicate(timeout=300)[1] for p in both]
  assert [p.returncode for p in both] == [0, 0], logs
  text = "\n".join(logs)
  assert text.count("Trained a 300-piece") == 1, text
  assert text.count("Token cache ") == 2, text  # the training and the validation split, once each
  vocabularies = sorted(p.name for p in Path(cfg.data.vocab_cache_dir).iterdir())
  assert len(vocabularies) == 1 and vocabularies[0].endswith(".model"), vocabularies
  caches = sorted(p.name for p in Path(cfg.data.token_cache_dir).iterdir())
  assert len(caches) == 3 and caches[0] == ".sizes", caches  # no lock, partial or stray cache


# ------------------------------------------------------------------------ stopped by a signal

def big_corpus(tmp_path, copies: int = 16) -> list[str]:
  """Multi30k's training pairs `copies` times: tokenizing it takes seconds with two workers."""
  for split, stem, n in (("train", "train", copies), ("val", "val", 1)):
    for lang in ("en", "de"):
      lines = text_files.read_lines(sources.BUNDLED_DIR / f"{stem}.{lang}.gz")
      (tmp_path / f"{split}.{lang}").write_text("\n".join(lines * n) + "\n")
  return ["--config=configs/multi30k.py", "--config.data.source=files",
          f"--config.data.train_src={tmp_path / 'train.en'}",
          f"--config.data.train_tgt={tmp_path / 'train.de'}",
          f"--config.data.eval_src={tmp_path / 'val.en'}",
          f"--config.data.eval_tgt={tmp_path / 'val.de'}",
          f"--config.data.vocab_cache_dir={tmp_path / 'vocab'}",
          f"--config.data.token_cache_dir={tmp_path / 'tokens'}"]


def start(module, args):
  return subprocess.Popen([sys.executable, "-m", module, *args], cwd=REPO,
                          env=dict(os.environ, JAX_PLATFORMS="cpu"), stderr=subprocess.PIPE,
                          text=True)


def partials(tmp_path):
  return [p for p in (tmp_path / "tokens").glob(".*.partial-*")] if (tmp_path / "tokens").is_dir() \
      else []


def stop_when(process, ready, sig, tmp_path):
  """Sends `sig` once `ready(process)` holds; returns (exit status, last stderr line, its
  children then)."""
  assert wait_until(lambda: ready(process) or process.poll() is not None, 300)
  assert process.poll() is None, process.communicate()[1][-3000:]
  workers_then = children(process.pid)
  sent = time.time()
  process.send_signal(sig)
  stderr = process.communicate(timeout=30)[1]
  assert time.time() - sent < 15, "the stop took more than 15 s"
  return process.returncode, stderr.strip().splitlines()[-1], workers_then


@pytest.mark.slow
def test_prepare_and_training_stop_at_sigterm_and_sighup_in_one_line_leaving_nothing(tmp_path):
  args = big_corpus(tmp_path)
  vocab_dir = tmp_path / "vocab"
  # SIGHUP while SentencePiece trains (its temporary directory is there): handled at once.
  training_vocab = lambda _: vocab_dir.is_dir() and any(p.is_dir() for p in vocab_dir.iterdir())
  tokenizing = lambda process: partials(tmp_path) and len(children(process.pid)) >= 2
  status, last, _ = stop_when(start("transformer.training.prepare", args), training_vocab,
                              signal.SIGHUP, tmp_path)
  assert status == 75 and last.startswith("transformer.training.prepare: stopped by SIGHUP"), last
  assert "run the same command again to go on" in last
  assert not list(vocab_dir.iterdir())  # no temporary directory, lock or half a model

  # kill -9 while SentencePiece trains: its temporary folder stays, until the next training of
  # that vocabulary (the SIGTERM case below) removes it.
  process = start("transformer.training.prepare", args)
  assert wait_until(lambda: training_vocab(None) or process.poll() is not None, 300)
  process.kill()
  process.wait()
  assert [p for p in vocab_dir.iterdir() if ".partial-" in p.name]

  # SIGTERM while the workers tokenize: the partial cache removed, every worker gone.
  status, last, spawned = stop_when(start("transformer.training.prepare", args),
                                    tokenizing, signal.SIGTERM, tmp_path)
  assert status == 75 and "stopped by SIGTERM" in last, last
  assert len(spawned) >= 2
  assert wait_until(lambda: not alive(spawned), 5), alive(spawned)
  assert not partials(tmp_path)
  left = [p.name for p in vocab_dir.iterdir()]  # what it had finished, kept; the partial gone
  assert len(left) == 1 and left[0].endswith(".model"), left

  # The same in a training run's own cache build: the new workdir is removed again.
  workdir = tmp_path / "run"
  status, last, spawned = stop_when(start("transformer.training.train", [*args, f"--workdir={workdir}"]),
                                    tokenizing, signal.SIGTERM, tmp_path)
  assert status == 75 and last.startswith("transformer-train: stopped by SIGTERM"), last
  assert wait_until(lambda: not alive(spawned), 5) and not partials(tmp_path)
  assert not workdir.exists()

  # kill -9 while tokenizing: the workers follow their parent; the next build removes the partial.
  process = start("transformer.training.prepare", args)
  assert wait_until(lambda: partials(tmp_path) and len(children(process.pid)) >= 2, 300)
  spawned = children(process.pid)
  process.kill()
  process.wait()
  assert wait_until(lambda: not alive(spawned), 5), alive(spawned)
  done = start("transformer.training.prepare", args)
  assert done.wait(timeout=300) == 0
  assert not partials(tmp_path)
  assert len([p for p in (tmp_path / "tokens").iterdir() if not p.name.startswith(".")]) == 2


def test_a_stop_while_tokenizing_removes_the_partial_and_shuts_the_workers_down(
    tmp_path, small_vocab, monkeypatch):
  """The same in-process, fast: a `Stopped` raised at a chunk's result goes through the build's
  `with` blocks (the partial cache removed), and nothing is left."""
  from transformer import stops
  _, vocab_path = small_vocab
  data = tiny_run_config(tmp_path).data
  data.token_cache_dir = str(tmp_path / "tokens")
  calls = []

  def stopped_chunk(task):
    calls.append(1)
    raise stops.Stopped("SIGTERM")
  monkeypatch.setattr(cache_lib, "_encode_chunk", stopped_chunk)
  with pytest.raises(stops.Stopped):
    cache_lib.open_or_build(data, "train", vocab_path, cache_lib.Filters(),
                            lambda: sources.open_split(data, "train"))
  assert calls and not [p for p in (tmp_path / "tokens").iterdir() if p.name != ".sizes"]
