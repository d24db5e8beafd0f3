"""A sandboxed coding environment: the agent writes Python, hidden tests grade it.

Each episode has a task ("write ``is_prime(n)``", ...). Each action is Python source;
it runs in a sandboxed process, then the task's hidden cases call the function it
defined, in the same sandbox. The reward is the fraction of cases that pass; all of
them passing ends the episode. See :mod:`corral.envs.coding.env` for the rules and
options, :mod:`corral.envs.coding.tasks` for the tasks and how answers are compared.

    env = CodingEnv()                       # probes the machine, picks the strongest mode
    obs = env.reset(task="fizzbuzz")        # or reset(seed=3); persistent=True keeps state
    obs = env.step(CodeAction(code=source)) # obs.reward, obs.stdout, obs.killed_reason ...

Every sandboxed process gets, in every mode: RLIMIT_CPU (per action and again for the
tests), RLIMIT_AS/RLIMIT_DATA, RLIMIT_FSIZE, RLIMIT_NOFILE, RLIMIT_NPROC, no core dumps,
a parent-enforced wall clock (the whole sandbox is killed when it runs out), stdout and
stderr capped (more kills the process), a private working directory deleted with the
episode, a clean environment, and a lifeline pipe: if the server dies the worker kills
its process group. The expected answers never enter the sandbox; the parent compares.

Modes (``CodingEnv(sandbox=...)``; ``"auto"`` probes them in this order and takes the
first that runs; the mode in use is in ``state().sandbox_mode`` and in each
observation's ``metadata``). What each guarantees was checked by
``tests/envs/test_coding.py`` on Linux 6.x (as root, and the namespace modes also as an
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

``unshare`` (util-linux ``unshare`` plus corral's launcher, which builds the same
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

Not guaranteed by any mode: a bound on disk use of the working directory beyond
RLIMIT_FSIZE per file (put ``workdir_root`` on a filesystem with a quota), total memory
beyond ``max_processes * memory_bytes``, and protection from kernel exploits (no seccomp
filter is installed). In the persistent mode, processes the code starts in the
background keep running between actions, within the same limits.
"""

from corral.envs.coding.env import (
    CaseResult,
    CodeAction,
    CodeObservation,
    CodeState,
    CodingEnv,
)
from corral.envs.coding.sandbox import (
    KilledReason,
    SandboxError,
    SandboxLimits,
    SandboxMode,
    SandboxUnavailable,
    available_modes,
)
from corral.envs.coding.tasks import TASKS, Task, TaskCase

__all__ = [
    "TASKS",
    "CaseResult",
    "CodeAction",
    "CodeObservation",
    "CodeState",
    "CodingEnv",
    "KilledReason",
    "SandboxError",
    "SandboxLimits",
    "SandboxMode",
    "SandboxUnavailable",
    "Task",
    "TaskCase",
    "available_modes",
]
