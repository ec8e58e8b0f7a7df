"""Seconds from a program's launch to the lines that mark its start-up, for the start-time record.

    python -m experiments.analyses.start_time --out=start.json -- transformer-train --config=... ...

Runs the command, stamps each line it writes to stderr as it arrives, and writes a JSON record: the
seconds from launch to the first line with 'Data:' (the inputs are ready: vocabulary, caches,
loader, validation batches), with 'Model:' (the state is made or restored) and with 'step N/'
(the first training step is done; with --stop_after_first_step it is then stopped, with a
checkpoint), the whole run's wall time, its exit status, and its memory sampled every 0.2 s: the
peak of its private memory and of the mapped files' pages it holds (page cache, shared and
reclaimable: a cache's token files count here once touched). The log goes beside the record.
"""

from __future__ import annotations

import argparse
import json
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from transformer.hardware import memory_mib

MARKS = {"inputs_ready_sec": r"\bData: ", "state_ready_sec": r"\bModel: ",
         "first_step_sec": r"\bstep \d+/\d+ \|"}


def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="the JSON record to write")
  parser.add_argument("--stop_after_first_step", action="store_true",
                      help="send SIGTERM at the first step's line (training then stops with a "
                      "checkpoint, which a resumed run starts from)")
  parser.add_argument("command", nargs=argparse.REMAINDER)
  args = parser.parse_args()
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  found: dict[str, float] = {}
  stopped = False
  log_path = Path(args.out).with_suffix(".log")
  log_path.parent.mkdir(parents=True, exist_ok=True)  # (before the program starts)
  start = time.perf_counter()
  peak = {"anon": 0, "file": 0}
  with subprocess.Popen(command, stderr=subprocess.PIPE, text=True) as process, \
       open(log_path, "w") as log:
    def sample() -> None:
      while process.poll() is None:
        now = memory_mib(process.pid)
        for key in peak:
          peak[key] = max(peak[key], now[key])
        time.sleep(0.2)
    threading.Thread(target=sample, daemon=True).start()
    for line in process.stderr:
      seconds = time.perf_counter() - start
      log.write(f"[{seconds:8.2f}] {line}")
      for name, pattern in MARKS.items():
        if name not in found and re.search(pattern, line):
          found[name] = round(seconds, 2)
          if name == "first_step_sec" and args.stop_after_first_step:
            process.send_signal(signal.SIGTERM)
            stopped = True
  record = {"command": " ".join(command), **found,
            "wall_sec": round(time.perf_counter() - start, 2), "exit_status": process.returncode,
            "peak_private_gib": round(peak["anon"] / 1024, 2),
            "peak_mapped_files_gib": round(peak["file"] / 1024, 2),
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}
  Path(args.out).write_text(json.dumps(record, indent=1) + "\n")
  print(json.dumps(record))
  sys.exit(0 if stopped else process.returncode)  # (stopped: its status says 'interrupted')


if __name__ == "__main__":
  main()
