#!/usr/bin/env bash
# deploy/swarm/stack.yaml for real, here: dockerd, the images (docker/lib.sh, the steps docker/e2e.sh takes too),
# a single-node swarm, CURVE keys made by deploy/swarm/secrets.sh, then `docker stack deploy` of the stack with the
# trainer replaced by tests/engine_trainer.py (every batch compared with torch's DataLoader; it holds the epoch at
# two gates). At the first gate the producers are scaled up 2 -> 4 (`docker service scale`) and an intruder, a
# producer whose key was never authorized serving the same fingerprint with other values, is started as a service
# of its own; at the second they are scaled down 4 -> 1. Checked: the epoch is complete and equal to DataLoader's,
# the added producers delivered, the intruder was denied and delivered nothing, the producers scaled away (and the
# last one, scaled to 0) exit 0 on SIGTERM after their BYE, the last one's healthcheck (--probe ready) says healthy.
# The teardown removes the stack, the services, the secrets and the volume, leaves the swarm this script made and
# stops dockerd by its pid with iptables, bridges and ip_forward as they were, also on failure. What a run killed
# before its teardown left (its dockerd, its swarm and stack, the host's notes) the next run takes over and removes.
#   sudo bash docker/swarm-e2e.sh        (needs root, docker.io, docker-compose, debootstrap, iptables)
# Exit status: 0 passed; 77 cannot run on this machine (not root, a tool missing, dockerd does not start, no
# swarm), which .ci/run reports as a skip outside CI and as a failure under CI=true; anything else failed.
# Logs: FERRY_SWARM_E2E_DIR (default /var/tmp/ferry-swarm-e2e).
set -euo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
E2E_NAME=swarm-e2e
. docker/lib.sh
WORK=${FERRY_SWARM_E2E_DIR:-/var/tmp/ferry-swarm-e2e}
# The images are docker/e2e.sh's (compose.yaml built under its project name, ferry-e2e_trainer, ...): built once
# for both. The stack has a name of its own: a stack's overlay network is STACK_default, and one named
# ferry-e2e_default would stand in the way of docker/e2e.sh's compose network.
export COMPOSE_PROJECT_NAME=ferry-e2e
STACK=ferry-swarm-e2e
INTRUDER=ferry-swarm-e2e-intruder
SECRETS=(ferry-server.key_secret ferry-server.key ferry-producers.key_secret ferry-producers.key ferry-swarm-e2e-intruder.key_secret)
# Set when this script (or an earlier run of it that was killed before its teardown) made the swarm: the teardown
# then leaves it and removes what leaving keeps (the docker_gwbridge network)
SWARM_MARK=$WORK/swarm-made-by-this-script
# dockerd keeps a folder per swarm network's load balancer (lb_NETWORK-ID) under its network files after the network
# is gone; those that were not there before go in the teardown, once dockerd is stopped (noted before it is started,
# and kept, like docker/lib.sh's host notes, from a run that was killed before its teardown)
NETWORK_FILES=/var/lib/docker/network/files
NETWORK_FILES_BEFORE=$WORK/network-files.noted
SAMPLES=512 BATCH=16 GATE_UP=4 GATE_DOWN=16
BATCHES=$((SAMPLES / BATCH))

require_tools docker docker-compose iptables-save iptables-restore ip
mkdir -p "$WORK"
# (control/, keys/ and intruder/ are cleared once a killed run's containers, which may still write there, are gone)
rm -rf "$WORK"/*.log "$WORK"/*.yaml "$WORK"/*.before

SWARM_MADE="" SECRETS_MADE=""
# stack_containers [-a]: the containers of the stack's and the intruder's tasks that run (with -a: all of them;
# `docker stack rm` stops the tasks but leaves the containers of the jobs that completed)
stack_containers() {
    docker ps -q "$@" --filter "label=com.docker.stack.namespace=$STACK"
    docker ps -q "$@" --filter "label=com.docker.swarm.service.name=$INTRUDER"
}
# remove_stack: the intruder service, the stack, their containers, network and volume, and this script's secrets;
# each step tried (it also runs under set -e, for what a killed run left)
remove_stack() {
    local _ name
    docker service rm "$INTRUDER" >/dev/null 2>&1 || true
    docker stack rm "$STACK" >/dev/null 2>&1 || true
    # tasks stop (within their 10 s grace) and the overlay network goes asynchronously; the volume only after them. A
    # task that a stack rm raced (being created) may never stop: after 30 s its container is removed by force
    for _ in $(seq 60); do
        [ -z "$(stack_containers)" ] && ! docker network inspect "${STACK}_default" >/dev/null 2>&1 && break
        sleep 0.5
    done
    [ -z "$(stack_containers)" ] || log "containers of the stack still running after 30 s (removed by force): $(stack_containers | tr '\n' ' ')"
    stack_containers -a | sort -u | xargs -r docker rm -f >/dev/null 2>&1 || true
    docker network rm "${STACK}_default" >/dev/null 2>&1 || true
    docker volume rm "${STACK}_data" >/dev/null 2>&1 || true
    for name in "${SECRETS[@]}"; do docker secret rm "$name" >/dev/null 2>&1 || true; done
}
cleanup() {
    set +e
    log "teardown"
    if docker info >/dev/null 2>&1; then
        [ -n "$SECRETS_MADE$SWARM_MADE" ] && remove_stack
        if [ -n "$SWARM_MADE" ]; then
            docker swarm leave --force >/dev/null 2>&1 && log "left the swarm"
            # leaving removes the ingress network; docker_gwbridge (a local bridge the swarm made) stays
            docker network rm docker_gwbridge >/dev/null 2>&1
            rm -f "$SWARM_MARK"
        fi
    fi
    if [ -n "$DOCKERD_PID" ]; then
        stop_dockerd
        local dir
        for dir in "$NETWORK_FILES"/lb_*; do
            [ -d "$dir" ] || continue
            grep -qxF "$(basename "$dir")" "$NETWORK_FILES_BEFORE" 2>/dev/null || rm -rf "$dir"
        done
    fi
    rm -f "$NETWORK_FILES_BEFORE"
    remove_wheels
    rm -rf "$WORK/keys" "$WORK/intruder"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

STARTED=$(date +%s)
[ -e "$NETWORK_FILES_BEFORE" ] || ls "$NETWORK_FILES" 2>/dev/null > "$NETWORK_FILES_BEFORE" || true
start_dockerd
build_base_image
build_images

if [ -e "$SWARM_MARK" ] && [ "$(docker info --format '{{.Swarm.LocalNodeState}}')" = active ]; then
    log "a killed run of this script left its swarm: removing what it left, then leaving it"
    SWARM_MADE=1
    remove_stack
    docker swarm leave --force > "$WORK/swarm.log" 2>&1 || fail "docker swarm leave" "$WORK/swarm.log"
    docker network rm docker_gwbridge >/dev/null 2>&1 || true
fi
rm -rf "$WORK/control" "$WORK/keys" "$WORK/intruder"
case "$(docker info --format '{{.Swarm.LocalNodeState}}')" in
    inactive)
        log "docker swarm init"
        touch "$SWARM_MARK"
        SWARM_MADE=1
        docker swarm init --advertise-addr 127.0.0.1 > "$WORK/swarm.log" 2>&1 \
            || cannot_run "docker swarm init failed: $(tail -1 "$WORK/swarm.log")" ;;
    active) [ "$(docker info --format '{{.Swarm.ControlAvailable}}')" = true ] \
        || cannot_run "this dockerd is a swarm worker, not a manager" ;;
    *) cannot_run "this dockerd's swarm state is $(docker info --format '{{.Swarm.LocalNodeState}}')" ;;
esac
docker stack ls --format '{{.Name}}' | grep -qxF "$STACK" \
    && fail "a stack $STACK exists already in this swarm: not this script's (docker stack rm $STACK)"
for name in "${SECRETS[@]}"; do
    docker secret inspect "$name" >/dev/null 2>&1 && fail "a secret $name exists already in this swarm: not this script's"
done
SECRETS_MADE=1

log "CURVE keys and secrets: deploy/swarm/secrets.sh"
FERRY_PRODUCER_IMAGE=$PRODUCER_IMAGE bash deploy/swarm/secrets.sh "$WORK/keys" > "$WORK/secrets.log" 2>&1 \
    || fail "deploy/swarm/secrets.sh" "$WORK/secrets.log"
cat "$WORK/secrets.log"
[ "$(stat -c %a "$WORK/keys")" = 700 ] || fail "the keys folder is not private: $(stat -c %a "$WORK/keys")"

# The stack as it is, with the trainer replaced by the checking one and the producers slowed down (15 ms a sample,
# one thread) so that scaling lands mid-epoch, and reserving little (4 producers and the trainer on 2 CPUs); tests/ is mounted into both (the images hold no source).
mkdir -p "$WORK/control"
cat > "$WORK/e2e.yaml" <<EOF
services:
  data:
    environment:
      FERRY_SAMPLES: "$SAMPLES"
      FERRY_SIZE: "16"
  trainer:
    entrypoint:
      - sh
      - -c
      - >-
        for i in \$\$(seq 300); do [ -f /data/demo/.ferry-demo-complete ] && exec python3 -m tests.engine_trainer "\$\$@";
        sleep 1; done; echo "no dataset" >&2; exit 1
      - trainer
    command: [/data/demo, --control, /control, --batch-size, "$BATCH", --producers, "2",
              --gate, "$GATE_UP", --gate, "$GATE_DOWN", --gate-timeout, "300"]
    environment:
      PYTHONDONTWRITEBYTECODE: "1"
    volumes:
      - data:/data
      - {type: bind, source: $REPO/tests, target: /work/tests, read_only: true}
      - {type: bind, source: $WORK/control, target: /control}
    deploy:
      restart_policy: {condition: none}
      resources: {reservations: {cpus: "0.1", memory: 64M}}
  producer:
    deploy:  # 4 producers and the trainer on this machine's 2 CPUs
      resources: {reservations: {cpus: "0.1", memory: 64M}}
    environment:
      FERRY_THREADS: "1"
      FERRY_TRANSFORM: tests.transforms:slow_identity
      PYTHONDONTWRITEBYTECODE: "1"
    volumes:
      - {type: bind, source: $REPO/tests, target: /work/tests, read_only: true}
EOF
export FERRY_TRAINER_IMAGE=$TRAINER_IMAGE FERRY_PRODUCER_IMAGE=$PRODUCER_IMAGE
docker stack config -c deploy/swarm/stack.yaml -c "$WORK/e2e.yaml" > "$WORK/stack.yaml" 2> "$WORK/config.log" \
    || fail "docker stack config" "$WORK/config.log"
log "docker stack deploy (2 producers)"
docker stack deploy --detach=true -c deploy/swarm/stack.yaml -c "$WORK/e2e.yaml" "$STACK" > "$WORK/deploy.log" 2>&1 \
    || fail "docker stack deploy" "$WORK/deploy.log"

service_logs() {
    local s; for s in data trainer producer; do docker service logs --raw "${STACK}_$s" > "$WORK/$s.log" 2>&1; done
    docker service logs --raw "$INTRUDER" > "$WORK/intruder.log" 2>&1
    docker service ps --no-trunc "${STACK}_trainer" "${STACK}_producer" "${STACK}_data" > "$WORK/tasks.log" 2>&1
}
# status KEY: the trainer's figure KEY from its control folder (empty before it wrote any)
status() {
    python3 -c 'import json, sys
try:
    print(json.load(open(sys.argv[1]))[sys.argv[2]])
except (FileNotFoundError, KeyError):
    pass' "$WORK/control/status.json" "$1"
}
# trainer_state: the state of the trainer's task (New ... Running, Complete, Failed, Rejected ...)
trainer_state() { docker service ps --format '{{.CurrentState}}' "${STACK}_trainer" 2>/dev/null | head -1 | cut -d' ' -f1; }
# expect SECONDS WHAT COMMAND...: wait (bounded) until COMMAND succeeds; fail with every log if the trainer ended or
# the time ran out
expect() {
    local seconds=$1 what=$2 deadline; shift 2
    deadline=$(($(date +%s) + seconds))
    until "$@"; do
        case "$(trainer_state)" in Failed|Rejected|Shutdown|Orphaned)
            service_logs; fail "the trainer's task ended ($(trainer_state)) while waiting for $what" \
                "$WORK/trainer.log" "$WORK/producer.log" "$WORK/tasks.log" ;;
        esac
        if [ "$(date +%s)" -ge "$deadline" ]; then
            service_logs; fail "no $what within $seconds s (trainer: $(cat "$WORK/control/status.json" 2>/dev/null))" \
                "$WORK/trainer.log" "$WORK/producer.log" "$WORK/data.log" "$WORK/tasks.log"
        fi
        sleep 0.5
    done
}
paused_at() { [ "$(status phase)" = paused ] && [ "$(status batches)" = "$1" ]; }
producers_are() { [ "$(status producers)" = "$1" ]; }
# never_admitted N: the trainer admitted at most N producers so far (the intruder would be one more)
never_admitted() {
    local seen; seen=$(status producers_seen)
    [ -z "$seen" ] || [ "$seen" -le "$1" ] || { service_logs; fail "a producer without an authorized key was admitted: $(cat "$WORK/control/status.json")" "$WORK/trainer.log"; }
}
logged() { docker service logs --raw "$1" 2>&1 | grep -qF "$2"; }
# exited_producers: the exit codes of the producer containers that have stopped, one a line
exited_producers() {
    docker ps -a --filter "label=com.docker.swarm.service.name=${STACK}_producer" --filter status=exited -q \
        | xargs -r docker inspect -f '{{.State.ExitCode}}'
}

expect 300 "pause at batch $GATE_UP with 2 producers" paused_at "$GATE_UP"
producers_are 2 || fail "the trainer has $(status producers) producers at batch $GATE_UP, not 2"
log "the trainer holds the epoch at batch $GATE_UP of $BATCHES with 2 producers: scaling up to 4, starting the intruder"
docker service scale --detach "${STACK}_producer=4" > "$WORK/scale-up.log" 2>&1 || fail "docker service scale up" "$WORK/scale-up.log"

# The intruder: a key pair of its own, never authorized, and a copy of the dataset with the same names and sizes
# (so the same fingerprint) and other values, so that one batch from it would fail the comparison.
docker run --rm --user "$(id -u):$(id -g)" -v "$WORK:/out" --entrypoint python3 "$PRODUCER_IMAGE" \
    -m ferry keys /out/intruder --producer intruder > "$WORK/intruder-keys.log" 2>&1 || fail "ferry keys for the intruder" "$WORK/intruder-keys.log"
docker secret create ferry-swarm-e2e-intruder.key_secret "$WORK/intruder/intruder.key_secret" >/dev/null
docker run --rm -v "${STACK}_data:/data" --entrypoint python3 "$PRODUCER_IMAGE" -c '
import os, shutil, numpy as np
from ferry.common.datasets import NpyFolderDataset
shutil.copytree("/data/demo", "/data/poison")
for folder, _, files in os.walk("/data/poison"):
    for name in files:
        if name.endswith(".npy"):
            path = os.path.join(folder, name)
            array = np.load(path)
            np.save(path, (array + 1).astype(array.dtype))
assert NpyFolderDataset("/data/poison").fingerprint == NpyFolderDataset("/data/demo").fingerprint
' > "$WORK/poison.log" 2>&1 || fail "the intruder's copy of the dataset" "$WORK/poison.log"
docker service create --detach --name "$INTRUDER" --hostname intruder --network "${STACK}_default" \
    --restart-condition none --mount "type=volume,source=${STACK}_data,target=/data,readonly" \
    --secret source=ferry-swarm-e2e-intruder.key_secret,target=producers.key_secret,mode=0400 \
    --secret source=ferry-server.key,target=server.key \
    -e FERRY_CONNECT=tcp://trainer:5555 -e FERRY_DATASET=npy-folder -e 'FERRY_DATASET_ARGS={"root": "/data/poison"}' \
    -e FERRY_CURVE_KEY=/run/secrets/producers.key_secret -e FERRY_CURVE_SERVER_KEY=/run/secrets/server.key \
    "$PRODUCER_IMAGE" > "$WORK/intruder-create.log" 2>&1 || fail "docker service create (the intruder)" "$WORK/intruder-create.log"

expect 180 "4 producers at the trainer" eval 'never_admitted 4; producers_are 4'
expect 60 "the trainer denying the intruder's key" eval 'never_admitted 4; logged "${STACK}_trainer" "CURVE handshake DENIED"'
expect 60 "the intruder logging that its key was denied" logged "$INTRUDER" "denied this producer's CURVE key"
log "4 producers serve; the intruder was denied. Go on to batch $GATE_DOWN"
touch "$WORK/control/go-$GATE_UP"

expect 120 "pause at batch $GATE_DOWN" eval 'never_admitted 4; paused_at "$GATE_DOWN"'
DELIVERED=$(status delivered)
python3 -c 'import ast, sys
delivered = ast.literal_eval(sys.argv[1])
assert len(delivered) == 4 and all(n > 0 for n in delivered.values()), f"not each of 4 producers delivered: {delivered}"
' "$DELIVERED" || fail "the scaled-up producers did not all deliver by batch $GATE_DOWN"
log "each of the 4 producers delivered ($DELIVERED); scaling down to 1"
docker service scale --detach "${STACK}_producer=1" > "$WORK/scale-down.log" 2>&1 || fail "docker service scale down" "$WORK/scale-down.log"
expect 60 "1 producer at the trainer" producers_are 1
three_exited() { [ "$(exited_producers | wc -l)" -ge 3 ]; }
expect 60 "the 3 producers scaled away to exit" three_exited
[ "$(exited_producers | sort -u)" = 0 ] || fail "producers scaled away exited $(exited_producers | tr '\n' ' '), not 0"
touch "$WORK/control/go-$GATE_DOWN"

result_written() { [ -s "$WORK/control/result.json" ]; }
expect 180 "the end of the epoch" result_written
trainer_done() { [ "$(trainer_state)" = Complete ]; }
expect 60 "the trainer's task to complete" trainer_done
service_logs
grep -q "checked $BATCHES batches from 4 producers" "$WORK/trainer.log" || fail "the trainer's result" "$WORK/trainer.log"
python3 -c 'import json, sys
result = json.load(open(sys.argv[1]))
assert result["batches"] == int(sys.argv[2]) and result["producers_seen"] == 4, result
intruder = [name for name in result["delivered"] if name.startswith("intruder")]
assert not intruder, f"the intruder delivered: {result}"
' "$WORK/control/result.json" "$BATCHES" || fail "the result" "$WORK/control/result.json"
log "every batch ($BATCHES of $BATCHES) equal to DataLoader's, from 4 producers; the intruder delivered none"

LAST=$(docker ps -q --filter "label=com.docker.swarm.service.name=${STACK}_producer")
[ "$(echo "$LAST" | wc -w)" = 1 ] || fail "not one producer container left: $LAST"
healthy() { [ "$(docker inspect -f '{{.State.Health.Status}}' "$LAST")" = healthy ]; }
expect 60 "the last producer's healthcheck (--probe ready) to say healthy" healthy
log "scaling to 0: the last producer gets SIGTERM"
docker service scale --detach "${STACK}_producer=0" > "$WORK/scale-zero.log" 2>&1 || fail "docker service scale to 0" "$WORK/scale-zero.log"
stopped() { [ "$(docker inspect -f '{{.State.Status}}' "$LAST")" = exited ]; }
expect 30 "the last producer to stop" stopped
CODE=$(docker inspect -f '{{.State.ExitCode}}' "$LAST")
[ "$CODE" = 0 ] || fail "the last producer exited $CODE on SIGTERM"
docker service rm "$INTRUDER" >/dev/null
docker stack rm "$STACK" > "$WORK/rm.log" 2>&1 || fail "docker stack rm" "$WORK/rm.log"
log "PASS: every batch checked through scaling 2 -> 4 -> 1 mid-epoch, the intruder denied, clean stops" \
    "($(($(date +%s) - STARTED)) s)"
