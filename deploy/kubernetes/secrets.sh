#!/usr/bin/env bash
# CURVE keys for deploy/kubernetes/, made once by `ferry keys` and handed over as three Kubernetes Secrets, so that no
# producer pod ever holds the trainer's secret key:
#   ferry-trainer-curve:   server.key_secret (the trainer's key pair)
#   ferry-authorized-keys: producers.key (the producers' public key); every *.key in it is let in by the trainer
#   ferry-producer-curve:  producers.key_secret (the producers' shared key pair), server.key (the trainer's public key)
#
#   bash deploy/kubernetes/secrets.sh [KEYS_DIR]           # kubectl apply of the three, in kubectl's current namespace
#   bash deploy/kubernetes/secrets.sh --print [KEYS_DIR]   # print the Secret manifests instead (no cluster needed)
#
# KEYS_DIR (default FERRY_KEYS_DIR, else ./ferry-k8s-keys) is made private (0700; secret keys 0600) and filled by
# `ferry keys KEYS_DIR --producer producers` (FERRY_KEYS_COMMAND, default `python3 -m ferry keys`: Ferry installed
# here), unless it holds keys already. Applying again replaces the Secrets with what KEYS_DIR holds. Pods see a
# changed Secret within a minute or so: the trainer re-reads its authorized keys (to let in another key pair, add its
# .key to ferry-authorized-keys), but pods load their own key pair at start: restart the Job and the Deployment after
# new keys. Keep KEYS_DIR to start producers outside the cluster
# (--curve-key producers.key_secret --curve-server-key server.key), or delete it. Needs kubectl.
set -euo pipefail

PRINT=""
[ "${1:-}" = "--print" ] && { PRINT=1; shift; }
DIR=${1:-${FERRY_KEYS_DIR:-ferry-k8s-keys}}
read -r -a KEYS_COMMAND <<< "${FERRY_KEYS_COMMAND:-python3 -m ferry keys}"
KUBECTL=${KUBECTL:-kubectl}
die() { echo "secrets.sh: $*" >&2; exit 1; }

command -v "$KUBECTL" >/dev/null || die "no $KUBECTL (install kubectl, or set KUBECTL)"
if [ ! -f "$DIR/server.key_secret" ]; then
    if [ -e "$DIR" ] && [ -n "$(ls -A "$DIR")" ]; then
        die "$DIR holds files but no server.key_secret: give an empty or new folder"
    fi
    (umask 077 && mkdir -p "$DIR")
    chmod 700 "$DIR"
    "${KEYS_COMMAND[@]}" "$DIR" --producer producers >/dev/null || die "${KEYS_COMMAND[*]} $DIR failed"
    echo "secrets.sh: made the keys in $DIR" >&2
fi
for file in server.key_secret server.key producers.key_secret producers.key; do
    [ -f "$DIR/$file" ] || die "$DIR/$file is missing"
done

# secret NAME FILE...: the Secret's manifest, each FILE a key of it named after the file
secret() {
    local name=$1 file args=(); shift
    for file in "$@"; do args+=("--from-file=$file=$DIR/$file"); done
    "$KUBECTL" create secret generic "$name" "${args[@]}" --dry-run=client -o yaml \
        | grep -v '^  creationTimestamp: null$'
}
manifests() {
    secret ferry-trainer-curve server.key_secret
    echo "---"
    secret ferry-authorized-keys producers.key
    echo "---"
    secret ferry-producer-curve producers.key_secret server.key
}
if [ -n "$PRINT" ]; then
    manifests
else
    manifests | "$KUBECTL" apply -f - || die "kubectl apply of the Secrets failed"
fi
