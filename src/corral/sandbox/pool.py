"""Warm sandboxes ready before an episode asks: taken at reset, recycled in the background.

A :class:`SandboxPool` keeps ``spares`` :class:`~corral.sandbox.forkserver.WarmSandbox`
es of one configuration started, each with a worker forked ahead of time. An episode
takes one (:meth:`SandboxPool.acquire`: no process is started on that path when a spare
is ready) and gives it back when it ends (:meth:`SandboxPool.release`); a background
thread recycles it (:meth:`~corral.sandbox.forkserver.WarmSandbox.recycle`: every
process killed, the directory emptied, the uid's kernel objects removed) and keeps it for
the next episode, or retires it if anything was amiss. The same thread starts new
sandboxes whenever fewer than ``spares`` are ready or being recycled.

Under load (many sessions ending episodes back to back) the background can fall behind.
An acquisition that finds no spare ready then recycles a returned sandbox itself, or
waits for one being recycled (:data:`RECYCLE_WAIT` at most), rather than starting one:
a recycling costs a few milliseconds of CPU, a new sandbox (``bwrap``, an interpreter)
tens, and starting new ones while returned ones pile up would only add sandboxes to
retire. So recycling keeps pace with the episodes however many end at once, and the
pool holds about as many sandboxes as episodes run at once, plus ``spares``.

Environments of one configuration share one pool (:func:`shared_pool`), counted by
:meth:`~SandboxPool.attach` / :meth:`~SandboxPool.detach`: when the last one detaches,
every sandbox of the pool is closed before ``detach`` returns, so a closed environment
leaves no process or directory behind. Pools still open at interpreter exit are closed
then.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import threading
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass

from corral.sandbox.forkserver import WarmSandbox
from corral.sandbox.profile import SandboxError

log = logging.getLogger("corral.sandbox")

RECYCLERS = 2
"""Background threads per pool: recycling waits on the sandbox (kills, a fork), so two
keep up with sessions that end episodes back to back (and acquisitions help them when
they do not)."""
RECYCLE_WAIT = 2.0
"""Seconds an acquisition waits for a sandbox being recycled by another thread before it
starts one itself (a recycling stuck on a sandbox that will not die must not hold an
episode up)."""


@dataclass
class PoolStats:
    """What a pool did (for benchmarks and logs)."""

    started: int = 0
    """Sandboxes started, in the background or on demand."""
    cold: int = 0
    """Acquisitions that found no spare ready and started a sandbox on the caller's path."""
    helped: int = 0
    """Acquisitions that found no spare ready and recycled a returned sandbox themselves."""
    recycled: int = 0
    """Sandboxes made ready again after an episode."""
    retired: int = 0
    """Sandboxes closed because recycling found something amiss (or too many were idle)."""


class SandboxPool:
    """Warm sandboxes of one configuration (see the module docstring).

    Args:
        factory: starts one sandbox (in a background thread, or the caller's).
        spares: sandboxes kept ready beyond those in use.
        cpu_hard: the lifetime CPU limit of a worker forked ahead of time (lowered by
            the episode at its first request).
    """

    def __init__(self, factory: Callable[[], WarmSandbox], spares: int, cpu_hard: int) -> None:
        if spares < 1:
            raise ValueError(f"spares must be at least 1, got {spares}")
        self._factory = factory
        self.spares = spares
        self.max_idle = 2 * spares + 2
        """Recycled sandboxes beyond this many ready ones are closed."""
        self._cpu_hard = cpu_hard
        self.stats = PoolStats()
        self.users = 0
        self._idle: list[WarmSandbox] = []
        self._dirty: list[WarmSandbox] = []
        self._busy: set[WarmSandbox] = set()
        self._starting = 0
        self._recycling = 0
        self._closed = False
        self._cond = threading.Condition()
        self._threads: list[threading.Thread] = []

    # -- users -------------------------------------------------------------------------

    def attach(self) -> bool:
        """One more environment uses the pool (starts its threads on first use); False
        if the pool is closed (it cannot be used)."""
        with self._cond:
            if self._closed:
                return False
            self.users += 1
            if not self._threads:
                for index in range(RECYCLERS):
                    thread = threading.Thread(
                        target=self._run, name=f"corral-sandbox-pool-{index}", daemon=True
                    )
                    thread.start()
                    self._threads.append(thread)
            self._cond.notify_all()
            return True

    def detach(self) -> bool:
        """One environment less; the last one closes the pool. True if it did."""
        with self._cond:
            self.users -= 1
            if self.users > 0:
                return False
        self.close()
        return True

    # -- episodes ----------------------------------------------------------------------

    def acquire(self) -> WarmSandbox:
        """A ready sandbox for a new episode: a spare, one recycled now (by this thread
        or another), or one started now.

        Raises:
            SandboxError: none could be started.
            RuntimeError: the pool is closed.
        """
        deadline = time.monotonic() + RECYCLE_WAIT
        while True:
            with self._cond:
                if self._closed:
                    raise RuntimeError("the sandbox pool is closed")
                if self._idle:
                    sandbox = self._idle.pop()
                    self._busy.add(sandbox)
                    self._cond.notify_all()  # a spare fewer: start another
                    return sandbox
                returned = self._dirty.pop(0) if self._dirty else None
                if returned is not None:
                    self._recycling += 1
                elif self._recycling and (remaining := deadline - time.monotonic()) > 0:
                    self._cond.wait(remaining)  # one is on its way (module docstring)
                    continue
                else:
                    self.stats.cold += 1
                    self._cond.notify_all()  # a spare fewer: start another
                    break
            if self._renew(returned, claim=True):
                return returned
        sandbox = self._factory()
        with self._cond:
            self.stats.started += 1
            self._busy.add(sandbox)
        return sandbox

    def release(self, sandbox: WarmSandbox) -> None:
        """Give a sandbox back after its episode: recycled in the background (or closed
        at once when the pool is closed)."""
        with self._cond:
            self._busy.discard(sandbox)
            if not self._closed:
                self._dirty.append(sandbox)
                self._cond.notify_all()
                return
        sandbox.close()

    @property
    def idle(self) -> int:
        """Sandboxes ready now."""
        return len(self._idle)

    def wait_ready(self, count: int, timeout: float) -> bool:
        """Wait until ``count`` sandboxes are ready (a server warming up); True if so."""
        with self._cond:
            return self._cond.wait_for(lambda: len(self._idle) >= count, timeout)

    # -- the background ----------------------------------------------------------------

    def _next_job(self) -> WarmSandbox | bool | None:
        """Under the lock: a sandbox to recycle, True to start one, None to stop."""
        while True:
            if self._closed:
                return None
            if self._dirty:
                self._recycling += 1
                return self._dirty.pop(0)
            if len(self._idle) + self._starting + self._recycling < self.spares:
                self._starting += 1
                return True
            self._cond.wait()

    def _run(self) -> None:
        while True:
            with self._cond:
                job = self._next_job()
            if job is None:
                return
            if job is True:
                self._start_one()
            elif isinstance(job, WarmSandbox):
                self._recycle(job)

    def _start_one(self) -> None:
        sandbox: WarmSandbox | None = None
        try:
            sandbox = self._factory()
            sandbox.worker_ahead(self._cpu_hard)
        except SandboxError as exc:  # the next episode will start one itself and say why
            log.warning("could not start a spare sandbox: %s", exc)
            if sandbox is not None:
                sandbox.close()
            sandbox = None
        with self._cond:
            self._starting -= 1
            if sandbox is not None:
                self.stats.started += 1
                if not self._closed:
                    self._idle.append(sandbox)
                    self._cond.notify_all()
                    return
            else:
                # Do not spin on a machine that cannot start sandboxes: wait for a release
                # or an acquisition before trying again.
                self._cond.wait(timeout=5.0)
                return
        sandbox.close()

    def _recycle(self, sandbox: WarmSandbox) -> None:
        self._renew(sandbox, claim=False)

    def _renew(self, sandbox: WarmSandbox, claim: bool) -> bool:
        """Recycle a returned ``sandbox`` (counted in ``_recycling`` by the caller, under
        the lock): ready for the caller's episode (``claim``; True then) or kept as a
        spare. Retired (closed) if anything was amiss, the pool closed, or too many are
        idle already."""
        try:
            ok = sandbox.recycle(self._cpu_hard)
        except Exception:  # a bug must not stop the pool: the sandbox is retired
            log.exception("recycling a sandbox failed")
            ok = False
        with self._cond:
            self._cond.notify_all()  # an acquisition waiting for it, or a spare to start
            if ok and not self._closed and (claim or len(self._idle) < self.max_idle):
                self._recycling -= 1
                self.stats.recycled += 1
                if claim:
                    self.stats.helped += 1
                    self._busy.add(sandbox)
                else:
                    self._idle.append(sandbox)
                return claim
            self.stats.retired += 1
        try:
            with contextlib.suppress(SandboxError):
                sandbox.close()
        finally:
            with self._cond:
                self._recycling -= 1  # only now: close() waits for it
                self._cond.notify_all()
        return False

    # -- the end -----------------------------------------------------------------------

    def close(self) -> None:
        """Close every sandbox of the pool (waiting for a recycling in progress)."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            threads, self._threads = self._threads, []
        for thread in threads:
            if thread is not threading.current_thread():
                thread.join()
        with self._cond:
            self._cond.wait_for(lambda: self._recycling == 0)  # by an acquisition
            leftovers = [*self._idle, *self._dirty, *self._busy]
            self._idle, self._dirty, self._busy = [], [], set()
        for sandbox in leftovers:
            with contextlib.suppress(SandboxError):
                sandbox.close()
        with _REGISTRY_LOCK:
            for key, pool in list(_REGISTRY.items()):
                if pool is self:
                    del _REGISTRY[key]


_REGISTRY: dict[Hashable, SandboxPool] = {}
_REGISTRY_LOCK = threading.Lock()


def shared_pool(
    key: Hashable, factory: Callable[[], WarmSandbox], spares: int, cpu_hard: int
) -> SandboxPool:
    """The process's pool for configuration ``key`` (created on first use), attached once
    for the caller: :meth:`SandboxPool.detach` it when done."""
    with _REGISTRY_LOCK:
        pool = _REGISTRY.get(key)
        if pool is None or not pool.attach():  # none yet, or one closing right now
            pool = _REGISTRY[key] = SandboxPool(factory, spares, cpu_hard)
            pool.attach()
        return pool


@atexit.register
def _close_all() -> None:
    with _REGISTRY_LOCK:
        pools = list(_REGISTRY.values())
    for pool in pools:
        pool.close()
