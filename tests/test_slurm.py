"""Training under a real SLURM (tests/slurm_cluster.py starts one on this machine): the batch script
transformer-train --print_sbatch writes checkpoints at its time limit's warning and at a preemption,
requeues itself and ends bit-identical to an uninterrupted run; a cancelled job loses nothing past
its checkpoint; a wrong config fails once, unrequeued; srun -n2 trains one job of two processes;
a grid runs as a job array. The scheduler's behaviour on one machine, not multi-node speed."""

import json
import sys
import time

import jax
import numpy as np
import pytest
from helpers import REPO, cli_overrides, run_cli, tiny_run_config
from slurm_cluster import INSTALL, Cluster, missing

from transformer import slurm
from transformer.training.workdir import load_run

pytestmark = pytest.mark.skipif(bool(missing()), reason=f"needs SLURM and munge, run as root "
                                f"({INSTALL}); missing: {', '.join(missing())}")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
  running = Cluster(tmp_path_factory.mktemp("slurm")).start()
  yield running
  running.stop()


def train_flags(cfg, workdir, **changes):
  return [f"--config={REPO / 'configs' / 'multi30k.py'}", *cli_overrides(cfg, **changes),
          f"--workdir={workdir}"]


def submit(cluster, tmp, train_args, sbatch):
  """transformer-train --print_sbatch as a user runs it, the script submitted; returns the job id
  and its log file."""
  printed = run_cli("transformer.training.train", *train_args, "--print_sbatch",
                    f"--sbatch={sbatch} --output={tmp}/slurm-%j.out --chdir={tmp}")
  assert printed.returncode == 0, printed.stderr
  script = tmp / f"job{time.monotonic_ns()}.sbatch"
  script.write_text(printed.stdout)
  job = cluster.sbatch(script)
  return job, tmp / f"slurm-{job}.out"


def params_equal(a, b):
  for x, y in zip(jax.tree.leaves(load_run(a).raw_params), jax.tree.leaves(load_run(b).raw_params)):
    np.testing.assert_array_equal(np.asarray(x), np.asarray(y))


def test_a_wrong_config_fails_once_with_its_line_and_is_not_requeued(cluster, tmp_path):
  cfg = tiny_run_config(tmp_path)  # valid when printed; its data file is gone when the job starts
  (tmp_path / "train.de").rename(tmp_path / "moved.de")
  job, log = submit(cluster, tmp_path, train_flags(cfg, tmp_path / "run"), "--time=5")
  state = cluster.wait(job, 120)
  text = log.read_text()
  assert state["JobState"] == "FAILED" and state["Restarts"] == "0", state
  assert state["ExitCode"].startswith("2:"), state
  assert "transformer-train: error: " in text and str(tmp_path / "train.de") in text, text
  assert "Traceback" not in text and "requeueing" not in text
  assert text.count("transformer: job") == 2  # its start and its end, once


def test_a_requeue_into_a_workdir_of_another_config_fails_once(cluster, tmp_path):
  cfg = tiny_run_config(tmp_path)
  run = tmp_path / "run"
  (run).mkdir()
  (run / "config.json").write_text(json.dumps(json.loads(cfg.to_json_best_effort())))
  job, log = submit(cluster, tmp_path, train_flags(cfg, run, **{"model.d_model": 64}), "--time=5")
  state = cluster.wait(job, 120)
  assert state["JobState"] == "FAILED" and state["Restarts"] == "0", state
  text = log.read_text()
  assert "transformer-train: error:" in text and "model.d_model: 32 -> 64" in text, text
  assert "Traceback" not in text and "requeueing" not in text


REFUSED_SBATCH = [
    ("--nodes=2 --gpus-per-node=3 --time=1:00:00",
     "asks for 6 GPU(s) (2 node(s) x 3), which the config cannot use"),
    ("--signal=B:TERM@60", "not B:, which signals the batch shell only"),
    ("--no-requeue", "--no-requeue forbids the requeue"),
    ("--gpus-per-node=8 --ntasks-per-node=3", "--ntasks-per-node=3 does not divide a node's 8 GPU(s)"),
    ("-N 2", "is not a long sbatch option"),
    ("--nodes=0", "--nodes=0 is not a positive whole number"),
    ("--nodes=-3", "--nodes=-3 is not a positive whole number"),
    ("--time=banana", "--time=banana is not a SLURM time limit"),
    ('"--time=2', "cannot split '\"--time=2' into options (No closing quotation); close its quotes"),
    ("--time=1", "--time=1 gives each start 60 s, less than the 120 s"),
    ("--time=5 --signal=TERM@300", "leaving a start 0 s: it would be signalled while it starts up")]


@pytest.mark.parametrize("sbatch,words", REFUSED_SBATCH)
def test_sbatch_options_the_config_cannot_use_are_refused(sbatch, words, tmp_path):
  cfg = tiny_run_config(tmp_path)
  cfg.mesh.data, cfg.mesh.fsdp = 2, 2
  with pytest.raises(slurm.SbatchError) as refused:
    slurm.train_script(cfg, ["transformer-train"], sbatch, str(tmp_path / "run"))
  assert words in " ".join(str(refused.value).split())


@pytest.mark.parametrize("sbatch,signal", [("--time=2", "TERM@30"), ("--time=5", "TERM@75"),
                                           ("--time=1-0", "TERM@300"),
                                           ("--time=10 --signal=TERM@60", "TERM@60")])
def test_a_short_limit_gets_a_warning_that_fits_it(sbatch, signal, tmp_path):
  """A quarter of a short limit, not the default 5 minutes; a given --signal is kept."""
  script = slurm.train_script(tiny_run_config(tmp_path), ["transformer-train"], sbatch,
                              str(tmp_path / "run"))
  assert f"#SBATCH --signal={signal}\n" in script


def test_print_sbatch_refuses_before_a_script_is_printed(tmp_path):
  """The program's own path: a refusal, a script, a broken config; nothing is written."""
  cfg = tiny_run_config(tmp_path)
  refused = run_cli("transformer.training.train",
                    *train_flags(cfg, tmp_path / "run", **{"mesh.data": 2, "mesh.fsdp": 2}),
                    "--print_sbatch", f"--sbatch={REFUSED_SBATCH[0][0]}")
  assert refused.returncode == 2 and refused.stdout == "", refused.stderr
  assert REFUSED_SBATCH[0][1] in refused.stderr and "Traceback" not in refused.stderr
  printed = run_cli("transformer.training.train", *train_flags(cfg, tmp_path / "run"),
                    "--print_sbatch", "--sbatch=--time=2")
  assert printed.returncode == 0, printed.stderr
  assert "#SBATCH --signal=TERM@30\n" in printed.stdout
  broken = run_cli("transformer.training.train", *train_flags(cfg, tmp_path / "run", **{
      "train.warmup_steps": -1}), "--print_sbatch")
  assert broken.returncode == 2 and broken.stdout == ""
  assert "config.train.warmup_steps must be a positive integer, got -1" in broken.stderr
  assert not (tmp_path / "run").exists()


@pytest.mark.slow
def test_a_job_at_its_time_limit_checkpoints_requeues_and_finishes_bit_identical(cluster, tmp_path):
  # Long enough that SLURM's warning (up to a minute early: its time resolution) comes mid-run.
  cfg = tiny_run_config(tmp_path)
  changes = {"train.steps": 6000, "train.log_every": 100, "train.eval_every": 100000,
             "train.checkpoint_every": 100000, "train.checkpoint_minutes": 0.0}
  job, log = submit(cluster, tmp_path, train_flags(cfg, tmp_path / "run", **changes),
                    "--time=2")  # the warning a quarter of the limit before it: 30 s
  reference = run_cli("transformer.training.train", *train_flags(cfg, tmp_path / "ref", **changes))
  assert reference.returncode == 0, reference.stderr
  state = cluster.wait(job, 900)
  text = log.read_text()
  assert state["JobState"] == "COMPLETED" and int(state["Restarts"]) >= 1, (state, text)
  assert "stopped by SIGTERM after step" in text and "requeueing job" in text, text
  params_equal(tmp_path / "run", tmp_path / "ref")


@pytest.mark.slow
def test_a_preempted_job_requeues_and_a_cancelled_one_resumes_when_submitted_again(cluster, tmp_path):
  cfg = tiny_run_config(tmp_path)
  changes = {"train.steps": 4000, "train.log_every": 50, "train.checkpoint_every": 100,
             "train.eval_every": 100000}
  run = tmp_path / "run"
  job, log = submit(cluster, tmp_path, train_flags(cfg, run, **changes), "--time=30")
  metrics = run / "metrics.jsonl"

  def steps_logged():
    return [json.loads(line)["step"] for line in metrics.read_text().splitlines()
            if '"train"' in line] if metrics.exists() else []

  deadline = time.monotonic() + 300
  while len(steps_logged()) < 2 and time.monotonic() < deadline:
    time.sleep(0.5)
  cluster.run("scancel", "--signal=TERM", job)  # a preemption notice: the job requeues itself
  deadline = time.monotonic() + 300
  while cluster.job(job).get("Restarts") in (None, "0") and time.monotonic() < deadline:
    time.sleep(0.5)
  while (len(steps_logged()) < 2 + 3 and time.monotonic() < deadline):  # past its resumption
    time.sleep(0.5)
  cluster.run("scancel", job)  # the user cancels it: no requeue, the checkpoint stays
  state = cluster.wait(job, 300)
  text = log.read_text()
  assert state["JobState"] == "CANCELLED", (state, text)
  assert text.count("requeueing job") == 1 and text.count("stopped by SIGTERM after step") == 2
  interrupted = [json.loads(line) for line in metrics.read_text().splitlines()
                 if '"interrupted"' in line]
  assert len(interrupted) == 2 and interrupted[-1]["step"] < 4000
  assert interrupted[-1]["step"] in load_run(run).steps  # nothing lost past its checkpoint
  again, again_log = submit(cluster, tmp_path, train_flags(cfg, run, **changes), "--time=30")
  assert cluster.wait(again, 600)["JobState"] == "COMPLETED", again_log.read_text()
  assert f"Resumed from the checkpoint at step {interrupted[-1]['step']}" in again_log.read_text()
  reference = run_cli("transformer.training.train", *train_flags(cfg, tmp_path / "ref", **changes))
  assert reference.returncode == 0, reference.stderr
  params_equal(run, tmp_path / "ref")


@pytest.mark.slow
def test_srun_trains_one_job_of_two_processes_like_one_process_with_two_devices(cluster, tmp_path):
  cfg = tiny_run_config(tmp_path)
  args = train_flags(cfg, tmp_path / "srun")
  out = cluster.run("srun", "-n2", "--time=10", sys.executable, "-m", "transformer.training.train",
                    *args, timeout=600, check=False)
  assert out.returncode == 0, out.stderr[-3000:]
  one = run_cli("transformer.training.train", *train_flags(cfg, tmp_path / "one"), devices=2)
  assert one.returncode == 0, one.stderr
  for x, y in zip(jax.tree.leaves(load_run(tmp_path / "srun").raw_params),
                  jax.tree.leaves(load_run(tmp_path / "one").raw_params)):
    np.testing.assert_allclose(np.asarray(x), np.asarray(y), rtol=1e-5, atol=1e-6)


@pytest.mark.slow
def test_a_grid_runs_as_a_job_array_and_its_tables_collect(cluster, tmp_path):
  cfg = tiny_run_config(tmp_path)
  grid = tmp_path / "grid.py"
  grid.write_text("from transformer.sweeps.grids import Grid, Variant\n"
                  "def get_grid():\n"
                  "  return Grid('pair', [Variant('base', {}), Variant('wide', "
                  "{'model.d_ff': 128})])\n")
  base = [f"--base={REPO / 'configs' / 'multi30k.py'}",
          *(a.replace("--config.", "--base.") for a in cli_overrides(cfg)),
          f"--root={tmp_path / 'grid'}", "--seeds=1"]
  printed = run_cli("transformer.sweeps.run", str(grid), *base, "--print_sbatch",
                    f"--sbatch=--time=10 --output={tmp_path}/slurm-%A_%a.out --chdir={tmp_path}")
  assert printed.returncode == 0, printed.stderr
  assert "#SBATCH --array=0-1" in printed.stdout
  script = tmp_path / "grid.sbatch"
  script.write_text(printed.stdout)
  job = cluster.sbatch(script)
  for task in (0, 1):
    assert cluster.wait(f"{job}_{task}", 900)["JobState"] == "COMPLETED", cluster.logs()
  collected = run_cli("transformer.sweeps.run", str(grid), *base, "--collect_only")
  assert collected.returncode == 0, collected.stderr
  table = (tmp_path / "grid" / "results.md").read_text()
  assert "| base |" in table and "| wide |" in table, table


@pytest.mark.slow
def test_a_workdir_one_process_cannot_see_stops_every_process_at_start_up(cluster, tmp_path):
  # Task 1 gets a private, empty folder where the workdir is: a node's own disk, not shared storage.
  cfg = tiny_run_config(tmp_path)
  shared = tmp_path / "shared"
  shared.mkdir()
  task = tmp_path / "task.sh"
  task.write_text("#!/bin/bash\n"
                  'if [ "$SLURM_PROCID" = 1 ] && [ -z "$PRIVATE" ]; then\n'
                  '  exec env PRIVATE=1 unshare -m "$0" "$@"\n'
                  "fi\n"
                  f'[ -n "$PRIVATE" ] && mount -t tmpfs none {shared}\n'
                  'exec "$@"\n')
  task.chmod(0o755)
  out = cluster.run("srun", "-n2", "--time=10", str(task), sys.executable, "-m",
                    "transformer.training.train", *train_flags(cfg, shared / "run"), timeout=600,
                    check=False)
  assert out.returncode == 2, out.stderr[-3000:]
  assert ("process(es) 1 of the job cannot see " f"{shared / 'run' / 'config.json'}, which process 0 "
          "wrote: the workdir must be on storage every node of the job shares") in out.stderr
  assert "Traceback" not in out.stderr
  assert not (shared / "run" / "checkpoints").exists() or not any((shared / "run" / "checkpoints").iterdir())
