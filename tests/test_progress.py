"""The progress display: a redrawn bar on a terminal, plain log lines in a file."""

import io
import logging
import time

import pytest

from transformer import progress


class Terminal(io.StringIO):
  def isatty(self):
    return True


def test_a_terminal_gets_a_bar_with_counts_rate_loss_elapsed_and_eta():
  stream = Terminal()
  with progress.Progress("training", total=10, unit="steps", initial=2, stream=stream) as bar:
    assert bar.mode == "bar"
    for _ in range(3):
      time.sleep(0.15)  # tqdm measures its rate between redraws (at most every 0.1 s)
      bar.update(1, tokens=1000.0)
    bar.update(0, loss=3.25)
  text = stream.getvalue()
  final = text.split("\r")[-1]
  assert "\r" in text  # redrawn in place
  assert "5/10 steps" in final and " 50%|" in final
  assert "elapsed 00:00" in final and "ETA " in final
  assert "tok/s" in final and "loss 3.250" in final


def test_log_lines_inside_a_bar_are_printed_above_it(capsys):
  logger = logging.getLogger("transformer")
  handlers = list(logger.handlers)
  with progress.Progress("translating", total=4, unit="sentences", stream=Terminal()) as bar:
    logger.warning("a message while the bar is up")
    bar.update(2)
  assert "a message while the bar is up\n" in capsys.readouterr().err  # through tqdm.write
  assert logger.handlers == handlers  # the program's own log set-up is back


def test_a_log_file_gets_plain_periodic_lines(caplog):
  stream = io.StringIO()  # not a terminal
  caplog.set_level(logging.INFO, logger="transformer")
  with progress.Progress("translating", total=100, unit="sentences", line_seconds=0.0,
                         stream=stream) as bar:
    assert bar.mode == "lines"
    bar.update(40, tokens=800.0)
    bar.update(60, tokens=1200.0)
  assert stream.getvalue() == ""  # lines go through the log, never a carriage return
  lines = [r.getMessage() for r in caplog.records]
  assert len(lines) == 2  # one per update (line_seconds=0); at close, the final count was shown
  assert lines[0].startswith("translating: 40/100 sentences | ")
  assert lines[-1].startswith("translating: 100/100 sentences | ")
  for part in ("sentences/s", "tok/s", "elapsed 0m00s", "ETA 0m00s"):
    assert part in lines[-1]


def test_loops_with_their_own_lines_and_off_print_nothing(caplog):
  caplog.set_level(logging.INFO, logger="transformer")
  with progress.Progress("training", total=5, unit="steps", line_seconds=None,
                         stream=io.StringIO()) as bar:
    bar.update(5)
  with progress.Progress("x", total=5, unit="steps", mode="off", stream=Terminal()) as bar:
    bar.update(5)
  assert caplog.records == []


def test_the_mode_flag_overrides_detection():
  try:
    progress.configure("lines")
    assert progress.resolve_mode(None, Terminal()) == "lines"
    progress.configure("bar")
    assert progress.resolve_mode(None, io.StringIO()) == "bar"
  finally:
    progress.configure("auto")
  assert progress.resolve_mode(None, Terminal()) == "bar"
  with pytest.raises(ValueError, match="progress mode must be one of auto, bar, lines, off"):
    progress.configure("fancy")


def test_the_final_count_is_logged_once_at_close(caplog):
  caplog.set_level(logging.INFO, logger="transformer")
  with progress.Progress("translating", total=10, unit="sentences", line_seconds=3600.0,
                         stream=io.StringIO()) as bar:
    bar.update(10)  # too soon for a periodic line
  assert [r.getMessage().split(" | ")[0] for r in caplog.records] == ["translating: 10/10 sentences"]
