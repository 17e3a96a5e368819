#!/usr/bin/env bash
# Build the Docker sandbox's image (`make docker-image`): an interpreter with numpy and the compiled languages'
# toolchains ($PACKAGES: Debian packages, `python -m sandboxes.toolchains packages`), tagged $IMAGE.
#   FROM=dockerfile  docker build from sandboxes/image/Dockerfile (python:3.11-slim + numpy; needs a registry)
#   FROM=rootfs      offline: a minimal Debian root filesystem with python3 and python3-numpy made by debootstrap
#                    from the distribution mirror ($MIRROR, $SUITE), then `docker import` (needs root)
#   FROM=auto        (default) the Dockerfile, and the rootfs when the registry cannot be reached
# An existing image is kept unless FORCE=1. When dockerd is installed but not running (and we are root) it is
# started and left running, as a service would be: sandbox=docker needs it after the build.
set -euo pipefail
IMAGE=${IMAGE:-fixlab-sandbox:latest}
FROM=${FROM:-auto}
FORCE=${FORCE:-}
MIRROR=${MIRROR:-http://deb.debian.org/debian}
SUITE=${SUITE:-bookworm}
PACKAGES=${PACKAGES:-}
here=$(cd "$(dirname "$0")" && pwd)
say() { echo "docker-image: $*"; }
die() { echo "docker-image: $*" >&2; exit 1; }

command -v docker >/dev/null 2>&1 || die "docker is not installed: \`make setup\` installs docker.io (as root)"
if ! docker version --format '{{.Server.Version}}' >/dev/null 2>&1; then
    command -v dockerd >/dev/null 2>&1 && [ "$(id -u)" = 0 ] || \
        die "the Docker daemon is not running: start it (as root \`dockerd &\`, or \`systemctl start docker\`)"
    log=/var/log/fixlab-dockerd.log
    setsid dockerd >>"$log" 2>&1 < /dev/null &
    pid=$!
    for _ in $(seq 120); do
        docker version --format '{{.Server.Version}}' >/dev/null 2>&1 && break
        kill -0 "$pid" 2>/dev/null || die "dockerd exited at start (log: $log)"
        sleep 0.5
    done
    docker version --format '{{.Server.Version}}' >/dev/null 2>&1 || die "dockerd did not answer in 60 s (log: $log)"
    say "started dockerd (pid $pid, log $log); it keeps running for sandbox=docker (stop it: kill $pid)"
fi
if [ -z "$FORCE" ] && docker image inspect "$IMAGE" >/dev/null 2>&1; then
    say "$IMAGE already built (FORCE=1 rebuilds)"
    exit 0
fi

from_dockerfile() {
    say "docker build $IMAGE from $here/Dockerfile"
    docker build -q -t "$IMAGE" --build-arg PACKAGES="$PACKAGES" -f "$here/Dockerfile" "$here"
}

from_rootfs() {
    [ "$(id -u)" = 0 ] || die "the offline build (debootstrap) needs root; online: FROM=dockerfile"
    if ! command -v debootstrap >/dev/null 2>&1; then
        command -v apt-get >/dev/null 2>&1 || die "debootstrap is not installed and there is no apt-get to install it"
        apt-get install -y -q debootstrap >/dev/null 2>&1 || \
            { apt-get update -q >/dev/null 2>&1 && apt-get install -y -q debootstrap >/dev/null 2>&1; } || \
            die "could not install debootstrap"
    fi
    tmp=$(mktemp -d /var/tmp/fixlab-rootfs.XXXXXX)
    trap 'rm -rf "$tmp"' EXIT
    include=$(echo "python3 python3-numpy $PACKAGES" | tr -s ' ' ',' | sed 's/,$//')
    say "debootstrap $SUITE ($include) from $MIRROR into $tmp (minutes: the toolchains are most of it)"
    debootstrap --variant=minbase --include="$include" "$SUITE" "$tmp/rootfs" "$MIRROR" \
        >"$tmp/debootstrap.log" 2>&1 || { tail -5 "$tmp/debootstrap.log" >&2; die "debootstrap failed"; }
    # What a container never needs: package caches and lists, docs, man pages, translations.
    rm -rf "$tmp"/rootfs/var/cache/apt/* "$tmp"/rootfs/var/lib/apt/lists/* "$tmp"/rootfs/usr/share/doc \
        "$tmp"/rootfs/usr/share/man "$tmp"/rootfs/usr/share/locale
    tar --numeric-owner -C "$tmp/rootfs" -c . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' -c 'CMD ["python3"]' \
        -m "fixlab sandbox: debootstrap $SUITE minbase + $include" - "$IMAGE" >/dev/null
}

case "$FROM" in
    dockerfile) from_dockerfile ;;
    rootfs) from_rootfs ;;
    auto) from_dockerfile || { say "docker build failed (no registry?): building from a Debian rootfs instead"; from_rootfs; } ;;
    *) die "FROM must be auto, dockerfile or rootfs, got '$FROM'" ;;
esac
# The image must run what the worker needs, under the sandbox's own flags.
docker run --rm --network none --read-only --user 65534:65534 "$IMAGE" \
    python3 -c "import sys, ctypes, numpy; print('docker-image: $IMAGE ready: Python', sys.version.split()[0], 'numpy', numpy.__version__)"
