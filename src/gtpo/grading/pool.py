"""A hard time bound on one symbolic verdict, in any thread: math-verify + sympy run in worker processes.

Why processes. A verdict that reaches sympy can spend seconds in one C call (big-integer arithmetic,
`expand` of ``(x+y)^{1999}``, ``\\exp`` towers), and nothing inside the Python process can interrupt a
C call: math-verify's own timeout uses ``signal.alarm`` (main thread only), and an exception raised
into a thread (the previous design) waits for the next bytecode, which overshot a 2 s deadline by up
to 2.5 s. A child process can always be killed. So:

- A *zygote* process (``python -m gtpo.grading.pool FD``) imports math-verify and sympy once and forks
  workers on request; each worker's socket comes back over a Unix socket (SCM_RIGHTS). Forking a warm,
  single-threaded process takes milliseconds, so a killed worker is replaced before it is missed.
- `VerdictPool.verify` sends one JSON request line to an idle worker and polls for the reply line until
  its deadline, measured from the call (waiting for a free worker counts). At the deadline it SIGKILLs
  the worker (the zygote reaps it) and the verdict is `TIMED_OUT`. It stops waiting `KILL_MARGIN_S`
  early so that the kill and the return fit inside the bound: measured overshoot past that point
  up to ~10-19 ms on a loaded 2-core machine.
- One spare worker is kept idle or being forked, in the background. Only the zygote's start-up
  (imports, 1-3 s on a busy machine) is waited for without a deadline, once per process, like the
  import of sympy before: it is not any one answer's fault.
- A process that forks (DataLoader workers, multiprocessing with fork) never shares the parent's
  workers: the pool notices the new pid and starts its own.

Cost: one socket round trip (~0.1 ms) on top of a symbolic verdict that itself costs ~10 ms; the exact
numeric paths of `gtpo.grading.equivalence.is_equivalent` never reach the pool. Linux/macOS only (fork, SCM_RIGHTS).
"""

from __future__ import annotations

import atexit
import contextlib
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

logger = logging.getLogger(__name__)

TIMED_OUT = "timed out"  # the verdict ran past its deadline: the answer's fault
NO_WORKER = "no worker"  # every worker stayed busy until the deadline: nobody's fault, not to be cached
KILL_MARGIN_S = 0.05  # the overshoot after the deadline measured up to 19 ms on a loaded 2-core machine
MAX_WORKERS = 4  # concurrent grading threads beyond this wait (within their deadline) for a free worker
_READY = b"ready\n"


class _Zygote:
    """``python -m gtpo.grading.pool``: imports math-verify and sympy once, then forks workers on request.

    Forking a warm, single-threaded process takes milliseconds, so a killed worker is replaced before the
    next verdict needs it; starting a fresh interpreter would take 1-3 s of imports on a busy machine.
    Each worker's socket comes back over the control socket (SCM_RIGHTS), with the worker's pid to kill.
    """

    def __init__(self):
        src = str(Path(__file__).resolve().parent.parent)  # the tree this module came from, not another install
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH")) if p))
        env.setdefault("OMP_NUM_THREADS", "1")
        env.setdefault("PYTHONWARNINGS", "ignore")  # its stderr is ours: only a failed start should show
        self.control, theirs = socket.socketpair()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "gtpo.grading.pool", str(theirs.fileno())],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            env=env,
            pass_fds=(theirs.fileno(),),
        )
        theirs.close()
        self.lock = threading.Lock()
        self.control.settimeout(300)
        self.ready = self.control.recv(len(_READY)) == _READY

    def fork_worker(self) -> _Worker | None:
        with self.lock:
            try:
                self.control.sendall(b"f")
                message, fds, _flags, _address = socket.recv_fds(self.control, 64, 1)
            except OSError:
                return None
        if not fds:
            return None
        return _Worker(socket.socket(fileno=fds[0]), int(message))

    def close(self) -> None:
        self.control.close()  # the zygote exits on EOF; its workers exit on EOF of their sockets
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()


class _Worker:
    def __init__(self, sock: socket.socket, pid: int):
        self.sock, self.pid, self.buffer = sock, pid, b""
        self.poller = select.poll()
        self.poller.register(sock, select.POLLIN)

    def read_line(self, deadline: float | None) -> bytes | None:
        """One line from the worker, or None when `deadline` (perf_counter) passed; OSError if it died."""
        while b"\n" not in self.buffer:
            remaining = None if deadline is None else deadline - time.perf_counter()
            if remaining is not None and remaining <= 0:
                return None
            # poll, not select: select() fails on descriptors above 1024, common in a large training process
            if not self.poller.poll(None if remaining is None else max(1, int(remaining * 1000))):
                return None
            chunk = self.sock.recv(65536)
            if not chunk:
                raise ConnectionError("the grading worker exited")
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return line

    def idle_and_alive(self) -> bool:
        """An idle worker never has anything to read: any event on its socket is its exit (EOF/hang-up)."""
        return not self.poller.poll(0)

    def kill(self) -> None:
        # The zygote reaps its children (SIGCHLD ignored), so nothing here waits for the kernel's teardown.
        with contextlib.suppress(OSError):
            os.kill(self.pid, signal.SIGKILL)
        self.sock.close()


class VerdictPool:
    """Worker processes that answer ``verify(prediction, gold)`` and ``fingerprint(answer)`` within a deadline, from
    any thread."""

    def __init__(self, max_workers: int = MAX_WORKERS):
        self.pid = os.getpid()
        self.max_workers = max_workers
        self._cond = threading.Condition()
        self._idle: list[_Worker] = []
        self._busy = 0
        self._starting = 0
        self._failed_starts = 0
        self._zygote = _Zygote()  # the one start-up (imports) no verdict is charged for
        first = self._zygote.fork_worker() if self._zygote.ready else None
        if first is None:
            raise RuntimeError("the grading worker process did not start; its error is printed above")
        self._idle.append(first)
        self._ensure_spare()

    def _ensure_spare(self) -> None:
        """Keep one worker idle or being forked (called with the lock held, or before other threads see us)."""
        total = len(self._idle) + self._busy + self._starting
        if len(self._idle) + self._starting == 0 and total < self.max_workers and self._failed_starts < 3:
            self._starting += 1
            threading.Thread(target=self._start_in_background, daemon=True, name="gtpo-verdict-start").start()

    def _start_in_background(self) -> None:
        worker = self._zygote.fork_worker()
        if worker is None:  # the zygote died (killed from outside, out of memory): start a new one
            logger.warning("the grading zygote process died; starting a new one")
            self._zygote = _Zygote()
            worker = self._zygote.fork_worker() if self._zygote.ready else None
        with self._cond:
            self._starting -= 1
            if worker is None:
                self._failed_starts += 1
                logger.error("a grading worker process failed to start; its error is printed above")
            else:
                self._failed_starts = 0
                self._idle.append(worker)
            self._ensure_spare()
            self._cond.notify_all()

    def _acquire(self, deadline: float | None) -> _Worker | None:
        with self._cond:
            while True:
                while self._idle:
                    worker = self._idle.pop()
                    if worker.idle_and_alive():
                        self._busy += 1
                        self._ensure_spare()
                        return worker
                    worker.kill()  # it died while idle (killed from outside, out of memory): drop it
                self._ensure_spare()
                remaining = None if deadline is None else deadline - time.perf_counter()
                if remaining is not None and remaining <= 0:
                    return None
                if self._starting == 0 and self._failed_starts >= 3:
                    raise RuntimeError("grading worker processes keep failing to start; its error is printed above")
                self._cond.wait(remaining)

    def _release(self, worker: _Worker | None) -> None:
        with self._cond:
            self._busy -= 1
            if worker is not None:
                self._idle.append(worker)
            self._ensure_spare()
            self._cond.notify_all()

    def verify(self, prediction: str, gold: str, timeout: float | None):
        """math-verify's verdict (bool) on two lightly normalized LaTeX answers, `TIMED_OUT` or `NO_WORKER`.

        The whole call, waiting for a free worker included, returns within `timeout` seconds: it stops
        waiting `KILL_MARGIN_S` early to leave room for the kill. None waits as long as it takes.
        """
        answer = self._request([prediction, gold], timeout)
        if answer in (TIMED_OUT, NO_WORKER):
            return answer
        if "error" in answer:  # a bug in math-verify/sympy on this input: wrong, as in-process before
            logger.debug("grading worker error on %.80r vs %.80r: %s", prediction, gold, answer["error"])
            return False
        return bool(answer["verdict"])

    def fingerprint(self, latex: str, timeout: float | None):
        """:func:`gtpo.grading.symbolic.symbolic_fingerprint` of one answer (a dict), `TIMED_OUT` or
        `NO_WORKER`; None when math-verify or sympy failed on it. Same deadline rule as :meth:`verify`."""
        answer = self._request({"fingerprint": latex}, timeout)
        if answer in (TIMED_OUT, NO_WORKER):
            return answer
        return answer.get("fingerprint")

    def _request(self, payload, timeout: float | None):
        """One request line to an idle worker and its reply (a dict), `TIMED_OUT` or `NO_WORKER`."""
        # Stop waiting a little early, so that the kill and the return fit inside `timeout` too.
        deadline = None if timeout is None else time.perf_counter() + max(timeout - KILL_MARGIN_S, timeout / 2)
        for attempt in range(2):
            worker = self._acquire(deadline)
            if worker is None:
                return NO_WORKER
            try:
                worker.sock.sendall(json.dumps(payload).encode() + b"\n")
                reply = worker.read_line(deadline)
            except OSError:
                # The worker died: killed from outside or out of memory while idle (try a fresh one once),
                # or twice in a row on this input (then it is the input's fault, like a time-out).
                worker.kill()
                self._release(None)
                if attempt == 0:
                    continue
                return TIMED_OUT
            if reply is None:
                worker.kill()
                self._release(None)
                return TIMED_OUT
            break
        self._release(worker)
        return json.loads(reply)

    def close(self) -> None:
        with self._cond:
            for worker in self._idle:
                worker.kill()
            self._idle.clear()
        self._zygote.close()


_pool: VerdictPool | None = None
_pool_lock = threading.Lock()


def get_pool() -> VerdictPool:
    """The process's pool, started on first use (and again in a forked child)."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool.pid != os.getpid():
            _pool = VerdictPool()
        return _pool


@atexit.register
def _close_pool() -> None:
    if _pool is not None and _pool.pid == os.getpid():
        _pool.close()


def _answer(sock: socket.socket) -> None:
    """A worker: one JSON reply line per request line, until the parent closes the socket."""
    from gtpo.grading.symbolic import symbolic_fingerprint, verify_symbolic

    for line in sock.makefile("rb"):
        try:
            request = json.loads(line)
            if isinstance(request, dict):
                reply = {"fingerprint": symbolic_fingerprint(request["fingerprint"])}
            else:
                prediction, gold = request
                reply = {"verdict": bool(verify_symbolic(prediction, gold))}
        except Exception as error:  # noqa: BLE001 - any failure is a wrong answer, reported to the parent
            reply = {"error": f"{type(error).__name__}: {error}"[:300]}
        sock.sendall(json.dumps(reply).encode() + b"\n")


def _serve(control_fd: int) -> None:
    """The zygote: warm up, say ready, then fork one worker per request byte until the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group; the parent decides
    logging.disable(logging.WARNING)
    from gtpo.grading.symbolic import warm_math_verify

    warm_math_verify()
    control = socket.socket(fileno=control_fd)
    signal.signal(signal.SIGCHLD, signal.SIG_IGN)  # killed workers are reaped by the kernel
    control.sendall(_READY)
    while control.recv(1):
        mine, theirs = socket.socketpair()
        pid = os.fork()
        if pid == 0:
            try:
                control.close()
                theirs.close()
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                _answer(mine)
            finally:
                os._exit(0)
        mine.close()
        socket.send_fds(control, [str(pid).encode()], [theirs.fileno()])
        theirs.close()


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python -m gtpo.grading.pool CONTROL_FD (started by gtpo.grading.equivalence, not by hand)")
    _serve(int(sys.argv[1]))
