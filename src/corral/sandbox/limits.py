"""The resource limits of sandboxed processes."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class SandboxLimits(BaseModel):
    """Resource limits of every sandboxed process (per action unless stated otherwise).

    Attributes:
        cpu_seconds: CPU seconds for one action's code (RLIMIT_CPU, 1-second granularity);
            the hidden tests get the same budget again. Exceeding it kills the process.
        wall_seconds: wall-clock seconds for one action's code, enforced by the parent.
        test_wall_seconds: wall-clock seconds for running all the hidden tests.
        memory_bytes: address space per process (RLIMIT_AS and RLIMIT_DATA).
        max_processes: processes and threads the sandbox may have at once (RLIMIT_NPROC,
            counted per sandbox uid or user namespace).
        max_file_bytes: largest file a process may write (RLIMIT_FSIZE; never above
            ``max_disk_bytes``).
        max_disk_bytes: bytes the working directory may hold, all files together, for
            the whole episode (a size-limited tmpfs in the namespace modes as root, else
            measured while the sandbox runs: see :mod:`corral.sandbox.quota`); it allows
            one file per 4 KiB of it (at least 1024). Reaching it kills the process and
            empties the directory.
        max_open_files: open file descriptors per process (RLIMIT_NOFILE).
        max_output_bytes: bytes kept of stdout and of stderr each; more kills the process.
        nice: scheduling niceness of the sandbox, so a busy sandbox yields to the server.
        start_timeout: seconds a sandbox may take to start before it counts as broken.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    cpu_seconds: int = Field(default=5, ge=1, le=3600)
    wall_seconds: float = Field(default=10.0, gt=0, le=3600)
    test_wall_seconds: float = Field(default=10.0, gt=0, le=3600)
    memory_bytes: int = Field(default=512 * 1024 * 1024, ge=64 * 1024 * 1024)
    max_processes: int = Field(default=32, ge=4, le=65536)
    max_file_bytes: int = Field(default=16 * 1024 * 1024, ge=1024)
    max_disk_bytes: int = Field(default=64 * 1024 * 1024, ge=1024 * 1024)
    max_open_files: int = Field(default=64, ge=16, le=65536)
    max_output_bytes: int = Field(default=64 * 1024, ge=1024, le=64 * 1024 * 1024)
    nice: int = Field(default=5, ge=0, le=19)
    start_timeout: float = Field(default=15.0, gt=0, le=600)
