#!/usr/bin/env bash
# Make a Docker engine and corral's local base image available, for the `docker` tests.
#
# Idempotent: each step is skipped when already done (packages installed, dockerd
# answering, image present, root filesystem cached). Needs root, Debian's package mirror
# and nothing else: there is no image registry, so the base image is bootstrapped from
# Debian packages with debootstrap and imported.
#
# Environment:
#   CORRAL_BASE_IMAGE   image name to create (default corral-base:bookworm)
#   CORRAL_CACHE        cache directory (default /var/cache/corral)
#   CORRAL_DOCKER_LOG   dockerd's log file (default $CORRAL_CACHE/dockerd.log)
#
# Exits 0 when `docker info` works and the image exists; non-zero with the reason otherwise.
set -euo pipefail

IMAGE="${CORRAL_BASE_IMAGE:-corral-base:bookworm}"
CACHE="${CORRAL_CACHE:-/var/cache/corral}"
LOG="${CORRAL_DOCKER_LOG:-$CACHE/dockerd.log}"
SUITE=bookworm
ROOTFS_TAR="$CACHE/$SUITE-rootfs.tar"

say() { echo "docker-setup: $*" >&2; }
mkdir -p "$CACHE"

need_packages=()
command -v dockerd >/dev/null 2>&1 || need_packages+=(docker.io containerd runc)
# debootstrap verifies the mirror's signatures with the archive keyring and gpgv.
command -v debootstrap >/dev/null 2>&1 || need_packages+=(debootstrap debian-archive-keyring gpgv)
if ((${#need_packages[@]})); then
    say "installing ${need_packages[*]}"
    export DEBIAN_FRONTEND=noninteractive
    # The package lists may be missing or stale on a fresh machine.
    apt-get update -qq
    apt-get install -y -qq --no-install-recommends "${need_packages[@]}" >/dev/null
fi

engine_up() { docker info >/dev/null 2>&1; }

wait_engine() {
    local pid=$1
    for _ in $(seq 1 60); do
        engine_up && return 0
        kill -0 "$pid" 2>/dev/null || return 1
        sleep 0.5
    done
    return 1
}

start_dockerd() {
    # Detached from this script (setsid), so it outlives the calling shell.
    setsid dockerd "$@" >>"$LOG" 2>&1 </dev/null &
    local pid=$!
    if wait_engine "$pid"; then
        say "dockerd running (pid $pid, args: ${*:-none}, log $LOG)"
        return 0
    fi
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    return 1
}

if engine_up; then
    say "engine already running"
else
    # Full networking first (bridge + published ports); a sandbox without iptables or
    # bridges still gets host networking.
    start_dockerd ||
        start_dockerd --iptables=false --ip6tables=false --bridge=none || {
        say "dockerd did not start; last log lines:"
        tail -n 20 "$LOG" >&2 || true
        exit 1
    }
fi

if docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "image $IMAGE present"
    exit 0
fi

mirror() {
    # The Debian mirror apt is configured with (deb822 sources first, then sources.list).
    local uri
    uri=$(grep -hs '^URIs:' /etc/apt/sources.list.d/*.sources |
        awk '{print $2}' | grep -v -- '-security' | head -n 1 || true)
    if [[ -z "$uri" ]]; then
        uri=$(grep -hs '^deb ' /etc/apt/sources.list /etc/apt/sources.list.d/*.list |
            awk '{print $2}' | grep -i debian | grep -v -- '-security' | head -n 1 || true)
    fi
    echo "${uri:-http://deb.debian.org/debian}"
}

if [[ ! -s "$ROOTFS_TAR" ]]; then
    work=$(mktemp -d "$CACHE/rootfs.XXXXXX")
    trap 'rm -rf "$work"' EXIT
    url=$(mirror)
    say "bootstrapping Debian $SUITE from $url (about a minute)"
    start=$SECONDS
    debootstrap --variant=minbase --include=python3,python3-venv,python3-pip \
        "$SUITE" "$work/root" "$url" >"$CACHE/debootstrap.log" 2>&1 || {
        say "debootstrap failed; last lines of $CACHE/debootstrap.log:"
        tail -n 20 "$CACHE/debootstrap.log" >&2
        exit 1
    }
    # Package caches, lists and docs are of no use in an image.
    rm -rf "$work/root/var/cache/apt/archives/"*.deb "$work/root/var/lib/apt/lists/"* \
        "$work/root/usr/share/doc/"* "$work/root/usr/share/man/"* "$work/root/tmp/"*
    tar -C "$work/root" -cf "$ROOTFS_TAR.tmp" . && mv "$ROOTFS_TAR.tmp" "$ROOTFS_TAR"
    rm -rf "$work"
    trap - EXIT
    say "bootstrapped in $((SECONDS - start)) s"
fi

docker import \
    --change 'ENV LANG=C.UTF-8' \
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' \
    --change 'CMD ["python3"]' \
    "$ROOTFS_TAR" "$IMAGE" >/dev/null
say "imported $IMAGE ($(docker image inspect -f '{{.Size}}' "$IMAGE") bytes)"
