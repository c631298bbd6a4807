"""What the benchmark scripts share: child processes, ports, readiness, ``/proc`` readings,
the machine-busy check, percentile summaries and JSON output.

The scripts run as ``python benchmarks/X.py``, which puts this folder first on ``sys.path``,
so they import this module as ``harness`` (as ``gateway_overhead.py`` imports ``loadgen``).

Processes. :class:`Children` starts each child in its own process group and keeps it until
:meth:`Children.stop_all`, which a ``with`` block, the end of the interpreter (``atexit``) and
therefore any exception runs; :func:`handle_signals` turns SIGINT, SIGTERM and SIGHUP into
exceptions, so that they unwind through the same clean-up. A child is stopped by its PID
only: SIGTERM, SIGKILL after its grace period, then the same for whatever is left in its
process group, whose id is that PID (``killpg`` of a group we created, never a name).

Numbers. Percentiles interpolate linearly between the two nearest ranks: they are
:func:`shuniu.core.stats.percentile`, the project's one percentile function.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import json
import os
import re
import resource
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, TracebackType
from typing import Any, NamedTuple, TypeVar

from shuniu.core.stats import percentile

__all__ = [
    "CLK_TCK",
    "ROOT",
    "SERVING",
    "Child",
    "Children",
    "CpuWindow",
    "MachineTicks",
    "failed",
    "free_port",
    "from_tests",
    "group_pids",
    "handle_signals",
    "http_get_json",
    "http_ok",
    "latency_summary_ms",
    "machine_busy",
    "machine_ticks",
    "nan_if_none",
    "own_cpu_s",
    "percentile",
    "percentile_of",
    "percentiles_ms",
    "proc_cpu_s",
    "procs_cpu_s",
    "rss_mib",
    "run_loadgen",
    "set_nodelay",
    "shuniu_command",
    "start_redis",
    "start_vllm",
    "tiny_model",
    "tree_pids",
    "wait_http_ok",
    "wait_serving",
    "wait_until",
    "warn_if_busy",
    "write_json",
]

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")

SERVING = re.compile(r"serving\b.* on http://(\S+):(\d+)")
"""The line ``shuniu serve`` and ``instant_upstream.py`` print once they listen (with
``--port 0`` it is the only way to learn the port)."""

T = TypeVar("T")


# -- child processes ---------------------------------------------------------------------


@dataclass
class Child:
    """One started process; ``host`` and ``port`` once :func:`wait_serving` has read them."""

    name: str
    proc: subprocess.Popen[bytes]
    log: Path
    grace: float = 10.0
    host: str = ""
    port: int = 0

    @property
    def pid(self) -> int:
        return self.proc.pid

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def exited(self) -> bool:
        return self.proc.poll() is not None

    def log_tail(self, lines: int = 30) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


_REGISTRIES: list[Children] = []


class Children:
    """Every process a run started (and clean-ups it deferred), undone in reverse order.

    Use it as a context manager; whatever is still registered when the interpreter exits is
    stopped too, so an early ``sys.exit`` or an uncaught exception leaves nothing behind."""

    def __init__(self) -> None:
        self.items: list[Child | Callable[[], Any]] = []
        _REGISTRIES.append(self)

    def __enter__(self) -> Children:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop_all()

    def start(
        self,
        name: str,
        cmd: Sequence[str],
        log: Path,
        *,
        err_log: Path | None = None,
        env: Mapping[str, str] | None = None,
        new_session: bool = True,
        preexec: Callable[[], None] | None = None,
        grace: float = 10.0,
    ) -> Child:
        """Start ``cmd`` with stdout to ``log`` (stderr too, unless ``err_log``), ``env`` on
        top of this process's environment and stdin closed.

        ``new_session`` (the default) makes it a session leader: its own process group, and
        with the kernel's autogroup scheduling its own CPU group, as a service started from
        another terminal would be. ``new_session=False`` keeps it in this session, in a
        process group of its own (``process_group=0``): for vLLM, whose ``sched_yield`` spin
        loops (shm_broadcast.py) starve the other autogroups for up to seconds on 2 cores."""
        with contextlib.ExitStack() as files:
            out = files.enter_context(open(log, "wb"))
            err = files.enter_context(open(err_log, "wb")) if err_log is not None else subprocess.STDOUT
            proc = subprocess.Popen(
                list(cmd),
                stdout=out,
                stderr=err,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **env} if env else None,
                start_new_session=new_session,
                process_group=None if new_session else 0,
                preexec_fn=preexec,
            )
        child = Child(name, proc, log, grace)
        self.items.append(child)
        return child

    def defer(self, cleanup: Callable[[], Any]) -> None:
        """Run ``cleanup`` (e.g. a helper server's ``close``) where a child would be stopped."""
        self.items.append(cleanup)

    def wait(
        self, child: Child, timeout: float, *, on_tick: Callable[[], Any] | None = None, interval: float = 0.2
    ) -> int:
        """Wait for ``child`` to exit on its own (calling ``on_tick`` every ``interval``) and
        return its exit status; RuntimeError past ``timeout`` (the caller stops it)."""
        deadline = time.monotonic() + timeout
        while child.proc.poll() is None:
            if time.monotonic() > deadline:
                raise RuntimeError(f"{child.name} ran past {timeout:.0f} s")
            if on_tick is not None:
                on_tick()
            time.sleep(interval)
        return child.proc.returncode

    def stop(self, child: Child) -> None:
        """Stop one child now and forget it."""
        _stop(child.proc, child.grace)
        self.items = [c for c in self.items if c is not child]

    def stop_all(self) -> None:
        """Stop every child and run every clean-up, the last started first. An item is only
        forgotten once done, so a second Ctrl-C here leaves the rest to the exit hook."""
        failures: list[Exception] = []
        while self.items:
            item = self.items[-1]
            try:
                if isinstance(item, Child):
                    _stop(item.proc, item.grace)
                else:
                    item()
            except Exception as exc:  # one failed clean-up must not leave the others running
                failures.append(exc)
            self.items.pop()
        if failures:
            raise failures[0]


def _stop(proc: subprocess.Popen[bytes], grace: float) -> None:
    """SIGTERM to the PID, SIGKILL after ``grace``; then the rest of its process group (the
    workers vLLM starts, the ``wrk`` a load generator runs) by that group's id, its PID."""
    if proc.poll() is None:
        try:
            proc.send_signal(signal.SIGTERM)
            proc.wait(grace)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
    # The group outlives its leader only while a member lives, so its id cannot have been
    # reused for someone else's processes.
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not group_pids(proc.pid):
            return
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        deadline = time.monotonic() + min(grace, 10.0)
        while group_pids(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)


@atexit.register
def _stop_everything() -> None:
    for registry in reversed(_REGISTRIES):
        registry.stop_all()


def failed(say: Callable[[str], Any], exc: KeyboardInterrupt | RuntimeError) -> int:
    """A runner's exit status for an interrupted (130) or failed (1) run, said with why; the
    runner's ``with Children()`` block stops its processes as this returns."""
    if isinstance(exc, KeyboardInterrupt):
        say("[red]interrupted; stopping the processes this run started[/]")
        return 130
    say(f"[red]benchmark failed:[/] {exc}")
    return 1


def _raise_interrupt(signum: int, frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


def _raise_exit(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def handle_signals(*, as_exit: bool = False) -> None:
    """Make SIGINT, SIGTERM and SIGHUP unwind through ``finally`` and ``with`` blocks, so that
    every child is stopped: KeyboardInterrupt for a runner that reports the interruption,
    ``SystemExit(128 + signal)`` (``as_exit``) for a tool whose parent reads its exit status.
    SIGINT explicitly, as a shell may start a background job with SIGINT ignored."""
    handler = _raise_exit if as_exit else _raise_interrupt
    signal.signal(signal.SIGINT, handler if as_exit else signal.default_int_handler)
    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGHUP, handler)


def shuniu_command() -> list[str]:
    """The ``shuniu`` of this interpreter's environment (``python -m shuniu.core`` without
    the script), never another installation's on PATH."""
    script = Path(sys.executable).with_name("shuniu")
    return [str(script)] if script.exists() else [sys.executable, "-m", "shuniu.core"]


def from_tests(module: str) -> ModuleType:
    """A helper module of ``tests/`` (``redis_server``, ``otlp_collector``, ``tiny_model``)."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module(f"tests.{module}")


def start_redis(children: Children) -> Any:
    """A ``redis-server`` of this run on a free port of 127.0.0.1 (``tests/redis_server.py``),
    closed with ``children``; None when none is installed."""
    rs = from_tests("redis_server")
    binary = rs.redis_server_binary()
    if binary is None:
        return None
    for attempt in range(3):  # another process may take the free port before the server does
        server = rs.RedisServer(binary)
        try:
            server.start()
        except RuntimeError:
            server.close()
            if attempt == 2:
                raise
            continue
        children.defer(server.close)  # stops it by its PID
        return server
    raise AssertionError("unreachable")


# -- vLLM's CPU build ----------------------------------------------------------------------

_VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # 1 GiB of KV cache
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}


def start_vllm(
    children: Children,
    python: Path,
    model_dir: Path,
    log: Path,
    *,
    served: str,
    port: int = 0,
    max_model_len: int = 1024,
    env: Mapping[str, str] | None = None,
    preexec: Callable[[], None] | None = None,
    timeout: float = 600.0,
    interval: float = 0.5,
) -> Child:
    """vLLM's OpenAI server (``python`` of its own virtualenv) on 127.0.0.1:``port`` (0: a free
    one) as the benchmarks run it: float32, eager, 1 GiB of KV cache, offline; ``env`` on top.
    Returns the child, with its host and port, once ``/health`` answers 200.

    It runs in its own process group, so that stopping it stops the engine core and worker it
    starts, but NOT in its own session: with the kernel's autogroup scheduling
    (sched_autogroup_enabled=1 here) a new session is a new CPU group, and vLLM's
    ``sched_yield()`` spin loops (shm_broadcast.py) then starve the other groups, this client
    among them, for up to seconds on these 2 cores."""
    port = port or free_port()
    cmd = [
        str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
        "--served-model-name", served, "--dtype", "float32", "--max-model-len", str(max_model_len),
        "--enforce-eager", "--host", "127.0.0.1", "--port", str(port),
    ]  # fmt: skip
    env = {**_VLLM_ENV, **(env or {})}
    child = children.start("vLLM", cmd, log, env=env, new_session=False, preexec=preexec, grace=30.0)
    child.host, child.port = "127.0.0.1", port
    wait_http_ok(child, f"{child.url}/health", timeout, interval)
    return child


def tiny_model(python: Path, model_dir: Path, say: Callable[[str], Any]) -> None:
    """Build the tiny random Llama with ``tests/tiny_model.py`` unless it is there."""
    helper = from_tests("tiny_model")
    if helper.is_built(model_dir):
        return
    say(f"building the tiny model into {model_dir}")
    helper.ensure_built(python, model_dir)


# -- ports and readiness -----------------------------------------------------------------


LOADGEN = HERE / "loadgen.py"


def run_loadgen(
    children: Children,
    tmpdir: Path,
    label: str,
    args: Sequence[str],
    timeout: float,
    on_tick: Callable[[], Any] | None = None,
) -> dict[str, Any]:
    """``loadgen.py ARGS --json`` in its own process (so that its CPU is not this one's); its
    result as a dict. RuntimeError with its stderr when it fails or runs past ``timeout``."""
    out, err = tmpdir / "loadgen.out", tmpdir / "loadgen.err"
    child = children.start(
        f"loadgen ({label})", [sys.executable, str(LOADGEN), *args, "--json"], out, err_log=err
    )
    try:
        status = children.wait(child, timeout, on_tick=on_tick)
    finally:
        children.stop(child)
    if status != 0:
        tail = err.read_text(errors="replace")[-2000:]
        raise RuntimeError(f"loadgen ({label}) failed with {status}:\n{tail}")
    result: dict[str, Any] = json.loads(out.read_text().strip().splitlines()[-1])
    return result


def free_port() -> int:
    """A port of 127.0.0.1 that was free just now (another process may still take it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def set_nodelay(transport: Any) -> None:
    """TCP_NODELAY on an asyncio transport's socket: small responses go out at once."""
    sock = transport.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


def wait_until(
    child: Child, check: Callable[[], T | None], timeout: float, what: str, interval: float = 0.5
) -> T:
    """Poll ``check`` until it returns something true and return that; RuntimeError with the
    child's log tail when the child exits first or after ``timeout`` (``what`` says what
    did not happen, e.g. "vLLM was not healthy")."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if child.exited():
            raise RuntimeError(f"{child.name} exited with {child.proc.returncode}:\n{child.log_tail()}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} within {timeout:g} s:\n{child.log_tail()}")
        time.sleep(interval)


def wait_serving(child: Child, timeout: float, pattern: re.Pattern[str] = SERVING) -> Child:
    """Wait for the child's ``serving ... on http://HOST:PORT`` line; set its host and port."""

    def said() -> re.Match[str] | None:
        try:
            return pattern.search(child.log.read_text(errors="replace"))
        except OSError:
            return None

    m = wait_until(child, said, timeout, f"{child.name} did not say it was serving", interval=0.05)
    child.host, child.port = m.group(1).strip("[]"), int(m.group(2))
    return child


# Health checks go straight to 127.0.0.1, never through an http_proxy of the environment.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def http_ok(url: str, timeout: float = 2.0) -> bool:
    """Whether a GET of ``url`` answers 200."""
    try:
        with _OPENER.open(url, timeout=timeout) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def http_get_json(url: str, timeout: float = 5.0) -> Any:
    """The JSON body of a 200 answer to a GET of ``url``; None for anything else."""
    try:
        with _OPENER.open(url, timeout=timeout) as r:
            return json.loads(r.read()) if r.status == 200 else None
    except (OSError, ValueError):
        return None


def wait_http_ok(child: Child, url: str, timeout: float, interval: float = 0.5) -> None:
    """GET ``url`` until it answers 200 (RuntimeError if the child exits or time runs out)."""
    wait_until(child, lambda: http_ok(url), timeout, f"{child.name} was not healthy", interval)


# -- /proc -------------------------------------------------------------------------------


def _stat_fields(pid: int) -> list[bytes]:
    """``/proc/PID/stat`` after the command name (which may hold spaces and parentheses):
    field 3 of proc(5) is index 0."""
    with open(f"/proc/{pid}/stat", "rb") as f:
        data = f.read()
    return data[data.rindex(b")") + 2 :].split()


def proc_cpu_s(pid: int, *, reaped_children: bool = False) -> float:
    """utime + stime of ``pid`` in seconds (plus cutime + cstime, the CPU of its children it
    has reaped, with ``reaped_children``); NaN once it is gone."""
    try:
        fields = _stat_fields(pid)
        return sum(int(v) for v in fields[11 : 15 if reaped_children else 13]) / CLK_TCK
    except (OSError, ValueError, IndexError):
        return float("nan")


def procs_cpu_s(pids: Iterable[int], *, reaped_children: bool = False) -> float:
    """:func:`proc_cpu_s` summed over ``pids``, leaving out those already gone."""
    total = 0.0
    for pid in pids:
        cpu = proc_cpu_s(pid, reaped_children=reaped_children)
        if cpu == cpu:
            total += cpu
    return total


def group_pids(pgid: int, *, zombies: bool = False) -> list[int]:
    """Processes of process group ``pgid``; zombies only with ``zombies`` (an orphaned one is
    init's to reap, and signals do nothing to it)."""
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry))
            if int(fields[2]) == pgid and (zombies or fields[0] != b"Z"):
                out.append(int(entry))
        except (OSError, ValueError, IndexError):
            pass
    return out


def tree_pids(pid: int) -> list[int]:
    """``pid`` and every process descended from it (a supervisor and the workers it started
    in process groups of their own), zombies left out."""
    parents: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = _stat_fields(int(entry))
            if fields[0] != b"Z":
                parents.setdefault(int(fields[1]), []).append(int(entry))
        except (OSError, ValueError, IndexError):
            pass
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(parents.get(p, ()))
    return out


def rss_mib(pid: int) -> float:
    """VmRSS of ``pid`` in MiB (``/proc/PID/status``); NaN without one (a zombie)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def own_cpu_s(*, children: bool = False) -> float:
    """This process's user + system CPU seconds (plus its waited-for children's)."""
    me = resource.getrusage(resource.RUSAGE_SELF)
    total = me.ru_utime + me.ru_stime
    if children:
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        total += kids.ru_utime + kids.ru_stime
    return total


class MachineTicks(NamedTuple):
    """Jiffies of all CPUs together since boot (``/proc/stat``)."""

    busy: int
    total: int
    irq: int
    """irq + softirq (mostly loopback TCP here): part of ``busy``, charged to no process."""
    steal: int = 0
    """Time the hypervisor gave this VM's CPUs to others while they wanted to run."""


_NO_TICKS = MachineTicks(0, 0, 0)


def machine_ticks() -> MachineTicks:
    with open("/proc/stat", "rb") as f:
        values = [int(v) for v in f.readline().split()[1:]]
    total = sum(values[:8])
    return MachineTicks(total - values[3] - values[4], total, values[5] + values[6], values[7])


def machine_busy(seconds: float = 1.0) -> float:
    """Fraction of all CPUs busy over the next ``seconds``."""
    b0, t0, *_ = machine_ticks()
    time.sleep(seconds)
    b1, t1, *_ = machine_ticks()
    return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


def warn_if_busy(
    say: Callable[[str], Any], note: str, *, cores: bool = False, threshold: float = 0.2
) -> float:
    """The machine-busy check before a run: other people's load skews every number. Measures
    one second; above ``threshold`` says so, with ``note``. Returns the busy fraction, or
    the busy cores with ``cores`` (the threshold is then in cores)."""
    busy = machine_busy(1.0)
    if cores:
        busy *= os.cpu_count() or 1
        what = f"{busy:.2f} cores already busy"
    else:
        what = f"the machine is already {100 * busy:.0f}% busy"
    if busy > threshold:
        say(f"[yellow]warning: {what}; {note}[/]")
    return busy


@dataclass
class CpuWindow:
    """CPU time over a window: of each watched process (a PID, or a function returning the
    PIDs to add up at that moment, e.g. a process group's members), of this process, and of
    the whole machine. :meth:`start`, then :meth:`stop`; the results are the attributes."""

    watch: Mapping[str, int | Callable[[], Iterable[int]]] = field(default_factory=dict)
    reaped_children: bool = False
    """Count the CPU of the watched processes' reaped children too (cutime + cstime)."""
    own_children: bool = False
    """Count this process's waited-for children (a ``wrk`` it ran) in :attr:`own_cpu_s`."""
    cpu_s: dict[str, float] = field(default_factory=dict)
    """Per watched name; NaN for a single PID that was gone at either end."""
    own_cpu_s: float = 0.0
    wall_s: float = 0.0
    ticks: MachineTicks = _NO_TICKS
    """The machine's jiffies over the window."""

    def _read(self) -> dict[str, float]:
        out = {}
        for name, what in self.watch.items():
            if isinstance(what, int):
                out[name] = proc_cpu_s(what, reaped_children=self.reaped_children)
            else:
                out[name] = procs_cpu_s(what(), reaped_children=self.reaped_children)
        return out

    def start(self) -> CpuWindow:
        self._procs = self._read()
        self._machine = machine_ticks()
        self._own = own_cpu_s(children=self.own_children)
        self._t0 = time.perf_counter()
        return self

    def stop(self) -> CpuWindow:
        self.wall_s = time.perf_counter() - self._t0
        self.own_cpu_s = own_cpu_s(children=self.own_children) - self._own
        m = machine_ticks()
        self.ticks = MachineTicks(*(a - b for a, b in zip(m, self._machine, strict=True)))
        end = self._read()
        self.cpu_s = {k: end[k] - self._procs[k] for k in end}
        return self

    @property
    def machine_busy(self) -> float:
        """Fraction of all CPUs busy over the window."""
        return self.ticks.busy / self.ticks.total if self.ticks.total > 0 else 0.0

    @property
    def steal(self) -> float:
        """Fraction of all CPUs' time stolen by the hypervisor over the window."""
        return self.ticks.steal / self.ticks.total if self.ticks.total > 0 else 0.0


# -- percentiles and summaries -----------------------------------------------------------


def percentile_of(values: Iterable[float], q: float) -> float | None:
    """:func:`percentile` of values in any order; None for none."""
    return percentile(sorted(values), q)


def nan_if_none(x: float | None) -> float:
    """For the scripts whose numbers are NaN, not None, where there were no samples."""
    return float("nan") if x is None else x


def percentiles_ms(
    samples_s: Iterable[float], qs: Sequence[float] = (50, 90, 99), ndigits: int = 4
) -> dict[str, float | None]:
    """``{"p50": ms, ...}`` of samples in seconds, rounded to ``ndigits``; None where empty."""
    s = sorted(samples_s)
    out: dict[str, float | None] = {}
    for q in qs:
        v = percentile(s, q)
        out[f"p{q:g}"] = None if v is None else round(1000 * v, ndigits)
    return out


def latency_summary_ms(
    samples_s: Iterable[float], qs: Sequence[float] = (50, 90, 99), ndigits: int = 4
) -> dict[str, float]:
    """:func:`percentiles_ms` plus ``max``, ``mean`` (ms) and ``n``; ``{}`` for no samples."""
    s = sorted(samples_s)
    if not s:
        return {}
    out: dict[str, float] = {k: v for k, v in percentiles_ms(s, qs, ndigits).items() if v is not None}
    out["max"] = round(1000 * s[-1], ndigits)
    out["mean"] = round(1000 * sum(s) / len(s), ndigits)
    out["n"] = len(s)
    return out


# -- output ------------------------------------------------------------------------------


def write_json(
    path: Path, data: Any, *, indent: int = 2, default: Callable[[Any], Any] | None = None, say: Any = None
) -> None:
    """Write ``data`` as JSON to ``path`` (making its folder); ``say("numbers written to
    PATH")`` when given."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=indent, default=default))
    if say is not None:
        say(f"numbers written to {path}")
