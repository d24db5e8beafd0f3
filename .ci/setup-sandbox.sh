#!/usr/bin/env bash
# Install what the coding environment's sandbox modes need (idempotent; Debian/Ubuntu).
#   bubblewrap  -> the "bwrap" mode
#   util-linux  -> the "unshare" mode (unshare) and setpriv (bwrap run as root)
#   procps      -> kill(1), used to sweep a sandbox uid in one atomic call
# Then print which modes work on this machine, with the reason for any that does not.
set -euo pipefail
cd "$(dirname "$0")/.."

packages=(bubblewrap util-linux procps)
missing=()
for package in "${packages[@]}"; do
    dpkg-query -W -f='${Status}' "$package" 2>/dev/null | grep -q "install ok installed" \
        || missing+=("$package")
done
if ((${#missing[@]})); then
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || { echo "need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
        sudo=(sudo)
    fi
    "${sudo[@]}" apt-get update -qq
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq --no-install-recommends \
        "${missing[@]}"
fi

python=.venv/bin/python
[[ -x $python ]] || python=python3
"$python" - <<'PY' || echo "(corral is not importable yet: the report runs after 'make' installs it)"
from corral.sandbox import available_modes

for mode, reason in available_modes().items():
    print(f"sandbox mode {mode}: {'works' if reason is None else reason}")
PY
