"""Namespace sandboxing: run untrusted code in a throwaway, limited corner of the machine.

Infrastructure shared by the coding environment (:mod:`corral.envs.coding`: a sandbox
per episode) and the local provider (:mod:`corral.providers.local`: a whole server in
one). One noun per module:

* :mod:`~corral.sandbox.profile`: the modes, a working profile, the errors;
* :mod:`~corral.sandbox.probe`: which modes work here (tried for real, cached);
* :mod:`~corral.sandbox.uids`: leased uids (as root), swept clean when taken;
* :mod:`~corral.sandbox.workspace`: a private directory and the filesystem view;
* :mod:`~corral.sandbox.quota`: the working directory's disk bound;
* :mod:`~corral.sandbox.command`: the argv that starts a command in a sandbox;
* :mod:`~corral.sandbox.channel`: talking to a sandboxed Python worker (requests,
  limits, verdicts);
* :mod:`~corral.sandbox.process`: a cold worker, a sandbox of its own;
* :mod:`~corral.sandbox.forkserver`: a warm sandbox whose fork server forks workers;
* :mod:`~corral.sandbox.pool`: warm sandboxes ready before an episode asks, recycled;
* :mod:`~corral.sandbox.limits` and :mod:`~corral.sandbox.outcomes`: what a worker may
  use, and what it reports.

``_worker.py`` (the worker) and ``_unshare_init.py`` (pid 1 of an ``unshare`` sandbox)
run inside sandboxes from source, with the standard library only.

Every sandboxed process gets, in every mode: RLIMIT_CPU (per action and again for the
tests), RLIMIT_AS/RLIMIT_DATA, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC, no core dumps,
a parent-enforced wall clock (the whole sandbox is killed when it runs out), stdout and
stderr capped (more kills the process), a private working directory deleted with the
episode and bounded in size (``max_disk_bytes``: reaching it kills the process with the
``disk`` outcome and empties the directory; :mod:`~corral.sandbox.quota`), a clean
environment, and a lifeline pipe: if the server dies the worker kills its process group.

The disk bound is exact in the namespace modes when corral runs as root (the working
directory is a tmpfs mounted with ``size=`` and ``nr_inodes=``, so it lives in memory:
count it with the sandbox's memory); elsewhere (the ``rlimits`` mode, unprivileged users)
RLIMIT_FSIZE bounds each file and the parent measures the directory while the sandbox runs
(every 20 ms, less often for a large tree), so a fast writer can pass the bound by what
it writes in that time.

Modes (:func:`resolve_profile`; ``"auto"`` probes them in this order and takes the first
that runs). What each guarantees was checked by ``tests/envs/test_coding.py`` (through the
coding environment) on Linux 6.x (as root, and the namespace modes also as an
unprivileged user):

``bwrap`` (bubblewrap; as root: run privileged, then ``setpriv`` to a leased uid; as a
user: an unprivileged user namespace)
    * Filesystem: a new root holding read-only ``/usr`` (and the ``/bin``, ``/lib*``
      links), the interpreter's prefix, a few ``/etc`` files (a generated passwd/group,
      the loader cache, localtime), a private ``/proc`` and a minimal ``/dev``; the
      working directory at ``/workspace`` is the only writable directory (a walk of the
      whole tree finds no other). ``/tmp``, ``/home``, ``/var``, ``/run``, ``/sys``, the
      rest of ``/etc`` and corral's own package (which holds the answers) are not there:
      reads and writes outside fail with ENOENT, EACCES or EROFS.
    * Network: a new network namespace with only a loopback interface; the host's
      127.0.0.1 services are unreachable (connections are refused).
    * Processes: a new pid namespace (the code sees only its own processes); killing the
      sandbox kills everything in it, including children that called ``setsid()``, and
      so does the death of the server. The code runs with no capabilities and
      ``no_new_privs``, as an unprivileged uid: a uid leased per episode (as root) or the
      user's own uid (otherwise). RLIMIT_NPROC is counted per leased uid or per user
      namespace, so a fork bomb stops at ``max_processes`` with EAGAIN and cannot starve
      other sessions. New IPC and UTS namespaces (the host name is ``sandbox``).

``unshare`` (util-linux ``unshare`` plus corral's init process, which builds the same
filesystem view with ``mount(2)``, ``chroot``s and drops privileges)
    * The same guarantees as ``bwrap``, except: there is no network interface at all
      (connecting fails with ENETUNREACH), and as an unprivileged user the code runs as
      uid 0 *of its own user namespace* with every capability dropped, which gives it no
      power over the host.

``rlimits`` (a last resort, when neither tool works: resource limits, a leased uid when
corral is root, and Python-level guards)
    * Enforced by the kernel: the resource limits above, and, as root, the leased uid:
      the code can only signal its own processes, can only write where any user may
      (world-writable directories such as ``/tmp``), and a fork bomb is contained and
      fully killed afterwards (every process of the uid is swept).
    * Enforced only by an audit hook in the interpreter (``sys.addaudithook``): no
      reading outside the working directory and the standard library, no writing outside
      the working directory, no sockets, no running programs, no ``ctypes``, no signals
      outside the sandbox's process group. These stop accidents and naive attempts, not
      an adversary: code written to get around them can (it was shown to run programs by
      loading a built-in extension module through ``importlib``), and then it can read
      every world-readable file (including the expected answers), reach the network and
      see the host's processes.
    * Without root there is no separate uid: the code runs as the server's user (only
      the guards stand between it and the server's processes), RLIMIT_NPROC is shared
      with the user's other processes, and children that call ``setsid()`` may outlive
      the episode.
    * As root the interpreter must be reachable by an unprivileged uid (pass
      ``python="/usr/bin/python3"`` when corral's own lives under ``/root``).

Not guaranteed by any mode: total memory beyond ``max_processes * memory_bytes`` (plus
the tmpfs working directory), and protection from kernel exploits (no seccomp
filter is installed). In the persistent mode, processes the code starts in the
background keep running between actions, within the same limits.

Warm sandboxes (:mod:`~corral.sandbox.forkserver`, the namespace modes as root) keep
every guarantee above for each worker and add a fork server in the sandbox; a sandbox
reused for another episode is recycled first (every process killed, the directory
emptied and reset, System V IPC objects and keyrings of its uid removed; POSIX message
queues cannot be created, RLIMIT_MSGQUEUE is 0 for every worker). What a reused sandbox
carries over are counters (the pid namespace's next pid, tmpfs inode numbers) and its
leased uid.
"""

from corral.sandbox._worker import canonical
from corral.sandbox.command import sandbox_command
from corral.sandbox.forkserver import ForkedWorker, WarmSandbox
from corral.sandbox.limits import SandboxLimits
from corral.sandbox.outcomes import CaseOutcome, ExecOutcome, KilledReason, TestsOutcome
from corral.sandbox.pool import SandboxPool
from corral.sandbox.probe import available_modes, resolve_profile
from corral.sandbox.process import SandboxProcess
from corral.sandbox.profile import SandboxError, SandboxMode, SandboxProfile, SandboxUnavailable
from corral.sandbox.uids import DEFAULT_UID_RANGE, processes_of
from corral.sandbox.workspace import MountEntry, Workspace

__all__ = [
    "DEFAULT_UID_RANGE",
    "CaseOutcome",
    "ExecOutcome",
    "ForkedWorker",
    "KilledReason",
    "MountEntry",
    "SandboxError",
    "SandboxLimits",
    "SandboxMode",
    "SandboxPool",
    "SandboxProcess",
    "SandboxProfile",
    "SandboxUnavailable",
    "TestsOutcome",
    "WarmSandbox",
    "Workspace",
    "available_modes",
    "canonical",
    "processes_of",
    "resolve_profile",
    "sandbox_command",
]
