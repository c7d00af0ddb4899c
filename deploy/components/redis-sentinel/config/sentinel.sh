#!/bin/sh
# Starts Sentinel on the config init.sh wrote (and Sentinel keeps rewriting). Sentinel exits at
# start-up when the primary it monitors has no DNS name yet (a pod being recreated): wait for the
# name here rather than crash-loop into the kubelet's back-off.
set -eu
CONF=${DATA_DIR:-/data}/sentinel.conf
WAIT_S=${RESOLVE_WAIT_S:-120}
primary=$(awk '$1 == "sentinel" && $2 == "monitor" { print $4; exit }' "$CONF")
waited=0
until getent hosts "$primary" > /dev/null; do
  if [ "$waited" -ge "$WAIT_S" ]; then
    echo "sentinel.sh: $primary does not resolve after ${WAIT_S}s" >&2
    exit 1
  fi
  sleep 1
  waited=$((waited + 1))
done
exec redis-server "$CONF" --sentinel
