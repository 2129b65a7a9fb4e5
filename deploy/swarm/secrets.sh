#!/usr/bin/env bash
# CURVE keys for deploy/swarm/stack.yaml, made once by `ferry keys` and handed over as Docker secrets.
#
#   bash deploy/swarm/secrets.sh [KEYS_DIR]     # on a swarm manager, after the images are built
#
# KEYS_DIR (default FERRY_KEYS_DIR, else ./ferry-swarm-keys) is made private (0700; secret keys 0600) and filled by
# `ferry keys KEYS_DIR --producer producers`, run in the producer image (FERRY_PRODUCER_IMAGE, default
# ferry-producer) as the calling user, unless it holds keys already. Then each of the four files becomes the
# secret the stack names, unless that secret exists: ferry-server.key_secret and ferry-producers.key (the trainer's
# key pair, and the producers' public key it authorizes), ferry-producers.key_secret and ferry-server.key (the
# producers' shared key pair, and the trainer's public key). Secrets cannot change: to replace the keys, remove the
# stack, `docker secret rm` the four, and run this again with a new KEYS_DIR. Keep KEYS_DIR to start producers
# outside the swarm (--curve-key producers.key_secret --curve-server-key server.key), or delete it.
set -euo pipefail

DIR=${1:-${FERRY_KEYS_DIR:-ferry-swarm-keys}}
IMAGE=${FERRY_PRODUCER_IMAGE:-ferry-producer}
FILES=(server.key_secret server.key producers.key_secret producers.key)
die() { echo "secrets.sh: $*" >&2; exit 1; }

[ "$(docker info --format '{{.Swarm.ControlAvailable}}' 2>/dev/null)" = true ] \
    || die "this docker is not a swarm manager (docker swarm init, or run this on a manager)"
if [ ! -f "$DIR/server.key_secret" ]; then
    if [ -e "$DIR" ] && [ -n "$(ls -A "$DIR")" ]; then
        die "$DIR holds files but no server.key_secret: give an empty or new folder"
    fi
    docker image inspect "$IMAGE" >/dev/null 2>&1 || docker pull -q "$IMAGE" >/dev/null \
        || die "no image $IMAGE to run ferry keys in (build it first, or set FERRY_PRODUCER_IMAGE)"
    (umask 077 && mkdir -p "$DIR")
    chmod 700 "$DIR"
    docker run --rm --user "$(id -u):$(id -g)" -e HOME=/tmp -v "$(cd "$DIR" && pwd):/keys" --entrypoint python3 \
        "$IMAGE" -m ferry keys /keys --producer producers >/dev/null || die "ferry keys failed in $IMAGE"
    echo "secrets.sh: made the keys in $DIR"
fi
for file in "${FILES[@]}"; do
    [ -f "$DIR/$file" ] || die "$DIR/$file is missing"
done
for file in "${FILES[@]}"; do
    name=ferry-$file
    if docker secret inspect "$name" >/dev/null 2>&1; then
        echo "secrets.sh: secret $name exists (kept)"
    else
        docker secret create "$name" "$DIR/$file" >/dev/null || die "docker secret create $name failed"
        echo "secrets.sh: secret $name made from $DIR/$file"
    fi
done
