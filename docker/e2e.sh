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
# debootstrap's mirror comes from this host's own apt configuration (see apt_mirror in docker/lib.sh);
# FERRY_DEBIAN_MIRROR=URL overrides it; FERRY_APT_DIR reads another apt folder than /etc/apt (for checks).
set -euo pipefail
cd "$(dirname "$0")/.."
# The steps it shares with docker/swarm-e2e.sh (dockerd, the base image, the wheels and the build): docker/lib.sh
. docker/lib.sh

if [ "${1:-}" = "--print-mirror" ]; then
    debian_mirror
    exit
fi
WORK=${FERRY_E2E_DIR:-/var/tmp/ferry-e2e}
# A project name of its own: the e2e never touches a `docker compose up` of this folder's, and its images,
# network and volume have known names (ferry-e2e_trainer, ...).
export COMPOSE_PROJECT_NAME=ferry-e2e

require_tools docker docker-compose iptables-save iptables-restore ip
mkdir -p "$WORK"
rm -f "$WORK"/*.log "$WORK"/*.modules "$WORK"/*.diff "$WORK"/*.before

cleanup() {
    set +e
    log "teardown"
    if docker info >/dev/null 2>&1; then
        docker rm -f ferry-e2e-checker >/dev/null 2>&1
        docker-compose -f compose.yaml down -v --remove-orphans >/dev/null 2>&1
    fi
    stop_dockerd
    remove_wheels
    rm -rf "$WORK/src" "$WORK/wheel" "$WORK/rootfs"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

start_dockerd
build_base_image
build_images

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
docker run --rm --entrypoint python3 "$TRAINER_IMAGE" -c 'import prometheus_client' > "$WORK/metrics.log" 2>&1 \
    || fail "the trainer image cannot publish metrics (no prometheus_client)" "$WORK/metrics.log"
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
