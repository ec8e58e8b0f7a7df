"""A real SLURM cluster of one node for the tests: munged, slurmctld and slurmd started as root in a
temporary folder with a generated slurm.conf (no systemd, no cgroups: proctrack/linuxproc and
task/none), and the client commands (sbatch, srun, squeue, scontrol, scancel) pointed at it by
SLURM_CONF. Debian's packages provide everything: apt-get install slurmctld slurmd slurm-client munge.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
CLIENTS = ("sbatch", "srun", "squeue", "scontrol", "scancel", "sinfo")
INSTALL = "apt-get install slurmctld slurmd slurm-client munge"


def missing() -> list[str]:
  """The SLURM and munge programs this machine lacks, or ['root'] where they cannot run here."""
  gone = [p for p in DAEMONS + CLIENTS if shutil.which(p) is None
          and not Path("/usr/sbin", p).exists()]
  if not gone and os.geteuid() != 0:
    return ["root (the daemons run as root here)"]
  return gone


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def _program(name: str) -> str:
  return shutil.which(name) or str(Path("/usr/sbin", name))


class Cluster:
  """The running cluster: `env` for the client commands and for jobs' programs."""

  def __init__(self, folder: Path):
    self.folder = folder
    self.conf = folder / "slurm.conf"
    self.env = {**os.environ, "SLURM_CONF": str(self.conf)}
    self.processes: list[subprocess.Popen] = []

  def start(self) -> Cluster:
    f = self.folder
    for sub in ("state", "spool", "munge"):
      (f / sub).mkdir(parents=True, exist_ok=True)
    (f / "munge").chmod(0o700)
    key = f / "munge" / "munge.key"
    key.write_bytes(os.urandom(1024))
    key.chmod(0o600)
    sock = f / "munge" / "munge.socket"
    self._spawn([_program("munged"), "--foreground", "--force", f"--socket={sock}",
                 f"--key-file={key}", f"--pid-file={f / 'munge' / 'munged.pid'}",
                 f"--log-file={f / 'munge' / 'munged.log'}", f"--seed-file={f / 'munge' / 'seed'}"],
                "munged.out")
    _wait_for(sock.exists, 20, "munged's socket")
    host = socket.gethostname()
    cpus = len(os.sched_getaffinity(0))
    self.conf.write_text("\n".join([
        "ClusterName=tests", f"SlurmctldHost={host}", "SlurmUser=root", "SlurmdUser=root",
        f"SlurmctldPort={_free_port()}", f"SlurmdPort={_free_port()}",
        "AuthType=auth/munge", "CredType=cred/munge", f"AuthInfo=socket={sock}",
        f"StateSaveLocation={f / 'state'}", f"SlurmdSpoolDir={f / 'spool'}",
        f"SlurmctldPidFile={f / 'slurmctld.pid'}", f"SlurmdPidFile={f / 'slurmd.pid'}",
        f"SlurmctldLogFile={f / 'slurmctld.log'}", f"SlurmdLogFile={f / 'slurmd.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "MpiDefault=none",
        "SwitchType=switch/none", "JobAcctGatherType=jobacct_gather/none",
        "AccountingStorageType=accounting_storage/none", "JobCompType=jobcomp/none",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres",
        "SelectTypeParameters=CR_CPU", "ReturnToService=2", "MinJobAge=600", "KillWait=30",
        "InactiveLimit=0", "Waittime=0", "SlurmctldTimeout=30", "SlurmdTimeout=30",
        "SchedulerParameters=sched_interval=1",
        f"NodeName={host} CPUs={cpus} State=UNKNOWN",
        "PartitionName=tests Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4",
        ""]))
    self._spawn([_program("slurmctld"), "-D", "-i", "-f", str(self.conf)], "slurmctld.out")
    self._spawn([_program("slurmd"), "-D", "-f", str(self.conf)], "slurmd.out")
    _wait_for(lambda: "idle" in self.run("sinfo", "-h", "-o", "%T", check=False).stdout, 60,
              "the node to come up in sinfo", self)
    return self

  def _spawn(self, argv: list[str], log: str) -> None:
    out = (self.folder / log).open("w")
    self.processes.append(subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                           env=self.env, start_new_session=True))

  def run(self, *argv: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run(argv, env=self.env, capture_output=True, text=True, check=check,
                          timeout=timeout)

  def sbatch(self, script: Path) -> str:
    """Submits a batch script; returns its job id."""
    out = self.run("sbatch", "--parsable", str(script)).stdout.strip()
    return out.split(";")[0]

  def job(self, job_id: str) -> dict[str, str]:
    """scontrol's fields of a job (JobState, Restarts, ExitCode, ...)."""
    text = self.run("scontrol", "show", "job", job_id, check=False).stdout
    return dict(re.findall(r"(\w+)=(\S*)", text))

  def wait(self, job_id: str, timeout: float) -> dict[str, str]:
    """Waits until the job has ended for good (not pending, running or requeued)."""
    done = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY")
    _wait_for(lambda: self.job(job_id).get("JobState") in done, timeout, f"job {job_id} to end",
              self)
    return self.job(job_id)

  def logs(self) -> str:
    return "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-3000:]}"
                     for p in sorted(self.folder.glob("*.log")))

  def stop(self) -> None:
    with contextlib.suppress(Exception):
      self.run("scancel", "--full", "--user=root", check=False, timeout=10)
    for process in reversed(self.processes):
      process.terminate()
    for process in reversed(self.processes):
      try:
        process.wait(timeout=15)
      except subprocess.TimeoutExpired:
        process.kill()


def _wait_for(condition, timeout: float, what: str, cluster: Cluster | None = None) -> None:
  deadline = time.monotonic() + timeout
  while not condition():
    if time.monotonic() > deadline:
      raise TimeoutError(f"waited {timeout:.0f} s for {what}"
                         + (f"\n{cluster.logs()}" if cluster else ""))
    time.sleep(0.5)
