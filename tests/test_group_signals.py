"""Signals to a program's whole process group, as a terminal's Ctrl-C, a hang-up and a scheduler's
cancel send them: the main process answers with its one line, no worker prints a traceback, no
process of the group is left, the exit comes within seconds, and nothing half-written stays.
A second Ctrl-C, a second or a tenth of one after the first, ends the program at once and prints
nothing but its line.

The fast case is a small program with two worker processes (transformer.data.workers, which the
token cache's build uses); the slow one signals `prepare` while its workers tokenize and
`transformer-train` while it compiles its steps (a stop ends the compiling at once) and in its
first batches, with Grain's worker processes.
"""

import os
import signal
import subprocess
import sys
import time

import pytest
from helpers import REPO, cli_overrides, live_processes, tiny_run_config
from test_preparing import big_corpus, partials, wait_until

STOPPED = "stopped by {} before it finished; what it had finished is kept"

PROGRAM = '''
import time
from transformer.cli import run_program
from transformer.data import workers

def main(argv):
  with workers.worker_processes(2, time.sleep, (3,)) as pool:  # each worker starts for 3 s
    futures = [pool.submit(time.sleep, 60) for _ in range(4)]
    print("ready", flush=True)
    for future in futures:
      future.result()

if __name__ == "__main__":
  run_program("toy", main)
'''


def group(pgid: int) -> set[int]:
  return live_processes(group=pgid)


def start(command, **kwargs) -> subprocess.Popen:
  """`command` as the leader of a process group of its own, as a shell starts a job, with SIGINT
  at its default (a test suite started in the background by a script inherits it ignored, as
  every background job of a non-interactive shell does, and a program would then never see it)."""
  return subprocess.Popen(command, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"),
                          stderr=subprocess.PIPE, text=True, start_new_session=True,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                          **kwargs)


def signal_group(process, sig, twice: float = 0.0) -> tuple[int, str, float]:
  """Sends `sig` to the process's group (and SIGINT again `twice` seconds later, if given);
  returns the exit status, stderr and seconds from the signal to an empty group."""
  sent = time.time()
  os.killpg(process.pid, sig)
  if twice:
    time.sleep(twice)
    if process.poll() is None:
      os.killpg(process.pid, signal.SIGINT)
  try:
    stderr = process.communicate(timeout=60)[1]
  except subprocess.TimeoutExpired:
    os.killpg(process.pid, signal.SIGKILL)
    pytest.fail(f"still running 60 s after {sig.name}: {process.communicate()[1][-3000:]}")
  assert wait_until(lambda: not group(process.pid), 10), f"left: {group(process.pid)}"
  return process.returncode, stderr, time.time() - sent


def assert_one_line(stderr: str, program: str, ending: str,
                    noise=("Traceback", "Error:", "leaked", "UserWarning", "Exception ignored")
                    ) -> None:
  """The program's one line ends its stderr, and nothing a worker or a resource tracker would
  print (a traceback, a leak warning) is anywhere in it."""
  lines = stderr.strip().splitlines()
  assert lines and lines[-1].startswith(f"{program}: {ending}"), stderr[-3000:]
  for word in noise:
    assert word not in stderr, stderr[-3000:]


@pytest.mark.parametrize("when, sig, twice, status, ending", [
    ("starting", signal.SIGINT, 0.0, 130, "interrupted"),
    ("starting", signal.SIGHUP, 0.0, 75, STOPPED.format("SIGHUP")),
    ("working", signal.SIGTERM, 0.0, 75, STOPPED.format("SIGTERM")),
    ("working", signal.SIGINT, 1.0, 130, "interrupted"),
    ("working", signal.SIGINT, 0.1, 130, "interrupted")])
def test_a_signal_to_the_group_is_answered_by_the_parent_alone(tmp_path, when, sig, twice, status,
                                                                ending):
  script = tmp_path / "toy.py"
  script.write_text(PROGRAM)
  process = start([sys.executable, str(script)], stdout=subprocess.PIPE)
  assert process.stdout.readline().strip() == "ready"
  assert wait_until(lambda: len(group(process.pid)) >= 4, 30), group(process.pid)
  time.sleep(1 if when == "starting" else 4)  # in the workers' start-up, or in their tasks
  returncode, stderr, seconds = signal_group(process, sig, twice)
  assert returncode == status, stderr[-3000:]
  assert_one_line(stderr, "toy", ending)
  assert seconds < 10 + twice


@pytest.mark.slow
def test_prepare_and_training_answer_signals_to_their_group(tmp_path):
  args = big_corpus(tmp_path)
  prepare = [sys.executable, "-m", "transformer.training.prepare", *args]
  warm = [a if "token_cache_dir" not in a else f"--config.data.token_cache_dir={tmp_path / 'warm'}"
          for a in prepare]  # trains the vocabulary once; the runs below tokenize at once
  assert subprocess.run(warm, cwd=REPO, capture_output=True, timeout=600).returncode == 0
  tokenizing = lambda process: partials(tmp_path) and len(group(process.pid)) >= 4
  for sig, twice, status, ending in [(signal.SIGINT, 0.0, 130, "interrupted"),
                                     (signal.SIGHUP, 0.0, 75, STOPPED.format("SIGHUP")),
                                     (signal.SIGTERM, 0.0, 75, STOPPED.format("SIGTERM")),
                                     (signal.SIGINT, 1.0, 130, "interrupted"),
                                     (signal.SIGINT, 0.1, 130, "interrupted")]:
    process = start(prepare)
    assert wait_until(lambda p=process: tokenizing(p) or p.poll() is not None, 300)
    returncode, stderr, seconds = signal_group(process, sig, twice)
    assert returncode == status, stderr[-3000:]
    assert_one_line(stderr, "transformer.training.prepare", ending)
    assert seconds < 15 and not partials(tmp_path)
    assert [p.name for p in (tmp_path / "vocab").iterdir()][0].endswith(".model")

  # Training's first batches, with Grain's worker processes making them: no batch's shared
  # memory is left for the resource tracker to report as leaked.
  (tmp_path / "tiny").mkdir()
  cfg = tiny_run_config(tmp_path / "tiny")
  train = [sys.executable, "-m", "transformer.training.train", "--config=configs/multi30k.py",
           *cli_overrides(cfg, **{"train.steps": 100000, "data.loader_workers": 2})]

  def logged(workdir, event):
    metrics = workdir / "metrics.jsonl"
    return metrics.exists() and f'"event": "{event}"' in metrics.read_text()

  # 'start' is logged before the steps are compiled (a stop then ends the compiling at once), and
  # 'train' once the loop runs.
  # 'train' four times: a free of shared memory still queued at the exit was a matter of timing.
  for attempt, (when, sig, status, ending) in enumerate([
      ("start", signal.SIGTERM, 75, STOPPED.format("SIGTERM")),
      ("start", signal.SIGINT, 75, STOPPED.format("SIGINT")),
      *[("train", signal.SIGTERM, 75, "stopped by SIGTERM after step")] * 4]):
    workdir = tmp_path / f"run{attempt}_{when}_{sig.name}"
    process = start([*train, f"--workdir={workdir}"])
    assert wait_until(lambda w=workdir, p=process, e=when: logged(w, e) or p.poll() is not None,
                      300)
    returncode, stderr, seconds = signal_group(process, sig)
    assert returncode == status, stderr[-3000:]
    assert_one_line(stderr, "transformer-train", ending,
                    noise=("Traceback", "Error:", "leaked", "Exception ignored"))
    assert seconds < 15
    checkpoints = workdir / "checkpoints"
    if when == "start":
      assert not checkpoints.exists() or not any(checkpoints.iterdir())
      continue
    assert not [p for p in checkpoints.iterdir() if "tmp" in p.name], list(checkpoints.iterdir())
