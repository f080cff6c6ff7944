"""Several `tfrun train` (or `tfplan profile`) commands on one set of rank processes, so that the suite pays
process start-up once.

    results = shared_ranks.run([(["tfrun", "train", "--plan", plan, "--out", out, ...], {}), ...], 2, tmp)
    results[0].returncode, results[0].stdout, results[0].stderr    # as subprocess.run([tfrun, ...]) gives

Each command goes through the program's own path: its typer CLI, then (tfrun train) tfrun.cli.setup and
tfrun.distributed.launch.launch, which writes OUT/run_config.json and, after the job, reads the checkpoints and prints
the summary, or (tfplan profile) tfplan.cost.measured's `python -m tfrun profile`, whose tfrun.cli.profiling calls
launch.launch for each measuring run; and every rank runs tfrun.cli.worker.main on that run_config.json, as the
processes torchrun starts do. Only the process creation is replaced: tfplan.cost.measured's subprocess runs tfrun's CLI
in the launcher's process, and launch's forked ranks (launch.start_ranks) become a message to ranks that are already
running in one gloo group (started once per call, forked from the test process where that is safe:
tests/rank_processes.py; the group is kept between jobs, so run_worker's teardown of it is skipped), with the
environment launch gives its ranks. A real `tfrun train` pays the launcher's imports (torch and its pipelining
package, about 4 s on 2 cores) before its first step.

What this leaves out, the real launch, is tested with real processes in tests/tfrun/test_train.py (outputs, a
signal to the launcher, a killed rank, joining an external torchrun) and tests/tfrun/distributed/test_rank.py.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

Command = tuple[list[str], dict[str, str]] | tuple[list[str], dict[str, str], list[tuple[Path, Path]]]
"""The command line (tfrun or tfplan, then its arguments), extra environment variables for it (as env= of
subprocess.run) and, optionally, files to copy (source, destination) once it has finished: what a later
command will change."""


def run(commands: list[Command], ranks: int, work_dir: Path) -> list[subprocess.CompletedProcess]:
    """Run `commands` in order on `ranks` rank processes; one CompletedProcess per command: the launcher's
    exit code, its stdout (with the ranks' stdout, as under `tfrun train`) and its stderr."""
    from tests import rank_processes

    work_dir.mkdir(parents=True, exist_ok=True)
    rank_processes.start(_rank_main, (ranks, commands, str(work_dir)), ranks)
    results = []
    for i, (argv, *_) in enumerate(commands):
        code = json.loads((work_dir / f"cmd{i}.json").read_text())["returncode"]
        results.append(subprocess.CompletedProcess(argv, code, (work_dir / f"cmd{i}.out").read_text(),
                                                   (work_dir / f"cmd{i}.err").read_text()))
    return results


def run_one(argv: list[str], work_dir: Path, ranks: int = 2) -> subprocess.CompletedProcess:
    """One command (tfrun or tfplan, then its arguments) on fresh ranks: run() of a single command."""
    return run([(argv, {})], ranks, work_dir)[0]


@contextlib.contextmanager
def _fds(stdout: Path, stderr: Path | int):
    """Point file descriptors 1 and 2 at these files (appending; an int is an open descriptor) for a while."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    out = os.open(stdout, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    err = os.open(stderr, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if isinstance(stderr, Path) else stderr
    try:
        os.dup2(out, 1)
        os.dup2(err, 2)
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, out, *((err,) if isinstance(stderr, Path) else ())):
            os.close(fd)


@contextlib.contextmanager
def _environ(env: dict[str, str], *, replace: bool = False):
    """This process's environment with `env` added (or, with `replace`, exactly `env`) for a while."""
    saved = dict(os.environ)
    if replace:
        os.environ.clear()
    os.environ.update(env)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _rank_main(rank: int, world: int, commands: list[Command], work: str) -> None:
    import torch.distributed as dist

    from tfrun.cli.worker import COLLECTIVE_TIMEOUT

    # A file store, not a TCP port chosen in advance that another process may take while the ranks start.
    dist.init_process_group("gloo", init_method=f"file://{Path(work) / 'store'}", rank=rank, world_size=world,
                            timeout=COLLECTIVE_TIMEOUT)
    try:
        if rank == 0:
            _launcher(world, commands, Path(work))
        else:
            while True:
                message = [None]
                dist.broadcast_object_list(message, src=0)
                if message[0] is None:
                    break
                _worker(rank, world, *message[0])
    finally:
        gc.collect()  # as tfrun.cli.worker.run_worker does before its teardown
        dist.destroy_process_group()
    # Everything is written: leave without the interpreter's finalisation, during which gloo objects can abort
    # the process ("terminate called without an active exception", SIGABRT: seen here at a rank's exit after
    # all its jobs had finished; tfrun.cli.worker's note on its gc.collect).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _launcher(world: int, commands: list[Command], work: Path) -> None:
    """Rank 0: each command through its CLI as the launcher process would run it."""
    import torch.distributed as dist

    import tfplan.cli.app
    import tfrun.cli.app
    from tfrun.distributed import launch

    apps = {"tfrun": tfrun.cli.app.app, "tfplan": tfplan.cli.app.app}
    stdout = {"path": ""}  # where this process's fd 1 points now: the job's ranks print there too

    def call(argv: list[str], out: Path, err: Path) -> int:
        """`argv` (a program's command line) through its CLI, fds 1 and 2 to these files; its exit code."""
        saved_argv, saved_stdout = sys.argv, stdout["path"]
        sys.argv, stdout["path"] = list(argv), str(out)
        try:
            with _fds(out, err):  # a crash is reported like a crashed launcher's
                return launch.exit_code_of(lambda args: apps[argv[0]](args, prog_name=argv[0]), argv[1:])
        finally:
            sys.argv, stdout["path"] = saved_argv, saved_stdout

    class Job:
        """launch.start_ranks's forked ranks: the job's ranks run tfrun.cli.worker.main on its config."""

        def __init__(self, config_path, world_size: int, env: dict[str, str], stderr, threads: int) -> None:
            assert world_size == world, (world_size, world)
            message = [(str(config_path), dict(os.environ) | env, stdout["path"],
                        str(Path(config_path).parent / "launcher.log"))]
            dist.broadcast_object_list(message, src=0)
            self.exit_codes = {0: _worker(0, world, *message[0], stderr_fd=stderr.fileno())}
            self.stopped: set[int] = set()

        def wait(self) -> None:
            pass

        def kill(self) -> None:
            pass

    real_run, real_start, nested = subprocess.run, launch.start_ranks, [0]

    def run(cmd, *args, **kwargs):
        """subprocess.run, except that `python -m tfrun ...` (tfplan profile's measuring job, tfplan.cost.measured)
        runs in this process, its output captured as text."""
        if list(cmd[:3]) != [sys.executable, "-m", "tfrun"]:
            return real_run(cmd, *args, **kwargs)
        assert kwargs.get("capture_output") and kwargs.get("text"), kwargs
        nested[0] += 1
        out, err = (work / f"nested{nested[0]}.{name}" for name in ("out", "err"))
        code = call(["tfrun", *cmd[3:]], out, err)
        return subprocess.CompletedProcess(cmd, code, out.read_text(), err.read_text())

    launch.start_ranks = Job
    subprocess.run = run
    try:
        for i, (argv, env, *copies) in enumerate(commands):
            with _environ(env):
                code = call(argv, work / f"cmd{i}.out", work / f"cmd{i}.err")
            for source, destination in copies[0] if copies else ():
                if Path(source).exists():  # else the test reading the copy fails, after this command's own check
                    shutil.copyfile(source, destination)
            (work / f"cmd{i}.json").write_text(json.dumps({"returncode": code}))
    finally:
        launch.start_ranks = real_start
        subprocess.run = real_run
        dist.broadcast_object_list([None], src=0)


def _worker(rank: int, world: int, config_path: str, env: dict[str, str], stdout: str, log: str,
            stderr_fd: int | None = None) -> int:
    """One rank of one job: tfrun.cli.worker.main(CONFIG) in the launcher's environment with what launch gives its
    ranks, and the variables torchrun would add; its stdout to the job's, its stderr to the job's launcher.log.
    Returns the job's exit code (0 when every rank's is 0) on every rank."""
    import torch.distributed as dist

    from tfrun.cli import worker
    from tfrun.distributed import launch

    ranks = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(world), "LOCAL_WORLD_SIZE": str(world)}
    destroy = dist.destroy_process_group
    dist.destroy_process_group = lambda *args, **kwargs: None  # the group outlives the job
    code = 1
    try:
        with _environ(env | ranks, replace=True), _fds(Path(stdout), Path(log) if stderr_fd is None else stderr_fd):
            code = launch.exit_code_of(worker.main, [config_path])
    finally:
        dist.destroy_process_group = destroy
    codes = [None] * world
    dist.all_gather_object(codes, code)
    return next((c for c in codes if c), 0)
