"""Worker processes on one host: ``gateway.workers: N`` (or ``shuniu serve --workers N``).

The process started by ``shuniu serve`` becomes a **supervisor**: it reserves the port and
starts N worker processes, each a whole gateway that binds the same port with
``SO_REUSEPORT`` (the kernel spreads new connections over them) and also serves its app on a
private Unix socket in a directory only this user can enter. The supervisor restarts a
worker that dies (with a back-off while one keeps dying), forwards ``SIGHUP`` (reload) to
every worker, and on ``SIGTERM``/``SIGINT`` asks every worker to drain and waits for them.

The views that describe the whole gateway are gathered by whichever worker is asked, from
the others' Unix sockets (:mod:`shuniu.core.http.fleet`): ``/metrics`` has every worker's
series, labelled ``worker``; ``/status.json`` sums the workers' figures and lists them. An
admin change (drain, traffic split, an endpoint added or removed, a reload) is applied by
the worker that got it and then by every other one.

What stays per worker: the scheduler's queue and its fairness, in-process simulated engines
(each worker simulates its own replicas), the memory response cache, and the balancers'
state (prefix tables, in-flight counts). Engines the gateway launches (``launch:``) and
rate limits in the memory store would be wrong per worker, so ``workers`` above 1 refuses
them (:func:`check_workers`).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from shuniu.core.config.loader import ResolvedDeployment
from shuniu.core.errors import Problem

__all__ = [
    "SUPERVISOR_ENV",
    "WORKER_ENV",
    "WorkerInfo",
    "check_workers",
    "end_with_supervisor",
    "reserve_port",
    "run_supervisor",
    "socket_path",
]

log = logging.getLogger("shuniu.workers")

WORKER_ENV = "SHUNIU_WORKER"
"""``index/count/directory`` of a worker process (set by the supervisor, read by ``serve``)."""

SUPERVISOR_ENV = "SHUNIU_SUPERVISOR"
"""The supervisor's pid, in a worker's environment."""

_RESTART_MIN_S = 0.5
_RESTART_MAX_S = 30.0
_STABLE_S = 10.0
"""A worker that ran this long before dying is restarted at once, not after a back-off."""


@dataclass(frozen=True, slots=True)
class WorkerInfo:
    """Which worker this process is, of how many, and where their Unix sockets are."""

    index: int
    count: int
    directory: Path

    @classmethod
    def from_env(cls) -> WorkerInfo | None:
        raw = os.environ.get(WORKER_ENV)
        if not raw:
            return None
        index, count, directory = raw.split("/", 2)
        return cls(int(index), int(count), Path(directory))

    def socket(self, index: int | None = None) -> Path:
        return socket_path(self.directory, self.index if index is None else index)

    def peers(self) -> list[int]:
        """The other workers' indexes."""
        return [i for i in range(self.count) if i != self.index]


def end_with_supervisor(supervisor: int) -> None:
    """Ask the kernel to send this worker SIGTERM (a drain) when its supervisor dies, so a
    supervisor killed outright leaves no orphans (Linux; elsewhere nothing is done)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != supervisor:  # it died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def socket_path(directory: Path, index: int) -> Path:
    return directory / f"worker-{index}.sock"


def check_workers(resolved: ResolvedDeployment, workers: int) -> list[Problem]:
    """What a deployment has that cannot run in ``workers`` processes."""
    if workers <= 1:
        return []
    from shuniu.core.tenancy import limits_in_use

    deployment = resolved.deployment
    problems = []
    for name, model in deployment.models.items():
        for i, ep in enumerate(model.endpoints):
            if ep.launch is not None:
                problems.append(
                    Problem(
                        f"models.{name}.endpoints[{i}].launch",
                        f"engines the gateway launches need gateway.workers: 1 (each of the {workers} "
                        "workers would launch its own); run the engines on their own and point "
                        "base_url at them",
                    )
                )
    memory_limits = deployment.rate_limits is None or deployment.rate_limits.store == "memory"
    if memory_limits and limits_in_use(deployment, resolved.authenticator_options):
        problems.append(
            Problem(
                "rate_limits.store",
                f"rate limits in the memory store would be {workers} times too generous with "
                f"{workers} workers (each counts alone): use `rate_limits: {{store: redis}}`",
            )
        )
    return problems


def reserve_port(host: str, port: int) -> socket.socket:
    """A socket bound to ``(host, port)`` with ``SO_REUSEPORT`` but not listening: it holds
    the port (and says which, for port 0) while the workers bind it too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    if family == socket.AF_INET6 and host in ("::", "[::]"):
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind((host.strip("[]"), port))
    return sock


class _Worker:
    __slots__ = ("crashes", "index", "proc", "started")

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.started = 0.0
        self.crashes = 0


def run_supervisor(
    command: Sequence[str],
    workers: int,
    port: int,
    *,
    drain_s: float,
    on_ready: Callable[[int, list[int]], None] | None = None,
) -> int:
    """Start ``workers`` copies of ``command`` (``shuniu serve`` with the port fixed) as
    workers, keep them running, and stop them on SIGTERM/SIGINT; returns the exit code.
    ``on_ready(port, pids)`` runs once every worker answers on its socket."""
    directory = Path(tempfile.mkdtemp(prefix="shuniu-workers-"))
    os.chmod(directory, 0o700)
    pool = [_Worker(i) for i in range(workers)]
    stopping = False
    signals: list[int] = []

    def start(w: _Worker) -> None:
        env = {**os.environ, WORKER_ENV: f"{w.index}/{workers}/{directory}", SUPERVISOR_ENV: str(os.getpid())}
        # Its own process group: a Ctrl-C in the terminal reaches the supervisor, which
        # drains the workers in order, rather than every process at once.
        w.proc = subprocess.Popen(list(command), env=env, process_group=0)
        w.started = time.monotonic()

    def on_signal(sig: int, frame: object) -> None:
        signals.append(sig)

    previous = {s: signal.signal(s, on_signal) for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)}
    try:
        for w in pool:
            start(w)
        announced = False
        restart_at: dict[int, float] = {}
        while True:
            while signals:
                sig = signals.pop(0)
                if sig == signal.SIGHUP:
                    for w in pool:
                        if w.proc is not None and w.proc.poll() is None:
                            w.proc.send_signal(signal.SIGHUP)
                else:
                    stopping = True
            if stopping:
                break
            now = time.monotonic()
            for w in pool:
                if w.proc is None:
                    if restart_at.get(w.index, 0.0) <= now:
                        start(w)
                    continue
                code = w.proc.poll()
                if code is None:
                    continue
                ran = now - w.started
                w.crashes = 0 if ran > _STABLE_S else w.crashes + 1
                delay = 0.0 if w.crashes == 0 else min(_RESTART_MAX_S, _RESTART_MIN_S * 2 ** (w.crashes - 1))
                log.warning(
                    "worker %d (pid %d) exited with %s; restarting in %.1f s",
                    w.index,
                    w.proc.pid,
                    code,
                    delay,
                )
                sys.stderr.write(f"shuniu: worker {w.index} exited with {code}; restarting\n")
                w.proc = None
                restart_at[w.index] = now + delay
            if not announced and all(socket_path(directory, w.index).exists() for w in pool):
                announced = True
                if on_ready is not None:
                    on_ready(port, [w.proc.pid for w in pool if w.proc is not None])
            time.sleep(0.05)
        # Drain: every worker stops accepting and finishes what it has, within drain_s.
        for w in pool:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + drain_s + 5.0
        code = 0
        for w in pool:
            if w.proc is None:
                continue
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                log.warning("worker %d did not stop within the drain time; killing it", w.index)
                w.proc.kill()
                w.proc.wait(5)
            if w.proc.returncode not in (0, None):
                code = 1
        return code
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for w in pool:
            if w.proc is not None and w.proc.poll() is None:
                w.proc.kill()
        shutil.rmtree(directory, ignore_errors=True)
