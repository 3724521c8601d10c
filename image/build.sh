#!/usr/bin/env bash
# `make image`: build raygate's image with no registry and no Docker engine.
#   1. tools: mmdebstrap, buildah, podman and runc from Debian's packages (apt-get, root only).
#   2. base:  a Debian bookworm root filesystem with python3.11 and pip, bootstrapped from Debian
#             packages by mmdebstrap and imported into containers-storage as $BASE_IMAGE. Skipped
#             when an image of this recipe (its tag carries the recipe's hash) is already there.
#   3. build: the unchanged Dockerfile with --build-arg BASE_IMAGE=$BASE_IMAGE (elsewhere it builds
#             FROM the public python:3.11 slim image), tagged $IMAGE.
# Usage: image/build.sh [tools|base|build|all]   (default: all). Prints the time of each step.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=$(sed -n 's/^__version__ = "\(.*\)"$/\1/p' raygate/__init__.py)
IMAGE=${IMAGE:-localhost/raygate:$VERSION}
SUITE=bookworm   # Debian 12: python3 is 3.11, the version the public base pins.
MIRROR=${DEBIAN_MIRROR:-http://deb.debian.org/debian}
SECURITY_MIRROR=${DEBIAN_SECURITY_MIRROR:-http://deb.debian.org/debian-security}
TOOLS=(mmdebstrap buildah podman runc)
# Everything the recipe depends on; the base tag changes with it, so an edit rebuilds the base.
RECIPE_HASH=$(sed -n '/^# --- base recipe/,/^# --- end of base recipe/p' "$0" | sha256sum | cut -c1-12)
BASE_IMAGE=${BASE_IMAGE:-localhost/raygate-base:$SUITE-$RECIPE_HASH}

say() { printf 'image: %s\n' "$*" >&2; }
timed() { local t0=$SECONDS; "$@"; say "$1 took $((SECONDS - t0)) s"; }

tools() {
    local missing=()
    for t in "${TOOLS[@]}"; do command -v "$t" >/dev/null || missing+=("$t"); done
    [ ${#missing[@]} -eq 0 ] && { say "tools present: ${TOOLS[*]}"; return; }
    if [ "$(id -u)" != 0 ]; then
        say "missing ${missing[*]}: run as root, or install Debian packages: ${TOOLS[*]}"
        exit 1
    fi
    say "installing ${missing[*]} from Debian's packages"
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${TOOLS[@]}" >/dev/null
}

# --- base recipe (hashed into the base image's tag) ---------------------------------------------
# variant essential: only Essential:yes packages (no apt, no init) plus what --include names.
# usr-is-merged with the merged-usr hook keeps usrmerge (and with it perl, ~45 MB) out.
# The docs, man pages and translations are not unpacked at all.
# EXTERNALLY-MANAGED goes: the image has one purpose and pip installs raygate into /usr/local.
bootstrap() {
    local tar=$1
    mmdebstrap --quiet --variant=essential \
        --include=usr-is-merged,python3,python3-pip,ca-certificates \
        --hook-dir=/usr/share/mmdebstrap/hooks/merged-usr \
        --dpkgopt='path-exclude=/usr/share/man/*' \
        --dpkgopt='path-exclude=/usr/share/doc/*' \
        --dpkgopt='path-include=/usr/share/doc/*/copyright' \
        --dpkgopt='path-exclude=/usr/share/locale/*' \
        --dpkgopt='path-exclude=/usr/share/info/*' \
        --customize-hook='rm -f "$1"/usr/lib/python3.*/EXTERNALLY-MANAGED' \
        "$SUITE" "$tar" \
        "deb $MIRROR $SUITE main" \
        "deb $MIRROR $SUITE-updates main" \
        "deb $SECURITY_MIRROR $SUITE-security main"
}
BASE_CHANGES=(
    --change 'ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin'
    --change 'ENV LANG=C.UTF-8'
    --change 'CMD ["python3"]'
)
# --- end of base recipe -------------------------------------------------------------------------

base() {
    if podman image exists "$BASE_IMAGE"; then say "base $BASE_IMAGE present"; return; fi
    local work; work=$(mktemp -d)
    say "bootstrapping Debian $SUITE into $BASE_IMAGE"
    bootstrap "$work/rootfs.tar" && podman import --quiet "${BASE_CHANGES[@]}" "$work/rootfs.tar" "$BASE_IMAGE" >/dev/null \
        || { rm -rf "$work"; say "bootstrapping the base failed (see above)"; exit 1; }
    rm -rf "$work"
}

build() {
    podman image exists "$BASE_IMAGE" || { say "no base image $BASE_IMAGE: run image/build.sh base"; exit 1; }
    local extra=()
    # A TLS-intercepting proxy's CA is in the host's bundle only: pip in the builder stage needs it.
    # Bind-mounted for the RUN steps, never part of a layer. (Debian's pip reads this file.)
    local ca=/etc/ssl/certs/ca-certificates.crt
    [ -f "$ca" ] && extra+=(--volume "$ca:$ca:ro")
    # chroot isolation: no OCI runtime or cgroups needed, and the host's network for PyPI.
    buildah bud --quiet --isolation chroot --pull=never --layers=false "${extra[@]}" \
        --build-arg BASE_IMAGE="$BASE_IMAGE" --build-arg VERSION="$VERSION" \
        --tag "$IMAGE" . >/dev/null
    local size; size=$(podman image inspect --format '{{.Size}}' "$IMAGE")
    say "built $IMAGE from $BASE_IMAGE: $((size / 1000000)) MB ($size bytes)"
}

case ${1:-all} in
    tools) timed tools ;;
    base) timed base ;;
    build) timed build ;;
    all) timed tools; timed base; timed build ;;
    *) say "usage: $0 [tools|base|build|all]"; exit 2 ;;
esac
