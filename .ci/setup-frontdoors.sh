#!/usr/bin/env bash
# Install the front doors the fleet tests put in front of real servers (idempotent;
# Debian/Ubuntu): nginx (the light build is enough: map, upstream, proxy) and HAProxy.
# The tests start their own instances on 127.0.0.1 with configurations rendered by
# corral.providers.frontdoor; the packages' system services are not used.
set -euo pipefail

missing=()
command -v nginx >/dev/null 2>&1 || [[ -x /usr/sbin/nginx ]] || missing+=(nginx-light)
command -v haproxy >/dev/null 2>&1 || [[ -x /usr/sbin/haproxy ]] || missing+=(haproxy)
if ((${#missing[@]})); then
    sudo=()
    if [[ $(id -u) -ne 0 ]]; then
        command -v sudo >/dev/null || { echo "need root (or sudo) to install ${missing[*]}" >&2; exit 1; }
        sudo=(sudo)
    fi
    "${sudo[@]}" apt-get update -qq
    # Where the packages start their system services (port 80), those are left alone:
    # the tests bring their own instances on free ports.
    DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq \
        --no-install-recommends "${missing[@]}"
fi
echo "front doors: $(/usr/sbin/nginx -v 2>&1), $(/usr/sbin/haproxy -v | head -n 1)"
