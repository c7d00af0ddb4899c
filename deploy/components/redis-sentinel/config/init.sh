#!/bin/sh
# Runs before Redis and Sentinel start in pod $POD_NAME of the StatefulSet: decides who the
# primary is and writes $DATA_DIR/redis.conf and $DATA_DIR/sentinel.conf.
#
# Who is primary: what the peers' sentinels say (majority of those that answer); else what this
# pod's own sentinel knew when it stopped (its sentinel.conf on the volume, rewritten by Sentinel
# at every failover); else, on a first boot, pod 0. A pod with nothing on its volume asks the
# peers for a while before it settles on pod 0: when every pod restarts at once, the peers'
# sentinels (which do know) come up within seconds. Not covered: pod 0's volume lost while every
# pod restarts at once and the peers' sentinels do not come back within that wait.
#
# Everyone is named by its stable DNS name (<pod>.<service>.<namespace>.svc, resolvable
# before the pod is Ready: the Service publishes not-ready addresses), never by its IP, which
# changes when a pod is recreated: replicas announce it (replica-announce-ip), sentinels
# announce it and keep hostnames (announce-hostnames, resolve-hostnames).
set -eu
: "${POD_NAME:?}" "${POD_NAMESPACE:?}" "${REDIS_PASSWORD:?}"
SERVICE=${SERVICE:-slotsched-redis}       # the headless Service (StatefulSet serviceName)
MASTER=${MASTER_NAME:-slotsched}          # the name the sentinels monitor (the --state URL's)
PODS=${REDIS_PODS:-3}                     # the StatefulSet's replicas
QUORUM=${SENTINEL_QUORUM:-2}
DATA=${DATA_DIR:-/data}
BASE=${BASE_CONF:-/etc/redis/redis.conf}
ASK_TIMEOUT=${ASK_TIMEOUT:-2}             # seconds per sentinel asked
ASK_ROUNDS=${ASK_ROUNDS:-6}               # rounds when this pod knows nothing yet
ASK_INTERVAL=${ASK_INTERVAL:-2}

# The password goes into both config files (quoted) and the --state URL: URL-safe characters
# only, as `openssl rand -hex 32` makes.
case $REDIS_PASSWORD in
  *[!A-Za-z0-9._~-]*)
    echo "init.sh: the Redis password must be URL-safe ([A-Za-z0-9._~-], e.g. openssl rand -hex 32)" >&2
    exit 1 ;;
esac
export REDISCLI_AUTH="$REDIS_PASSWORD"   # redis-cli's password, off its command line

fqdn() { echo "$1.$SERVICE.$POD_NAMESPACE.svc"; }
SET=${POD_NAME%-*}
ME=$(fqdn "$POD_NAME")

# The primary one peer's sentinel names (host only; every node listens on 6379), or nothing.
ask() {
  out=$(timeout "$ASK_TIMEOUT" redis-cli -h "$1" -p 26379 SENTINEL get-master-addr-by-name "$MASTER" 2>/dev/null) || return 0
  # shellcheck disable=SC2086  # split "host\nport"
  set -- $out
  [ $# -eq 2 ] || return 0
  case $2 in '' | *[!0-9]*) return 0 ;; esac
  echo "$1"
}

# The primary most of the answering peers' sentinels name, or nothing.
ask_peers() {
  i=0
  answers=""
  while [ "$i" -lt "$PODS" ]; do
    peer=$(fqdn "$SET-$i")
    if [ "$peer" != "$ME" ]; then
      answers="$answers$(ask "$peer")
"
    fi
    i=$((i + 1))
  done
  printf '%s' "$answers" | sed '/^$/d' | sort | uniq -c | sort -k1,1nr -k2 | awk 'NR == 1 { print $2 }'
}

# What this pod's sentinel last knew (its rewritten sentinel.conf), or nothing.
remembered() {
  [ -f "$DATA/sentinel.conf" ] || return 0
  awk -v m="$MASTER" '$1 == "sentinel" && $2 == "monitor" && $3 == m { print $4; exit }' "$DATA/sentinel.conf"
}

primary=$(ask_peers)
source="the peers' sentinels"
if [ -z "$primary" ]; then
  primary=$(remembered)
  source="this pod's sentinel.conf"
fi
if [ -z "$primary" ]; then
  round=1
  while [ -z "$primary" ] && [ "$round" -lt "$ASK_ROUNDS" ]; do
    sleep "$ASK_INTERVAL"
    primary=$(ask_peers)
    round=$((round + 1))
  done
  source="the peers' sentinels"
fi
if [ -z "$primary" ]; then
  primary=$(fqdn "$SET-0")
  source="first boot: pod 0"
fi
echo "init.sh: $ME: primary $primary ($source)"

umask 077   # both files hold the password
{
  cat "$BASE"
  echo ""
  echo "# init.sh, at pod start"
  echo "requirepass \"$REDIS_PASSWORD\""
  echo "masterauth \"$REDIS_PASSWORD\""
  echo "replica-announce-ip $ME"
  if [ "$primary" != "$ME" ]; then
    echo "replicaof $primary 6379"
  fi
} > "$DATA/redis.conf.new"
mv "$DATA/redis.conf.new" "$DATA/redis.conf"

# Sentinel rewrites its file at runtime (failovers, the peers it finds): rewritten here at every
# pod start from the decision above, keeping its identity and what it learnt (epochs, peers), so
# a changed password or setting takes effect.
kept=""
if [ -f "$DATA/sentinel.conf" ]; then
  kept=$(grep -E '^sentinel (myid|current-epoch|config-epoch|leader-epoch|known-replica|known-sentinel) ' "$DATA/sentinel.conf" || true)
fi
{
  echo "port 26379"
  echo "sentinel resolve-hostnames yes"
  echo "sentinel announce-hostnames yes"
  echo "sentinel announce-ip $ME"
  # Clients (the scheduler: ?sentinel_auth=1) and the other sentinels authenticate with it.
  echo "requirepass \"$REDIS_PASSWORD\""
  echo "sentinel monitor $MASTER $primary 6379 $QUORUM"
  echo "sentinel auth-pass $MASTER \"$REDIS_PASSWORD\""
  # 5 s: long enough that a GC pause, a slow fsync (appendfsync always) or a node's brief network
  # hiccup is not a failover (each one costs the scheduler a leader change and its clients a
  # retry), short enough that a dead primary is replaced well within the SDK's 5 s failover
  # budget plus its retries. Shorter values fail over on noise; the tests use 500 ms on loopback.
  echo "sentinel down-after-milliseconds $MASTER 5000"
  echo "sentinel failover-timeout $MASTER 60000"
  echo "sentinel parallel-syncs $MASTER 1"
  if [ -n "$kept" ]; then
    printf '%s\n' "$kept"
  fi
} > "$DATA/sentinel.conf.new"
mv "$DATA/sentinel.conf.new" "$DATA/sentinel.conf"
