# The steps that docker/e2e.sh (compose) and docker/swarm-e2e.sh (Swarm) share, sourced by both after `cd` to
# the repository root and with WORK set (their log folder): messages and exit statuses, dockerd started and
# stopped by its pid with this host's iptables, bridges and ip_forward put back as they were, the debootstrap base
# image (cached in dockerd's image store), the wheels for offline builds, and the images built from this tree.
# Not a program of its own: it defines functions and variables and runs nothing.
# shellcheck shell=bash

SUITE=bookworm
BASE=ferry-base:$SUITE
E2E_NAME=${E2E_NAME:-e2e}

log() { echo "[$E2E_NAME $(date +%H:%M:%S)] $*"; }
# cannot_run WHY: this machine cannot run the e2e at all; exit 77 (a skip outside CI, a failure under CI=true)
cannot_run() { echo "$E2E_NAME: cannot run here: $*" >&2; exit 77; }
# fail WHAT [LOG...]: say what failed, show the end of each log, exit 1 (the caller's teardown still runs)
fail() {
    log "FAIL: $1"; shift
    local f; for f in "$@"; do [ -s "$f" ] && { echo "--- the end of $f"; tail -40 "$f"; }; done
    exit 1
}

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
        echo "$E2E_NAME: no Debian mirror for '$SUITE' in this host's apt configuration (read" \
             "${FERRY_APT_DIR:-/etc/apt}/sources.list and sources.list.d/*.list, *.sources: no enabled 'deb'" \
             "source serves suite '$SUITE'); set FERRY_DEBIAN_MIRROR=URL to name one" >&2
        return 1
    fi
    echo "$mirror"
}

# require_tools TOOL...: root and each tool, or exit 77 naming what is missing
require_tools() {
    [ "$(id -u)" = 0 ] || cannot_run "needs root (sudo bash $0)"
    local tool
    for tool in "$@"; do
        command -v "$tool" >/dev/null || cannot_run "no $tool (apt-get install docker.io docker-compose iptables)"
    done
}

DOCKERD_PID=""
# What the host was before this script's dockerd, noted by start_dockerd and put back (then removed) by stop_dockerd.
# A run killed before its teardown leaves it: the next run with the same WORK keeps it, as the truth about the host.
HOST_BEFORE=""

# start_dockerd: unless a dockerd already answers, note this host's iptables, ip6tables, ip_forward and bridges in
# WORK/host-before (unless a killed run left them there), start dockerd and wait (bounded) until it answers; exit 77
# if it does not. A dockerd that a killed run with the same WORK started (its pidfile there) is taken over: this
# run's teardown stops it.
start_dockerd() {
    HOST_BEFORE=$WORK/host-before
    local pid _
    pid=$(cat "$WORK/dockerd.pid" 2>/dev/null || true)
    if [ -n "$pid" ] && [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = dockerd ] && docker info >/dev/null 2>&1; then
        log "dockerd $pid was started by a run that was killed before its teardown: this run stops it"
        DOCKERD_PID=$pid
        return 0
    fi
    docker info >/dev/null 2>&1 && return 0
    command -v dockerd >/dev/null || cannot_run "no dockerd running and none installed (apt-get install docker.io)"
    if [ -d "$HOST_BEFORE" ]; then
        log "keeping $HOST_BEFORE: a killed run noted the host there before its dockerd"
    else
        mkdir -p "$HOST_BEFORE.new"
        iptables-save > "$HOST_BEFORE.new/iptables" 2>/dev/null || true
        ip6tables-save > "$HOST_BEFORE.new/ip6tables" 2>/dev/null || true
        cat /proc/sys/net/ipv4/ip_forward > "$HOST_BEFORE.new/ip_forward" 2>/dev/null || true
        ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}' > "$HOST_BEFORE.new/bridges"
        ls /var/run/docker/netns 2>/dev/null > "$HOST_BEFORE.new/netns" || true
        mv "$HOST_BEFORE.new" "$HOST_BEFORE"
    fi
    log "starting dockerd"
    dockerd --pidfile "$WORK/dockerd.pid" > "$WORK/dockerd.log" 2>&1 &
    DOCKERD_PID=$!
    for _ in $(seq 100); do docker info >/dev/null 2>&1 && break; kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.3; done
    docker info >/dev/null 2>&1 || { tail -20 "$WORK/dockerd.log" >&2; cannot_run "dockerd did not start (log: $WORK/dockerd.log)"; }
}

# stop_dockerd: if start_dockerd started (or took over) dockerd, stop it (and the containerd it started) by pid, remove
# the bridges (docker0, br-*, Swarm's docker_gwbridge) and dockerd's network namespaces that were not there before,
# put iptables, ip6tables and ip_forward back as they were, and remove the notes. Nothing if this script found a dockerd already running.
# Safe under set -e (it is a teardown: each step is tried).
stop_dockerd() {
    [ -n "$DOCKERD_PID" ] || return 0
    local _ cpid link t
    kill "$DOCKERD_PID" 2>/dev/null || true
    for _ in $(seq 100); do kill -0 "$DOCKERD_PID" 2>/dev/null || break; sleep 0.2; done
    kill -9 "$DOCKERD_PID" 2>/dev/null || true
    # the containerd that dockerd started as its child stops with it; if dockerd had to be killed, stop it here
    cpid=$(cat /var/run/docker/containerd/containerd.pid 2>/dev/null || true)
    if [ -n "$cpid" ] && kill -0 "$cpid" 2>/dev/null; then
        kill "$cpid" 2>/dev/null || true; sleep 1; kill -9 "$cpid" 2>/dev/null || true
    fi
    stop_orphan_shims
    # the network namespaces of sandboxes dockerd did not get to remove (a network whose removal a stack rm raced)
    local ns
    for ns in /var/run/docker/netns/*; do
        [ -e "$ns" ] || continue
        grep -qxF "$(basename "$ns")" "$HOST_BEFORE/netns" 2>/dev/null && continue
        umount "$ns" 2>/dev/null || true
        rm -f "$ns" 2>/dev/null || true
    done
    for link in $(ip -o link show type bridge 2>/dev/null | awk -F': ' '{print $2}'); do
        case "$link" in
            docker0|docker_gwbridge|br-*)
                grep -qxF "$link" "$HOST_BEFORE/bridges" 2>/dev/null || ip link del "$link" 2>/dev/null || true ;;
        esac
    done
    if [ -s "$HOST_BEFORE/iptables" ]; then
        iptables-restore < "$HOST_BEFORE/iptables" || log "iptables-restore failed"
    else  # no rules before dockerd: back to empty tables and ACCEPT policies
        for t in filter nat mangle raw; do iptables -t "$t" -F || true; iptables -t "$t" -X || true; done
        iptables -P INPUT ACCEPT || true; iptables -P FORWARD ACCEPT || true; iptables -P OUTPUT ACCEPT || true
    fi
    if [ -s "$HOST_BEFORE/ip6tables" ]; then ip6tables-restore < "$HOST_BEFORE/ip6tables" || log "ip6tables-restore failed"; fi
    if [ -s "$HOST_BEFORE/ip_forward" ]; then cat "$HOST_BEFORE/ip_forward" > /proc/sys/net/ipv4/ip_forward || true; fi
    rm -rf "$HOST_BEFORE"
    log "dockerd $DOCKERD_PID stopped; iptables, bridges and ip_forward as they were"
    DOCKERD_PID=""
}

# stop_orphan_shims: a container shim of dockerd's own containerd that outlived both (a container being created when a
# killed run's dockerd and containerd died with it; a clean stop of dockerd stops every container and its shim):
# each shim and its children (the container's processes) by pid, then the container's empty cgroups and runtime state
stop_orphan_shims() {
    local shim id child _ group
    for shim in $(pgrep -f -- "-address /var/run/docker/containerd/containerd.sock" 2>/dev/null || true); do
        case "$(cat "/proc/$shim/comm" 2>/dev/null)" in containerd-shim*) ;; *) continue ;; esac
        id=$(tr '\0' '\n' < "/proc/$shim/cmdline" 2>/dev/null | sed -n '/^-id$/{n;p;q}')
        log "stopping the orphan container shim $shim (container ${id:-?}) of a killed dockerd"
        for child in $(ps -o pid= --ppid "$shim" 2>/dev/null); do kill -9 "$child" 2>/dev/null || true; done
        kill -9 "$shim" 2>/dev/null || true
        for _ in $(seq 25); do kill -0 "$shim" 2>/dev/null || break; sleep 0.2; done
        if [ -n "$id" ]; then
            for group in /sys/fs/cgroup/*/docker/"$id" /sys/fs/cgroup/docker/"$id"; do
                [ -d "$group" ] && { rmdir "$group" 2>/dev/null || true; }
            done
            rm -rf "/var/run/docker/runtime-runc/moby/$id" "/var/run/docker/containerd/$id"
        fi
    done
}

# build_base_image: BASE from debootstrap and docker import, unless dockerd's image store has it already
build_base_image() {
    docker image inspect "$BASE" >/dev/null 2>&1 && return 0
    command -v debootstrap >/dev/null || cannot_run "no debootstrap to build $BASE (apt-get install debootstrap)"
    local mirror
    mirror=$(debian_mirror) || exit 1
    log "building $BASE with debootstrap from $mirror (cached in dockerd's image store for later runs)"
    rm -rf "$WORK/rootfs"
    debootstrap --variant=minbase --include=python3,python3-pip "$SUITE" "$WORK/rootfs" "$mirror" \
        > "$WORK/debootstrap.log" 2>&1 || fail "debootstrap" "$WORK/debootstrap.log"
    tar -C "$WORK/rootfs" -c . | docker import - "$BASE" >/dev/null || fail "docker import of $BASE"
    rm -rf "$WORK/rootfs"
}

# image_of SERVICE: the image compose built for it (compose 1.x names it project_service, 2.x project-service)
image_of() {
    local name
    for name in "${COMPOSE_PROJECT_NAME}_$1" "${COMPOSE_PROJECT_NAME}-$1"; do
        docker image inspect "$name" >/dev/null 2>&1 && { echo "$name"; return; }
    done
    return 1
}

# build_images: every wheel the images need, fetched here for the base image's Python into docker/wheels (torch
# from the local CPU wheel), then compose.yaml's images built offline on BASE under COMPOSE_PROJECT_NAME; sets
# TRAINER_IMAGE, PRODUCER_IMAGE and DATA_IMAGE, and exports FERRY_BASE_IMAGE. remove_wheels (in the caller's teardown) removes the wheels.
build_images() {
    local pyver w wheel
    pyver=$(docker run --rm "$BASE" python3 -c 'import sys; print("%d.%d" % sys.version_info[:2])') \
        || fail "python3 does not run in $BASE"
    log "fetching wheels for Python $pyver into docker/wheels"
    python3 -m pip download -q --only-binary=:all: --python-version "$pyver" -d docker/wheels/base \
        pyzmq msgpack numpy prometheus-client setuptools wheel > "$WORK/wheels.log" 2>&1 || fail "pip download" "$WORK/wheels.log"
    python3 -m pip download -q --only-binary=:all: --python-version "$pyver" -d docker/wheels/torch torch==2.13.0 \
        >> "$WORK/wheels.log" 2>&1 || fail "pip download torch" "$WORK/wheels.log"
    for w in docker/wheels/torch/*.whl; do case "$w" in */torch-*) ;; *) mv "$w" docker/wheels/base/ ;; esac; done
    wheel=$(ls docker/wheels/torch/torch-*.whl | head -1)
    log "docker-compose build"
    export FERRY_BASE_IMAGE=$BASE
    docker-compose -f compose.yaml build \
        --build-arg TORCH_SPEC="/wheels/torch/$(basename "$wheel")" \
        --build-arg PIP_OPTIONS="--no-index --find-links /wheels/base" > "$WORK/build.log" 2>&1 \
        || fail "docker-compose build" "$WORK/build.log"
    # each rebuild leaves its builder stages as untagged images (about 3.4 GB): keep a day's, for the cache
    docker image prune -f --filter "until=24h" > /dev/null 2>&1 || true
    TRAINER_IMAGE=$(image_of trainer) || fail "no image was built for the trainer service" "$WORK/build.log"
    PRODUCER_IMAGE=$(image_of producer) || fail "no image was built for the producer service" "$WORK/build.log"
    DATA_IMAGE=$(image_of data) || fail "no image was built for the data service" "$WORK/build.log"
    docker image ls --format '{{.Repository}} {{.Size}}' | grep -F "$COMPOSE_PROJECT_NAME" || true
}

remove_wheels() { rm -f docker/wheels/*/*.whl; }
