#!/usr/bin/env bash
# The real thing, here: start dockerd, build a local base image (debootstrap + docker import, cached),
# docker-compose build, check that every image holds what the wheel holds (the `ferry` in site-packages,
# byte for byte) and runs, up --scale producer=3, check that the trainer finished with every batch and that a
# second trainer gets every batch equal to DataLoader's, tear down.
# The teardown stops dockerd by its pid and undoes its iptables, bridge and ip_forward changes, also on failure.
#   sudo bash docker/e2e.sh            (needs root, docker.io, docker-compose, debootstrap, iptables)
#   bash docker/e2e.sh --print-mirror  (prints the Debian mirror debootstrap would use, then exits; no root)
# Exit status: 0 passed; 77 cannot run on this machine (not root, a tool missing, dockerd does not start),
# which .ci/run reports as a skip outside CI and as a failure under CI=true; anything else failed.
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
# A project name of its own: the e2e never touches a `docker compose up` of this folder's, and its images,
# network and volume have known names (ferry-e2e_trainer, ...).
export COMPOSE_PROJECT_NAME=ferry-e2e
log() { echo "[e2e $(date +%H:%M:%S)] $*"; }
# cannot_run WHY: this machine cannot run the e2e at all; exit 77 (see the top)
cannot_run() { echo "e2e: cannot run here: $*" >&2; exit 77; }
# fail WHAT [LOG...]: say what failed, show the end of each log, exit 1 (the teardown still runs)
fail() {
    log "FAIL: $1"; shift
    local f; for f in "$@"; do [ -s "$f" ] && { echo "--- the end of $f"; tail -40 "$f"; }; done
    exit 1
}

[ "$(id -u)" = 0 ] || cannot_run "needs root (sudo bash docker/e2e.sh)"
for tool in docker docker-compose iptables-save iptables-restore ip; do
    command -v "$tool" >/dev/null || cannot_run "no $tool (apt-get install docker.io docker-compose iptables)"
done
mkdir -p "$WORK"
rm -f "$WORK"/*.log "$WORK"/*.modules "$WORK"/*.diff "$WORK"/*.before

DOCKERD_PID=""
cleanup() {
    set +e
    log "teardown"
    if docker info >/dev/null 2>&1; then
        docker rm -f ferry-e2e-checker >/dev/null 2>&1
        docker-compose -f compose.yaml down -v --remove-orphans >/dev/null 2>&1
    fi
    if [ -n "$DOCKERD_PID" ]; then
        kill "$DOCKERD_PID" 2>/dev/null; for _ in $(seq 100); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.2; done
        kill -9 "$DOCKERD_PID" 2>/dev/null
        # the containerd that dockerd started as its child stops with it; if dockerd had to be killed, stop it here
        local cpid; cpid=$(cat /var/run/docker/containerd/containerd.pid 2>/dev/null)
        [ -n "$cpid" ] && kill -0 "$cpid" 2>/dev/null && { kill "$cpid"; sleep 1; kill -9 "$cpid" 2>/dev/null; }
        local link
        for link in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}'); do
            case "$link" in docker0|br-*) grep -qxF "$link" "$WORK/bridges.before" || ip link del "$link" ;; esac
        done
        if [ -s "$WORK/iptables.before" ]; then
            iptables-restore < "$WORK/iptables.before"
        else  # no rules before dockerd: back to empty tables and ACCEPT policies
            for t in filter nat mangle raw; do iptables -t "$t" -F; iptables -t "$t" -X; done
            iptables -P INPUT ACCEPT; iptables -P FORWARD ACCEPT; iptables -P OUTPUT ACCEPT
        fi
        [ -s "$WORK/ip6tables.before" ] && ip6tables-restore < "$WORK/ip6tables.before"
        [ -s "$WORK/ip_forward.before" ] && cat "$WORK/ip_forward.before" > /proc/sys/net/ipv4/ip_forward
        log "dockerd $DOCKERD_PID stopped; iptables, bridges and ip_forward as they were"
    fi
    rm -f docker/wheels/*/*.whl
    rm -rf "$WORK/src" "$WORK/wheel" "$WORK/rootfs"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

if ! docker info >/dev/null 2>&1; then
    command -v dockerd >/dev/null || cannot_run "no dockerd running and none installed (apt-get install docker.io)"
    iptables-save > "$WORK/iptables.before" 2>/dev/null || true
    ip6tables-save > "$WORK/ip6tables.before" 2>/dev/null || true
    cat /proc/sys/net/ipv4/ip_forward > "$WORK/ip_forward.before" 2>/dev/null || true
    ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' > "$WORK/bridges.before"
    log "starting dockerd"
    dockerd --pidfile "$WORK/dockerd.pid" > "$WORK/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 100); do docker info >/dev/null 2>&1 && break; kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.3; done
    docker info >/dev/null 2>&1 || { tail -20 "$WORK/dockerd.log" >&2; cannot_run "dockerd did not start (log: $WORK/dockerd.log)"; }
fi

if ! docker image inspect "$BASE" >/dev/null 2>&1; then
    command -v debootstrap >/dev/null || cannot_run "no debootstrap to build $BASE (apt-get install debootstrap)"
    MIRROR=$(debian_mirror)
    log "building $BASE with debootstrap from $MIRROR (cached in dockerd's image store for later runs)"
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase --include=python3,python3-pip "$SUITE" "$WORK/rootfs" "$MIRROR" \
        > "$WORK/debootstrap.log" 2>&1 || fail "debootstrap" "$WORK/debootstrap.log"
    tar -C "$WORK/rootfs" -c . | docker import - "$BASE" >/dev/null || fail "docker import of $BASE"
    rm -rf "$WORK/rootfs"
fi

# every wheel the images need, fetched here for the base image's Python (torch from the local CPU wheel):
# the builds run offline
PYVER=$(docker run --rm "$BASE" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
    || fail "python3 does not run in $BASE"
log "fetching wheels for Python $PYVER into docker/wheels"
python3 -m pip download -q --only-binary=:all: --python-version "$PYVER" -d docker/wheels/base \
    pyzmq msgpack numpy setuptools wheel > "$WORK/wheels.log" 2>&1 || fail "pip download" "$WORK/wheels.log"
python3 -m pip download -q --only-binary=:all: --python-version "$PYVER" -d docker/wheels/torch torch==2.13.0 \
    >> "$WORK/wheels.log" 2>&1 || fail "pip download torch" "$WORK/wheels.log"
for w in docker/wheels/torch/*.whl; do case "$w" in */torch-*) ;; *) mv "$w" docker/wheels/base/ ;; esac; done
WHEEL=$(ls docker/wheels/torch/torch-*.whl | head -1)
export FERRY_BASE_IMAGE=$BASE
log "docker-compose build"
docker-compose -f compose.yaml build --build-arg TORCH_SPEC="/wheels/torch/$(basename "$WHEEL")" \
    --build-arg PIP_OPTIONS="--no-index --find-links /wheels/base" > "$WORK/build.log" 2>&1 \
    || fail "docker-compose build" "$WORK/build.log"

# image_of SERVICE: the image compose built for it (compose 1.x names it project_service, 2.x project-service)
image_of() {
    local name
    for name in "${COMPOSE_PROJECT_NAME}_$1" "${COMPOSE_PROJECT_NAME}-$1"; do
        docker image inspect "$name" >/dev/null 2>&1 && { echo "$name"; return; }
    done
    return 1
}
TRAINER_IMAGE=$(image_of trainer) || fail "no image was built for the trainer service" "$WORK/build.log"
PRODUCER_IMAGE=$(image_of producer) || fail "no image was built for the producer service" "$WORK/build.log"
DATA_IMAGE=$(image_of data) || fail "no image was built for the data service" "$WORK/build.log"
docker image ls --format '{{.Repository}} {{.Size}}' | grep -F "$COMPOSE_PROJECT_NAME" || true

# The images hold what the wheel holds: the wheel built here from a copy of this tree lists the ferry modules,
# and in each image `import ferry`, from the image's own working directory as `python -m` would, must come
# from site-packages (dist-packages) with exactly those modules, byte for byte. A source tree in the working
# directory shadows the package, and this fails.
log "checking each image against the wheel built from this tree"
rm -rf "$WORK/src" "$WORK/wheel"
mkdir -p "$WORK/src"
tar -c --exclude=./.git --exclude=./docker/wheels --exclude=__pycache__ --exclude='*.egg-info' --exclude=./build \
    --exclude=./dist . | tar -x -C "$WORK/src"
python3 -m pip wheel --no-deps --no-index --find-links docker/wheels/base -w "$WORK/wheel" "$WORK/src" \
    > "$WORK/wheel.log" 2>&1 || fail "pip wheel of this tree" "$WORK/wheel.log"
python3 - "$WORK/wheel"/ferry-*.whl > "$WORK/wheel.modules" <<'PY'
import hashlib, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as wheel:
    for name in wheel.namelist():
        if name.startswith("ferry/") and name.endswith(".py"):
            print(name, hashlib.sha256(wheel.read(name)).hexdigest())
PY
INSTALLED='
import hashlib, os, sys
import ferry
package = os.path.dirname(os.path.abspath(ferry.__file__))
site = os.path.dirname(package)
if os.path.basename(site) not in ("site-packages", "dist-packages"):
    sys.exit(f"ferry is imported from {package}, not from site-packages (cwd {os.getcwd()})")
for folder, dirs, files in os.walk(package):
    dirs[:] = [d for d in dirs if d != "__pycache__"]
    for f in files:
        if f.endswith(".py"):
            path = os.path.join(folder, f)
            with open(path, "rb") as fh:
                print(os.path.relpath(path, site), hashlib.sha256(fh.read()).hexdigest())
'
sort -o "$WORK/wheel.modules" "$WORK/wheel.modules"
[ -s "$WORK/wheel.modules" ] || fail "the wheel holds no ferry modules" "$WORK/wheel.log"
for image in "$TRAINER_IMAGE" "$PRODUCER_IMAGE" "$DATA_IMAGE"; do
    docker run --rm --entrypoint python3 "$image" -c "$INSTALLED" > "$WORK/$image.modules" 2> "$WORK/$image.log" \
        || fail "$image: import ferry" "$WORK/$image.log"
    sort -o "$WORK/$image.modules" "$WORK/$image.modules"
    diff -u "$WORK/wheel.modules" "$WORK/$image.modules" > "$WORK/$image.diff" \
        || fail "$image holds other ferry modules than the wheel (- wheel, + image)" "$WORK/$image.diff"
    docker run --rm "$image" --help > "$WORK/$image.help.log" 2>&1 || fail "$image --help" "$WORK/$image.help.log"
done
if docker run --rm --entrypoint python3 "$PRODUCER_IMAGE" -c 'import torch' >/dev/null 2>&1; then
    fail "the producer image has torch"
fi
log "each image imports ferry from site-packages with the wheel's $(wc -l < "$WORK/wheel.modules") modules, and --help runs; the producer has no torch"

# What an earlier, killed run of this project left (containers, its network, its volume) goes first. A network of
# this project's name with swarm scope belongs to a `docker stack deploy` of the same name, which compose cannot
# attach to: say so rather than fail in `up`.
docker-compose -f compose.yaml down -v --remove-orphans > "$WORK/leftovers.log" 2>&1 || true
if [ "$(docker network inspect -f '{{.Scope}}' "${COMPOSE_PROJECT_NAME}_default" 2>/dev/null)" = swarm ]; then
    fail "the network ${COMPOSE_PROJECT_NAME}_default is a swarm network (a stack named $COMPOSE_PROJECT_NAME is deployed on this dockerd): remove it with 'docker stack rm $COMPOSE_PROJECT_NAME'"
fi
log "docker-compose up -d --scale producer=3 (the trainer waits for all 3)"
export FERRY_MIN_PRODUCERS=3
compose_logs() { docker-compose -f compose.yaml logs --no-color > "$WORK/compose.log" 2>&1; }
docker-compose -f compose.yaml up -d --scale producer=3 > "$WORK/up.log" 2>&1 \
    || { compose_logs; fail "docker-compose up" "$WORK/up.log" "$WORK/compose.log"; }
TRAINER=$(docker-compose -f compose.yaml ps -q trainer)
CODE=$(timeout 600 docker wait "$TRAINER") || CODE="none: still running after 600 s"
docker logs "$TRAINER" > "$WORK/trainer.log" 2>&1
cat "$WORK/trainer.log"
if [ "$CODE" != "0" ] || ! grep -qE "done\. 16 batches from 3 producer" "$WORK/trainer.log"; then
    compose_logs; fail "the trainer (exit code $CODE) did not get 16 batches from 3 producers" "$WORK/compose.log"
fi
log "the trainer exited 0 with every batch (16 of 16) from 3 producers"

# Every batch's contents: the same producers move on to a second trainer at tcp://trainer:5555, which compares
# each batch with torch's DataLoader over the dataset in the volume (tests/compose_checker.py, mounted in).
NETWORK=$(docker inspect -f '{{range $name, $_ := .NetworkSettings.Networks}}{{$name}}{{end}}' "$TRAINER")
VOLUME=$(docker inspect -f '{{range .Mounts}}{{if eq .Destination "/data"}}{{.Name}}{{end}}{{end}}' "$TRAINER")
log "a second trainer on $NETWORK checks every batch against DataLoader"
timeout 300 docker run --rm --name ferry-e2e-checker --network "$NETWORK" --network-alias trainer \
    -v "$VOLUME:/data:ro" -v "$PWD/tests:/checker/tests:ro" -w /checker -e PYTHONDONTWRITEBYTECODE=1 \
    --entrypoint python3 "$TRAINER_IMAGE" -m tests.compose_checker 'tcp://*:5555' /data/demo 32 3 \
    > "$WORK/checker.log" 2>&1 || { compose_logs; fail "the batch check" "$WORK/checker.log" "$WORK/compose.log"; }
cat "$WORK/checker.log"
grep -q "checked 16 batches from 3 producers" "$WORK/checker.log" || fail "the batch check" "$WORK/checker.log"

log "docker-compose stop (producers get SIGTERM, say BYE, exit 0), then down"
docker-compose -f compose.yaml stop > "$WORK/down.log" 2>&1 || fail "docker-compose stop" "$WORK/down.log"
for c in $(docker-compose -f compose.yaml ps -q producer); do
    code=$(docker inspect -f '{{.State.ExitCode}}' "$c")
    [ "$code" = 0 ] || { compose_logs; fail "producer $c exited $code on SIGTERM" "$WORK/compose.log"; }
done
docker-compose -f compose.yaml down -v >> "$WORK/down.log" 2>&1 || fail "docker-compose down" "$WORK/down.log"
log "PASS: images hold the wheel's ferry; 16 of 16 batches from 3 producers, each equal to DataLoader's; clean stop"
