"""Two JAX processes (jax.distributed, CPU collectives over gloo) shard one grid between them:
each process gets the whole grid back, equal to the single-process run (float64)."""

import os
import socket
import subprocess
import sys
import textwrap

import numpy as np
import pytest

WORKER = textwrap.dedent("""
    import sys
    import jax
    jax.config.update("jax_enable_x64", True)
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    pid, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    jax.distributed.initialize(coordinator_address=f"localhost:{port}", num_processes=2,
                               process_id=pid)
    import jax.numpy as jnp
    import numpy as np
    from bchg_jax.problems.random_tabular import random_tabular_cmdp
    from bchg_jax.core.sweep import product_grid, run_grid
    from bchg_jax.tabular.train import TrainConfig, make_train
    prob = random_tabular_cmdp(jax.random.key(1), num_states=5, num_actions=3, time_limit=20,
                               dtype=jnp.float64)
    tr = make_train(prob, "bchg", TrainConfig(num_envs=1, num_steps=20, iterations=6))
    grid = product_grid(lr=[0.1, 0.05, 0.2], sarsa_alpha=[0.5], beta=[0.3])
    if len(sys.argv) > 4 and pid == 1:  # another grid on process 1: refused on both
        grid = product_grid(lr=[0.1, 0.05, 0.3], sarsa_alpha=[0.5], beta=[0.3])
    if len(sys.argv) > 4:
        try:
            run_grid(tr, grid, 3, 6, chunk=3, verbose=False, shard=True)
        except ValueError as err:
            assert "were given another grid" in str(err), err
            sys.exit(0)
        sys.exit(1)
    assert len(jax.devices()) == 2 and len(jax.local_devices()) == 1
    _, m = run_grid(tr, grid, 3, 6, chunk=3, verbose=False, shard=True)
    np.save(f"{out}/J{pid}.npy", m["J"])
    if pid == 0:
        _, ref = run_grid(tr, grid, 3, 6, chunk=3, verbose=False)
        np.save(f"{out}/ref.npy", ref["J"])
""")


def _free_port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _workers(tmp_path, *extra):
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    port = str(_free_port())
    env = {**os.environ, "XLA_FLAGS": ""}
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(i), port, str(tmp_path), *extra],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=False):
        assert p.returncode == 0, err[-3000:]


@pytest.mark.slow
def test_two_processes_with_other_grids_are_refused(tmp_path):
    _workers(tmp_path, "other-grid")  # each process exits 0 only on the ValueError


@pytest.mark.slow
def test_two_processes_share_one_grid(tmp_path):
    _workers(tmp_path)
    J0, J1, ref = (np.load(tmp_path / f) for f in ("J0.npy", "J1.npy", "ref.npy"))
    assert J0.shape == (3, 3, 6) and np.array_equal(J0, J1)
    np.testing.assert_allclose(J0, ref, rtol=1e-9, atol=1e-12)


def _process_env(port: str, i: int, tmp) -> dict:
    """The environment of process ``i`` of a two-process job on this machine, configured the
    documented way (JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID), its TMPDIR
    in ``tmp``."""
    return {
        **os.environ,
        "XLA_FLAGS": "",
        "JAX_COORDINATOR_ADDRESS": f"localhost:{port}",
        "JAX_NUM_PROCESSES": "2",
        "JAX_PROCESS_ID": str(i),
        "JAX_CPU_COLLECTIVES_IMPLEMENTATION": "gloo",
        "TMPDIR": str(tmp),
    }


def _cli_on_two_processes(tmp_path, args, args1=None, rc=0):
    """``python -m experiments.fourrooms ARGS --distributed`` as processes 0 and 1 of one job
    (process 1 with ``args1`` when given), configured the documented way
    (JAX_COORDINATOR_ADDRESS / JAX_NUM_PROCESSES / JAX_PROCESS_ID), each with its TMPDIR in
    ``tmp_path/tmp``; both must exit with ``rc``. Returns their (stdout, stderr)."""
    port = str(_free_port())
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tmp = tmp_path / "tmp"
    tmp.mkdir(exist_ok=True)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "experiments.fourrooms",
                *(args1 if i == 1 and args1 is not None else args),
                "--distributed",
            ],
            cwd=repo,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_process_env(port, i, tmp),
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs, strict=False):
        assert p.returncode == rc, err[-3000:]
    return outs


@pytest.mark.slow
def test_distributed_cli_run_resumes_on_every_process(tmp_path):
    run = str(tmp_path / "run")
    common = ["--method", "naive", "--seeds", "2", "--chunk", "10"]
    _cli_on_two_processes(tmp_path, [*common, "--iterations", "20", "--out", run, "--exact-out"])
    # process 1 reads the run folder it did not write (it used to fail: "cannot read it")
    outs = _cli_on_two_processes(tmp_path, ["--resume", run, "--iterations", "30"])
    assert all("resuming at iteration 20" in o or "extending at iteration 20" in o for o, _ in outs)
    J = np.load(os.path.join(run, "naive", "metrics.npz"))["J"]
    assert J.shape == (1, 2, 30) and np.all(np.isfinite(J))
    # process 1 names the shared folder, not its own scratch copy, and deletes that copy
    assert f"results in {run}" in outs[1][0]
    assert f"--resume {run}" in outs[1][1]
    assert not [f for f in os.listdir(tmp_path / "tmp") if f.startswith("bchg-p1-")]


@pytest.mark.slow
def test_distributed_processes_with_other_settings_are_refused(tmp_path):
    # they used to exit 0, process 0 saving process 1's runs under its own labels
    common = ["--method", "naive", "--iterations", "4", "--chunk", "2", "--exact-out"]
    run = ["--out", str(tmp_path / "run")]
    outs = _cli_on_two_processes(
        tmp_path,
        [*common, *run, "--lr", "0.1", "0.5", "--seeds", "1"],
        [*common, *run, "--lr", "0.1", "--seeds", "2"],
        rc=2,
    )
    for _, err in outs:
        assert "process 1 of 2 was given other settings than process 0" in err
    assert not os.path.exists(tmp_path / "run" / "naive")
    # another --out too (process 1 would resume from another folder than process 0 writes)
    outs = _cli_on_two_processes(
        tmp_path,
        [*common, *run, "--seeds", "1"],
        [*common, "--out", str(tmp_path / "p1"), "--seeds", "1"],
        rc=2,
    )
    assert all("given other settings" in err for _, err in outs)


@pytest.mark.slow
def test_ctrl_c_in_one_process_stops_every_process_after_the_same_chunk(tmp_path):
    """Ctrl-C to process 0 of a --distributed run: it stopped alone, its Ctrl-C handler opened
    the checkpoint folder (a collective) while process 1 waited in the chunk's metrics gather,
    and both aborted (gloo "collective mismatch", status -6, no resume line). Now every
    process stops after the same chunk with status 130 and names the last checkpoint."""
    import signal
    import time

    port = str(_free_port())
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    run = tmp_path / "run"
    (tmp_path / "tmp").mkdir()
    args = ["--method", "naive", "--seeds", "2", "--iterations", "4000", "--chunk", "2"]
    procs, logs = [], []
    for i in range(2):
        logs.append((tmp_path / f"p{i}.out", tmp_path / f"p{i}.err"))
        with open(logs[i][0], "w") as out, open(logs[i][1], "w") as err:
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "experiments.fourrooms", *args]
                    + ["--out", str(run), "--exact-out", "--distributed"],
                    cwd=repo,
                    stdout=out,
                    stderr=err,
                    # a background job's SIGINT may be ignored: Python's handler, as in a shell
                    preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
                    env=_process_env(port, i, tmp_path / "tmp"),
                )
            )
    try:
        deadline = time.time() + 400
        while logs[0][0].read_text().count("iter ") < 3:  # a few chunks saved
            assert time.time() < deadline and procs[0].poll() is None, logs[0][1].read_text()
            time.sleep(0.5)
        procs[0].send_signal(signal.SIGINT)
        codes = [p.wait(timeout=120) for p in procs]
    finally:
        for p in procs:
            p.kill() if p.poll() is None else None
    errs = [e.read_text() for _, e in logs]
    assert codes == [130, 130], errs
    steps = sorted(int(d) for d in os.listdir(run / "naive" / "checkpoint") if d.isdigit())
    for err in errs:
        assert f"interrupted in method naive at iteration {steps[-1]} (its last" in err, err
        assert f"--resume {run}" in err
