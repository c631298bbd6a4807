"""Managed engines: the gateway starts an endpoint's engine process, keeps the endpoint out
of balancing until the engine answers its health probe, restarts it with exponential backoff
when it exits, and stops it (its whole process group) when the gateway stops.

One :class:`ManagedEngine` per endpoint of an entry with ``launch:``. Its state machine::

    stopped ─start()─▶ starting ─first passing health probe─▶ ready
                          │  ▲                                  │
      exit, or no ready   │  └──── backoff elapsed ────┐        │ exit
      within the timeout  ▼                            │        ▼
                       (failure) ──streak ≤ max──▶ restarting ◀─┘
                          │
                          └──streak > max_restarts──▶ failed
    any state ─stop()─▶ stopping ─▶ stopped

The gateway's health loop stays the only prober: it probes an engine only while it is
``starting`` or ``ready`` (a port whose engine is down may have been taken by another
process), and its first passing probe moves ``starting`` to ``ready`` through
:meth:`ManagedEngine.admits`. An engine that exits is taken out of balancing at once,
without waiting for failed probes; a failed request asks :meth:`ManagedEngine.confirm_exit`
first, so the slot it frees does not send a waiting request to a dead engine.

Engines run in their own process group (``setpgrp``, not a new session: on Linux a new
session is a new CPU autogroup, and an engine's spin loops then starve the gateway on small
machines), so SIGTERM/SIGKILL reach the workers an engine starts; and, on Linux, they get
SIGTERM if the gateway itself dies without stopping them (``PR_SET_PDEATHSIG``).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import enum
import json
import logging
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from shuniu.core.config import KvEventsConfig, LaunchConfig

__all__ = [
    "BASE_URL_TEMPLATE",
    "EnginePlan",
    "EngineState",
    "ManagedEngine",
    "backoff_delay",
    "base_url_template",
    "connect_host",
    "engine_url",
    "pick_port",
    "plan_engine",
    "port_in_use",
    "with_base_url",
]

log = logging.getLogger("shuniu.launcher")

BASE_URL_TEMPLATE = "http://{host}:{port}"
"""The ``base_url`` derived for a launched engine when the backend's options model does not
say otherwise with a ``launch_base_url`` class attribute (the ``openai`` backend's, whose
``base_url`` is the API root, is ``http://{host}:{port}/v1``)."""

_GROUP_POLL_S = 0.05
_EXIT_CONFIRM_S = 0.05
"""After a failed request: how long to look for the engine's exit before trusting it is alive."""
_EXIT_POLL_S = 0.002
_KILL_WAIT_S = 5.0
"""After SIGKILL: how long to wait for the group to disappear before giving up on it."""


class EngineState(enum.StrEnum):
    STOPPED = "stopped"
    STARTING = "starting"
    READY = "ready"
    RESTARTING = "restarting"
    FAILED = "failed"
    STOPPING = "stopping"


def backoff_delay(failures: int, backoff_s: float, max_backoff_s: float) -> float:
    """Seconds to wait before restarting after the ``failures``-th failure in a row (1, 2,
    ...): ``backoff_s`` doubled for each earlier failure, at most ``max_backoff_s``."""
    if failures < 1 or backoff_s <= 0:
        return 0.0
    # Cap the exponent: 2.0 ** 1100 overflows, and the cap is reached long before.
    return min(max_backoff_s, backoff_s * 2.0 ** min(failures - 1, 64))


def connect_host(host: str) -> str:
    """Where the gateway reaches an engine listening on ``host``: the loopback address for a
    wildcard listen address, and IPv6 addresses in brackets (for URLs)."""
    if host in ("0.0.0.0", ""):
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def base_url_template(options_type: type | None) -> str | None:
    """The ``base_url`` template of a backend's options model, or ``None`` when it has no
    ``base_url`` field (then nothing is derived)."""
    fields = getattr(options_type, "model_fields", None)
    if not fields or "base_url" not in fields:
        return None
    template = getattr(options_type, "launch_base_url", BASE_URL_TEMPLATE)
    return template if isinstance(template, str) else BASE_URL_TEMPLATE


def engine_url(template: str, host: str, port: int) -> str:
    return template.format(host=connect_host(host), port=port)


def with_base_url(options: Any, url: str) -> Any:
    """``options`` (a validated options model) with ``base_url`` set to ``url``, validated
    again so the model's own normalisation applies."""
    model = type(options)
    values = {name: getattr(options, name) for name in model.model_fields}
    values["base_url"] = url
    return model.model_validate(values)


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def pick_port(host: str, taken: set[int]) -> int:
    """A port free on ``host`` now, not in ``taken`` (added to it). Start-up only."""
    for _ in range(100):
        with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
            sock.bind((host or "127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        if port not in taken:
            taken.add(port)
            return port
    raise OSError(f"could not find a free port on {host}")


def port_in_use(host: str, port: int) -> bool:
    """Whether something listens on ``host:port`` (a bind test; sockets of a closed
    connection in TIME_WAIT do not count, as servers bind with SO_REUSEADDR)."""
    with socket.socket(_family(host), socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host or "127.0.0.1", port))
        except OSError:
            return True
    return False


@dataclass(frozen=True)
class EnginePlan:
    """One engine, resolved: the command and environment with placeholders filled in."""

    name: str
    """The endpoint's name."""
    model: str
    replica: int
    host: str
    port: int
    argv: list[str]
    env: dict[str, str]
    """Variables set on top of the gateway's environment."""
    cwd: str | None
    log_path: Path | None
    """``None``: the engine writes to the gateway's stdout and stderr."""
    config: LaunchConfig = field(repr=False)


KV_EVENTS_FLAG = "--kv-events-config"


def kv_events_argument(kv: KvEventsConfig) -> str:
    """The ``--kv-events-config`` JSON (vLLM's, also SGLang's) that makes an engine publish
    where the gateway subscribes (``kv``: the replica's addresses, as the gateway uses them):
    it binds the port the gateway connects to, or connects to the address the gateway binds."""

    def bound(address: str) -> str:
        port = address.rpartition(":")[2]
        return f"tcp://*:{port}" if address.startswith("tcp://") else address

    config: dict[str, Any] = {
        "enable_kv_cache_events": True,
        "publisher": "zmq",
        "endpoint": kv.endpoint if kv.bind else bound(kv.endpoint),
        "topic": kv.topic,
    }
    if kv.replay_endpoint is not None:
        config["replay_endpoint"] = bound(kv.replay_endpoint)
    return json.dumps(config)


def plan_engine(
    cfg: LaunchConfig,
    *,
    model: str,
    name: str,
    replica: int,
    port: int,
    kv_events: KvEventsConfig | None = None,
) -> EnginePlan:
    """Fill in the placeholders of ``cfg`` for one replica listening on ``port``; with
    ``kv_events`` (the replica's addresses) and a command that does not set
    ``--kv-events-config`` itself, the engine is told to publish there."""
    values = {"host": cfg.host, "port": port, "replica": replica, "name": name, "model": model}
    log_path = Path(cfg.log_dir).absolute() / f"{name}.log" if cfg.log_dir is not None else None
    argv = [arg.format_map(values) for arg in cfg.command]
    told = any(a == KV_EVENTS_FLAG or a.startswith(KV_EVENTS_FLAG + "=") for a in argv)
    if kv_events is not None and not told:
        argv += [KV_EVENTS_FLAG, kv_events_argument(kv_events)]
    return EnginePlan(
        name=name,
        model=model,
        replica=replica,
        host=cfg.host,
        port=port,
        argv=argv,
        env={key: value.format_map(values) for key, value in cfg.env.items()},
        cwd=cfg.cwd,
        log_path=log_path,
        config=cfg,
    )


# -- the child process -------------------------------------------------------------------------

_PR_SET_PDEATHSIG = 1


def _load_prctl() -> Any:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_PRCTL = _load_prctl()  # looked up here: the child should only call it, not load libraries


def _child_setup() -> None:
    """Runs in the child between fork and exec. ``preexec_fn``, because uvloop (the gateway's
    loop) does not take ``process_group``; both calls are plain system calls."""
    os.setpgrp()
    if _PRCTL is not None:
        _PRCTL(_PR_SET_PDEATHSIG, int(signal.SIGTERM))


def _signal_group(pgid: int, sig: signal.Signals) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _live_members(pgid: int) -> int:
    """Processes of group ``pgid`` that are not zombies (on Linux; elsewhere whether the group
    exists at all). Zombies are left out: an orphan is reaped by init, not by us."""
    if not os.path.isdir("/proc"):
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return 0
        return 1
    count = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                fields = f.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if len(fields) > 2 and fields[2] == str(pgid).encode() and fields[0] != b"Z":
            count += 1
    return count


async def _group_gone(pgid: int) -> None:
    # Shutdown and failure paths only: a /proc scan in a thread every 50 ms.
    # Nothing signals the end of processes we did not start (grandchildren): poll.
    while await asyncio.to_thread(_live_members, pgid):  # noqa: ASYNC110
        await asyncio.sleep(_GROUP_POLL_S)


def _has_exited(pid: int) -> bool:
    """Whether our child ``pid`` has exited, without reaping it (``WNOWAIT``: the loop's child
    watcher still collects the status). False where ``waitid`` is missing."""
    waitid = getattr(os, "waitid", None)
    if waitid is None:
        return False
    try:
        return waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:
        return True  # already reaped: it has exited


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "stopped"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


# -- one managed engine ------------------------------------------------------------------------


class ManagedEngine:
    """Starts, watches and restarts one engine process. Mutated only on the event loop."""

    def __init__(self, plan: EnginePlan, *, on_down: Callable[[], Any] | None = None) -> None:
        """``on_down`` is called whenever the engine stops serving (it exited, timed out, or
        is being stopped): the gateway takes the endpoint out of balancing."""
        self.plan = plan
        self.config = plan.config
        self.state = EngineState.STOPPED
        self.detail = ""
        """What happened last, in words (shown in ``/ready`` and ``shuniu ps``)."""
        self.pid: int | None = None
        self.restarts = 0
        """Restarts since the gateway started (every one, not only those in a row)."""
        self.last_exit_code: int | None = None
        """The last exit status; negative: killed by that signal."""
        self.generation = 0
        """Incremented at every start, so a probe that began before a restart cannot mark
        the new process ready."""
        self.on_down = on_down
        self._proc: asyncio.subprocess.Process | None = None
        self._spawning: asyncio.Future[asyncio.subprocess.Process] | None = None
        self._task: asyncio.Task[None] | None = None
        self._ready = asyncio.Event()
        self._started_at = 0.0
        self._ready_at: float | None = None
        self._exited_at = 0.0
        self._stopping = False

    # -- the gateway's side ----------------------------------------------------------------

    @property
    def probing(self) -> bool:
        """Whether health probes should run: the engine is starting or ready."""
        return self.state in (EngineState.STARTING, EngineState.READY)

    def admits(self, generation: int) -> bool:
        """A health probe started during ``generation`` passed: may the endpoint serve?
        Moves a starting engine to ``ready``. False when the engine was restarted or went
        down since the probe began."""
        if generation != self.generation or not self.probing:
            return False
        if self.state is EngineState.STARTING:
            self.state = EngineState.READY
            self._ready_at = time.monotonic()
            took = self._ready_at - self._started_at
            self.detail = f"ready in {took:.1f} s"
            plan = self.plan
            log.info("engine %s is ready in %.1f s (pid %s, port %d)", plan.name, took, self.pid, plan.port)
            self._ready.set()
        return True

    async def confirm_exit(self, within_s: float = _EXIT_CONFIRM_S) -> bool:
        """A request to the engine failed: is its process exiting, unnoticed so far? If so,
        take the endpoint out of balancing at once (the supervisor restarts it as usual).

        A killed engine's connections close a moment before the kernel reports it exited,
        so the exit is looked for during ``within_s`` (failure path only)."""
        proc = self._proc
        if proc is None or not self.probing:
            return False
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within_s
        while proc.returncode is None and not _has_exited(proc.pid):
            if loop.time() >= deadline or self._proc is not proc:
                return False
            await asyncio.sleep(_EXIT_POLL_S)
        if self._proc is proc and self.probing:
            # No longer probed or admitted (a probe answered before the exit cannot bring it
            # back); the supervisor reaps it and restarts it, or gives up, as for any exit.
            self.state = EngineState.RESTARTING
            self.detail = "exited"
            self._down()
        return True

    def start(self) -> None:
        """Start the engine and its supervisor (returns at once)."""
        if self._task is None:
            self._stopping = False
            self.state = EngineState.STARTING  # probes may begin at once
            self.detail = "starting"
            self._task = asyncio.get_running_loop().create_task(
                self._supervise(), name=f"engine:{self.plan.name}"
            )
            self._task.add_done_callback(self._supervisor_done)

    async def stop(self) -> None:
        """Stop the engine: SIGTERM to its process group, SIGKILL after ``stop_grace_s``."""
        self._stopping = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        if self._spawning is not None:
            # A start in progress finishes (the process may exist already), then stops.
            await asyncio.gather(self._spawning, return_exceptions=True)
        proc = self._proc
        if proc is not None:
            self._down()
            self.state = EngineState.STOPPING
            await self._terminate(proc, "the gateway is stopping")
            self.last_exit_code = proc.returncode
        self._proc = None
        self.pid = None
        self.state = EngineState.STOPPED
        self.detail = "stopped with the gateway"

    def snapshot(self) -> dict[str, Any]:
        """The engine's state for ``/ready``."""
        running = self._proc is not None and self._proc.returncode is None
        return {
            "state": self.state.value,
            "pid": self.pid if running else None,
            "host": self.plan.host,
            "port": self.plan.port,
            "restarts": self.restarts,
            "last_exit_code": self.last_exit_code,
            "uptime_s": round(time.monotonic() - self._started_at, 1) if running else None,
            "log": str(self.plan.log_path) if self.plan.log_path is not None else None,
            "detail": self.detail,
        }

    # -- the supervisor --------------------------------------------------------------------

    def _down(self) -> None:
        if self.on_down is not None:
            self.on_down()

    def _supervisor_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        exc = task.exception()
        if exc is not None:  # a bug: say so once, and leave the endpoint out
            log.error("the supervisor of engine %s failed", self.plan.name, exc_info=exc)
            self.state = EngineState.FAILED
            self.detail = f"supervisor failed: {type(exc).__name__}: {exc}"
            self._down()

    async def _supervise(self) -> None:
        restart = self.config.restart
        streak = 0
        while True:
            what = await self._run_once()
            self._down()
            if self._ready_at is not None and self._ready_at_exit() >= restart.reset_after_s:
                streak = 0
            streak += 1
            where = f"log: {self.plan.log_path}" if self.plan.log_path is not None else "log: gateway output"
            if restart.max_restarts is not None and streak > restart.max_restarts:
                self.state = EngineState.FAILED
                self.detail = f"{what}; gave up after {streak - 1} restart(s) in a row"
                log.error(
                    "engine %s %s; giving up after %d restart(s) in a row (%s)",
                    self.plan.name,
                    what,
                    streak - 1,
                    where,
                )
                return
            delay = backoff_delay(streak, restart.backoff_s, restart.max_backoff_s)
            self.state = EngineState.RESTARTING
            self.detail = f"{what}; restarting in {delay:.1f} s"
            log.warning(
                "engine %s %s; restarting in %.1f s (restart %d; %s)",
                self.plan.name,
                what,
                delay,
                self.restarts + 1,
                where,
            )
            await asyncio.sleep(delay)
            self.restarts += 1

    def _ready_at_exit(self) -> float:
        """How long the engine that just ended had been ready."""
        assert self._ready_at is not None
        return self._exited_at - self._ready_at

    async def _run_once(self) -> str:
        """Start the engine and wait until it exits (or misses its ready timeout); return what
        happened, in words."""
        self.generation += 1
        self.state = EngineState.STARTING
        self.detail = "starting"
        self._ready.clear()
        self._ready_at = None
        plan = self.plan
        if port_in_use(plan.host, plan.port):
            self.last_exit_code = None
            self.detail = f"port {plan.port} is in use"
            return f"could not start: port {plan.port} on {plan.host} is already in use"
        self._spawning = asyncio.ensure_future(self._spawn())
        try:
            # Shielded: a stop() arriving mid-spawn must still find the process to stop.
            proc = await asyncio.shield(self._spawning)
        except OSError as exc:
            self.last_exit_code = None
            return f"could not start: {exc}"
        finally:
            if self._spawning.done():
                self._spawning = None
        exited = asyncio.ensure_future(proc.wait())
        ready = asyncio.ensure_future(self._ready.wait())
        try:
            done, _ = await asyncio.wait(
                {exited, ready}, timeout=self.config.ready_timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            if not done:
                what = f"was not ready within {self.config.ready_timeout_s:g} s"
                self._down()
                self.state = EngineState.STOPPING
                await self._terminate(proc, what)
            else:
                await exited
                what = _describe_exit(proc.returncode)
                # Workers the engine started may outlive it (holding memory, devices or the
                # port); the group goes before a restart.
                await self._terminate(proc, what)
        finally:
            ready.cancel()
            if not exited.done():
                exited.cancel()
        self._exited_at = time.monotonic()
        self.last_exit_code = proc.returncode
        self._proc = None
        self.pid = None
        return what

    def _open_log(self) -> IO[bytes] | None:
        path = self.plan.log_path
        if path is None:
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        out = path.open("ab")
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        line = f"\n--- shuniu {stamp}: starting engine {self.plan.name}: {shlex.join(self.plan.argv)}\n"
        out.write(line.encode())
        out.flush()
        return out

    async def _spawn(self) -> asyncio.subprocess.Process:
        plan = self.plan
        out = await asyncio.to_thread(self._open_log)
        try:
            proc = await asyncio.create_subprocess_exec(
                *plan.argv,
                stdin=subprocess.DEVNULL,
                stdout=out if out is not None else None,
                stderr=subprocess.STDOUT if out is not None else None,
                env={**os.environ, **plan.env},
                cwd=plan.cwd,
                preexec_fn=_child_setup,
            )
        finally:
            if out is not None:
                out.close()  # the child has its own copy
        self._proc = proc
        self.pid = proc.pid
        self._started_at = time.monotonic()
        log.info("engine %s started (pid %d, port %d)", plan.name, proc.pid, plan.port)
        return proc

    async def _terminate(self, proc: asyncio.subprocess.Process, why: str) -> None:
        """End the engine's process group: SIGTERM, then SIGKILL after ``stop_grace_s``."""
        pgid = proc.pid  # setpgrp: the group is the engine's pid, holding only what it started
        if proc.returncode is not None and not await asyncio.to_thread(_live_members, pgid):
            return  # nothing left (and a group id with no members must not be signalled)
        grace = self.config.stop_grace_s
        _signal_group(pgid, signal.SIGTERM)
        try:
            async with asyncio.timeout(grace):
                await proc.wait()
                await _group_gone(pgid)
            return
        except TimeoutError:
            pass
        log.warning(
            "engine %s (%s) still running %g s after SIGTERM; sending SIGKILL", self.plan.name, why, grace
        )
        _signal_group(pgid, signal.SIGKILL)
        await proc.wait()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(_KILL_WAIT_S):
                await _group_gone(pgid)
