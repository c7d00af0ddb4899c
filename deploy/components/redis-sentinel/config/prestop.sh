#!/bin/sh
# preStop of both containers (`prestop.sh redis` / `prestop.sh sentinel`). Before Kubernetes stops
# the primary's pod (rolling update, drain), hand over: the redis container asks this pod's
# sentinel for a failover, and both wait until the sentinel names another primary, so the
# scheduler sees a planned switch (about a second) rather than down-after (5 s) plus an election.
# The sentinel container waits too: Kubernetes stops a container once its own preStop returns,
# and the failover runs in this pod's sentinel. A replica's pod stops at once.
set -u
MASTER=${MASTER_NAME:-slotsched}
WAIT_S=${HANDOVER_WAIT_S:-20}
ME="$POD_NAME.${SERVICE:-slotsched-redis}.$POD_NAMESPACE.svc"
export REDISCLI_AUTH="$REDIS_PASSWORD"
primary() { redis-cli -p 26379 SENTINEL get-master-addr-by-name "$MASTER" 2> /dev/null | head -n 1; }
[ "$(primary)" = "$ME" ] || exit 0
if [ "${1:-}" = "redis" ]; then
  redis-cli -p 26379 SENTINEL FAILOVER "$MASTER" || exit 0
fi
waited=0
while [ "$(primary)" = "$ME" ] && [ "$waited" -lt "$WAIT_S" ]; do
  sleep 1
  waited=$((waited + 1))
done
if [ "${1:-}" = "sentinel" ]; then
  sleep 2   # one hello period: the other sentinels learn the new configuration from this one
fi
exit 0
