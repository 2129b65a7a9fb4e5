#!/usr/bin/env bash
# The real thing, here: start dockerd, build a local base image (debootstrap + docker import, cached),
# docker-compose build, up --scale producer=3, check that the trainer finished with every batch, tear down.
# The teardown stops dockerd by its pid and undoes its iptables and bridge changes.
#   sudo bash docker/e2e.sh            (needs root, docker.io, docker-compose, debootstrap)
#   bash docker/e2e.sh --print-mirror  (prints the Debian mirror debootstrap would use, then exits; no root)
# debootstrap's mirror comes from this host's own apt configuration (see apt_mirror below);
# FERRY_DEBIAN_MIRROR=URL overrides it; FERRY_APT_DIR reads another apt folder than /etc/apt (for checks).
set -euo pipefail
cd "$(dirname "$0")/.."
SUITE=bookworm
BASE=ferry-base:$SUITE

# apt_mirror SUITE [APT_DIR]: the URI of the first enabled `deb` source in the apt configuration under
# APT_DIR (default /etc/apt) that serves SUITE exactly, read in apt's own order: sources.list, then
# sources.list.d/*.list and *.sources (one-line and deb822 formats). Prints nothing if there is none.
apt_mirror() {
    local suite=$1 dir=${2:-/etc/apt} f
    local files=()
    [ -f "$dir/sources.list" ] && files+=("$dir/sources.list")
    for f in "$dir"/sources.list.d/*; do
        case "$f" in *.list|*.sources) [ -f "$f" ] && files+=("$f") ;; esac
    done
    [ ${#files[@]} -gt 0 ] || return 0
    awk -v suite="$suite" '
        function usable(uri) { return uri ~ /^(https?|ftp|file):/ }
        function found(uri) { sub(/\/+$/, "", uri); print uri; done = 1; exit }
        function stanza_end(   i, n, t, s, u, typeok, suiteok) {
            if (!deb822) return
            typeok = 0; suiteok = 0
            n = split(f["types"], t, /[ \t]+/); for (i = 1; i <= n; i++) if (t[i] == "deb") typeok = 1
            n = split(f["suites"], s, /[ \t]+/); for (i = 1; i <= n; i++) if (s[i] == suite) suiteok = 1
            if (typeok && suiteok && tolower(f["enabled"]) != "no") {
                n = split(f["uris"], u, /[ \t]+/); for (i = 1; i <= n; i++) if (usable(u[i])) found(u[i])
            }
            delete f; key = ""
        }
        FNR == 1 { stanza_end(); deb822 = (FILENAME ~ /\.sources$/) }
        /^[ \t]*#/ { next }
        deb822 && /^[ \t]*$/ { stanza_end(); next }
        deb822 && /^[ \t]/ { if (key != "") f[key] = f[key] " " $0; next }   # a continuation line
        deb822 {                            # Key: value
            key = tolower(substr($0, 1, index($0, ":") - 1)); v = substr($0, index($0, ":") + 1)
            gsub(/^[ \t]+|[ \t\r]+$/, "", v); f[key] = v; next
        }
        $1 == "deb" {                       # deb [options] URI SUITE COMPONENT...
            i = 2
            if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ }
            if ($(i + 1) == suite && usable($i)) found($i)
        }
        END { if (!done) stanza_end() }
    ' "${files[@]}"
}

# the mirror debootstrap uses: FERRY_DEBIAN_MIRROR, else the host's apt configuration, else a clear error
debian_mirror() {
    local mirror=${FERRY_DEBIAN_MIRROR:-}
    [ -n "$mirror" ] || mirror=$(apt_mirror "$SUITE" "${FERRY_APT_DIR:-/etc/apt}")
    if [ -z "$mirror" ]; then
        echo "e2e: no Debian mirror for '$SUITE' in this host's apt configuration (read" \
             "${FERRY_APT_DIR:-/etc/apt}/sources.list and sources.list.d/*.list, *.sources: no enabled 'deb'" \
             "source serves suite '$SUITE'); set FERRY_DEBIAN_MIRROR=URL to name one" >&2
        return 1
    fi
    echo "$mirror"
}

if [ "${1:-}" = "--print-mirror" ]; then
    debian_mirror
    exit
fi
WORK=${FERRY_E2E_DIR:-/var/tmp/ferry-e2e}
mkdir -p "$WORK"
log() { echo "[e2e $(date +%H:%M:%S)] $*"; }

iptables-save > "$WORK/iptables.before" 2>/dev/null || true
DOCKERD_PID=""
cleanup() {
    set +e
    log "teardown"
    docker-compose -f compose.yaml down -v --remove-orphans >/dev/null 2>&1
    if [ -n "$DOCKERD_PID" ]; then
        kill "$DOCKERD_PID"; for _ in $(seq 50); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$DOCKERD_PID" 2>/dev/null
        ip link del docker0 2>/dev/null
        if [ -s "$WORK/iptables.before" ]; then
            iptables-restore < "$WORK/iptables.before"
        else  # no rules before dockerd: back to empty tables and ACCEPT policies
            for t in filter nat mangle raw; do iptables -t "$t" -F; iptables -t "$t" -X; done
            iptables -P INPUT ACCEPT; iptables -P FORWARD ACCEPT; iptables -P OUTPUT ACCEPT
        fi
        log "dockerd $DOCKERD_PID stopped; iptables restored; docker0 removed"
    fi
    rm -f docker/wheels/*/*.whl
}
trap cleanup EXIT

if ! docker info >/dev/null 2>&1; then
    log "starting dockerd"
    dockerd --pidfile "$WORK/dockerd.pid" > "$WORK/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 100); do docker info >/dev/null 2>&1 && break; sleep 0.3; done
    docker info >/dev/null
fi

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    MIRROR=$(debian_mirror)
    log "building $BASE with debootstrap from $MIRROR (cached for later runs)"
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase --include=python3,python3-pip "$SUITE" "$WORK/rootfs" "$MIRROR" \
        > "$WORK/debootstrap.log" 2>&1 || { tail -30 "$WORK/debootstrap.log"; exit 1; }
    tar -C "$WORK/rootfs" -c . | docker import - "$BASE" >/dev/null
    rm -rf "$WORK/rootfs"
fi

# every wheel the images need, fetched here (torch from the local CPU wheel): the builds run offline
log "fetching wheels into docker/wheels"
python3 -m pip download -q -d docker/wheels/base pyzmq msgpack numpy setuptools wheel > "$WORK/wheels.log" 2>&1
python3 -m pip download -q -d docker/wheels/torch torch==2.13.0 >> "$WORK/wheels.log" 2>&1
for w in docker/wheels/torch/*.whl; do case "$w" in */torch-*) ;; *) mv "$w" docker/wheels/base/ ;; esac; done
WHEEL=$(ls docker/wheels/torch/torch-*.whl | head -1)
export FERRY_BASE_IMAGE=$BASE
log "docker-compose build"
docker-compose -f compose.yaml build --build-arg TORCH_SPEC="/wheels/torch/$(basename "$WHEEL")" \
    --build-arg PIP_OPTIONS="--no-index --find-links /wheels/base" > "$WORK/build.log" 2>&1 \
    || { tail -30 "$WORK/build.log"; exit 1; }
docker image ls --format '{{.Repository}} {{.Size}}' | grep -E "producer|trainer|data" || true
log "docker-compose up -d --scale producer=3 (the trainer waits for all 3)"
export FERRY_MIN_PRODUCERS=3
docker-compose -f compose.yaml up -d --scale producer=3 > "$WORK/up.log" 2>&1
TRAINER=$(docker-compose -f compose.yaml ps -q trainer)
CODE=$(timeout 600 docker wait "$TRAINER")
docker logs "$TRAINER" > "$WORK/trainer.log" 2>&1
cat "$WORK/trainer.log"
log "docker-compose down (producers get SIGTERM, say BYE, exit 0)"
docker-compose -f compose.yaml down -v > "$WORK/down.log" 2>&1
if [ "$CODE" = "0" ] && grep -qE "done\. 16 batches from 3 producer" "$WORK/trainer.log"; then
    log "PASS: the trainer exited 0 with every batch (16 of 16) from 3 producers"
else
    log "FAIL (trainer exit code $CODE): see $WORK"; exit 1
fi
