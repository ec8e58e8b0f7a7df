"""Multi-process training on JAX's distributed runtime: two local CPU processes (loopback only).

Two processes of one CPU device each must train exactly like one process with two devices fed the
same global batches, write one Orbax checkpoint together, and let only process 0 log.
"""

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import REPO, cli_overrides, tiny_run_config

from transformer import distributed
from transformer.training import preemption

TRAIN_TOGETHER = textwrap.dedent("""
    import json, sys
    import jax, numpy as np
    from jax.experimental import multihost_utils
    from helpers import random_tokens
    from transformer import distributed, partitioning
    from transformer.training import checkpoints
    from transformer.config import base_config
    from transformer.model.transformer import ModelConfig, Transformer
    from transformer.training.step import jit_train_fns

    out_dir, port, process_id, processes = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    if processes > 1:
      distributed.initialize("auto", f"localhost:{port}", processes, process_id)
    assert jax.device_count() == 2 and jax.process_count() == processes
    cfg = base_config()
    cfg.model.num_layers, cfg.model.d_model, cfg.model.d_ff, cfg.model.num_heads = 1, 16, 32, 4
    cfg.model.dropout = 0.1
    model = Transformer(ModelConfig.from_config(cfg.model, 32))
    mesh = partitioning.make_mesh(cfg, 32)
    fns = jit_train_fns(cfg, model, mesh)
    state = fns.init(jax.random.key(0))
    sharding = partitioning.batch_sharding(mesh)
    rng = np.random.default_rng(0)
    for step in range(3):
      batch = {"src": random_tokens(rng, 8, 6, 32, lengths=[6, 5, 4, 3, 6, 2, 5, 1]),
               "tgt": random_tokens(rng, 8, 7, 32, lengths=[7, 3, 4, 5, 2, 6, 1, 7])}
      # This process's rows of the global batch, as the input pipeline would give it.
      rows = sorted({index[0].start or 0 for index in
                     sharding.addressable_devices_indices_map((8, 6)).values()})
      local = {k: np.concatenate([v[r:r + 8 // jax.device_count()] for r in rows]) for k, v in batch.items()}
      state, sums = fns.step(state, partitioning.shard_batch(local, mesh), jax.random.key(1))
    mngr = checkpoints.manager(f"{out_dir}/checkpoints_{processes}")
    checkpoints.save(mngr, 3, state, {"epoch": 0, "window": 0, "batch": 3})
    mngr.wait_until_finished()
    params = multihost_utils.process_allgather(state.params, tiled=True)
    with open(f"{out_dir}/result_{processes}_{process_id}.json", "w") as f:
      json.dump({"loss": float(sums["loss"]), "params": [np.asarray(x).ravel().tolist()
                                                          for x in jax.tree.leaves(params)]}, f)
""")




def free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def environment(devices: int) -> dict[str, str]:
  env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={devices}",
             JAX_PLATFORMS="cpu")
  for variable in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "JAX_COORDINATOR_ADDRESS"):
    env.pop(variable, None)
  env["PYTHONPATH"] = os.pathsep.join([os.path.dirname(__file__), env.get("PYTHONPATH", "")])
  return env


def run_together(commands: list[list[str]], env: dict[str, str],
                 cwd: Path | None = None) -> list[subprocess.CompletedProcess]:
  """Starts every command at once (they wait for each other) and collects them."""
  procs = [subprocess.Popen(c, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True) for c in commands]
  results = []
  for p, command in zip(procs, commands, strict=True):
    stdout, stderr = p.communicate(timeout=600)
    results.append(subprocess.CompletedProcess(command, p.returncode, stdout, stderr))
  return results


@pytest.mark.slow
def test_two_processes_train_like_one_process_with_the_same_global_batch(tmp_path):
  port = free_port()
  script = [sys.executable, "-c", TRAIN_TOGETHER, str(tmp_path), str(port)]
  together = run_together([script + ["0", "2"], script + ["1", "2"]], environment(devices=1))
  for result in together:
    assert result.returncode == 0, result.stderr[-3000:]
  alone = subprocess.run(script + ["0", "1"], env=environment(devices=2), capture_output=True,
                         text=True, timeout=600)
  assert alone.returncode == 0, alone.stderr[-3000:]
  read = lambda name: json.loads((tmp_path / name).read_text())
  first, second, single = read("result_2_0.json"), read("result_2_1.json"), read("result_1_0.json")
  assert first == second  # one model, whichever process looks
  assert first["loss"] == pytest.approx(single["loss"], rel=1e-6)
  for a, b in zip(first["params"], single["params"], strict=True):
    np.testing.assert_allclose(a, b, atol=1e-6)
  # One checkpoint written together, complete and with the same contents as the single process's.
  steps = {n: tmp_path / f"checkpoints_{n}" / "checkpoints" for n in (1, 2)}
  assert sorted(p.name for p in steps[2].iterdir()) == ["3"]
  items = {n: sorted(p.name for p in (path / "3").iterdir()) for n, path in steps.items()}
  assert items[2] == items[1] and "state" in items[2] and "data" in items[2]


@pytest.mark.slow
def test_transformer_train_runs_as_two_processes_and_only_process_0_logs(tmp_path):
  workdir = tmp_path / "run"
  port = free_port()
  command = lambda i: [sys.executable, "-m", "transformer.training.train", "--config=configs/multi30k.py",
                       f"--workdir={workdir}",
                       *cli_overrides(tiny_run_config(tmp_path), **{"train.steps": 4}),
                       f"--coordinator_address=localhost:{port}", "--num_processes=2",
                       f"--process_id={i}"]
  first, second = run_together([command(0), command(1)], environment(devices=1), cwd=REPO)
  assert first.returncode == 0, first.stderr[-3000:]
  assert second.returncode == 0, second.stderr[-3000:]
  assert "2 devices (cpu) in 2 process(es)" in first.stderr and "step 4/4" in first.stderr
  assert "step 4/4" not in second.stderr and "Model:" not in second.stderr
  assert (workdir / "checkpoints" / "4").is_dir()
  records = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
  assert [r["step"] for r in records if r["event"] == "train"] == [2, 4]  # one writer


def test_partial_or_wrong_distributed_settings_are_clear_errors():
  with pytest.raises(distributed.DistributedError, match="pass all three"):
    distributed.initialize("auto", "localhost:1234", None, 0)
  with pytest.raises(distributed.DistributedError, match="must be one of auto, on, off"):
    distributed.initialize("maybe")
  distributed.initialize("off", None, None, None)  # nothing to join: returns at once


def test_the_environment_names_a_job_of_several_processes(monkeypatch):
  for variable in ("SLURM_NTASKS", "OMPI_COMM_WORLD_SIZE", "JAX_COORDINATOR_ADDRESS"):
    monkeypatch.delenv(variable, raising=False)
  assert not distributed.environment_has_job()
  monkeypatch.setenv("SLURM_NTASKS", "1")
  assert not distributed.environment_has_job()  # a single-task SLURM job stays single-process
  monkeypatch.setenv("SLURM_NTASKS", "16")
  assert distributed.environment_has_job()


@pytest.mark.slow
def test_sigterm_to_one_process_stops_the_job_at_one_step_with_a_checkpoint(tmp_path):
  """JAX's preemption service tells every process; they agree on the step and save it together."""
  workdir, port = tmp_path / "run", free_port()
  cfg = tiny_run_config(tmp_path)
  cfg.data.batching, cfg.data.pack_length = "pack", 40
  cfg.train.update(steps=200, log_every=1, eval_every=1000, checkpoint_every=50)
  logs = [tmp_path / f"process_{i}.log" for i in (0, 1)]
  procs = []
  for i, log in enumerate(logs):
    with open(log, "w") as f:
      procs.append(subprocess.Popen(
          [sys.executable, "-m", "transformer.training.train", "--config=configs/multi30k.py",
           f"--workdir={workdir}", *cli_overrides(cfg), f"--coordinator_address=localhost:{port}",
           "--num_processes=2", f"--process_id={i}"], cwd=REPO, env=environment(devices=1),
          stdout=f, stderr=f))
  deadline = time.time() + 300
  while "step 10/200" not in logs[0].read_text():
    assert time.time() < deadline and procs[0].poll() is None, logs[0].read_text()[-3000:]
    time.sleep(0.01)
  procs[1].send_signal(signal.SIGTERM)  # the other process only
  codes = [p.wait(timeout=300) for p in procs]
  assert codes == [preemption.EXIT_INTERRUPTED] * 2, [log.read_text()[-2000:] for log in logs]
  line = logs[0].read_text().strip().splitlines()[-1]
  assert line.startswith("transformer-train: stopped by SIGTERM after step "), line
  step = int(line.split(" after step ")[1].split("/")[0])
  assert 10 <= step < 200
  assert (workdir / "checkpoints" / str(step) / "state").is_dir()
