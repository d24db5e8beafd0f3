#!/usr/bin/env bash
# Install Debian's Chromium for the web UI's browser tests (idempotent; Debian/Ubuntu).
# Playwright drives it through executable_path=/usr/bin/chromium: it never downloads a
# browser build of its own (the CI network only reaches the package registries).
set -euo pipefail

if ! [[ -x /usr/bin/chromium ]]; then
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || { echo "need root (or sudo) to install chromium" >&2; exit 1; }
        sudo=(sudo)
    fi
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        chromium fonts-dejavu-core
fi
/usr/bin/chromium --version
