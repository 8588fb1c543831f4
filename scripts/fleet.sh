#!/usr/bin/env bash
# make fleet: a fleet of three kvthrottle instances on one machine, all in
# the foreground: redis-server on 127.0.0.1:6390 (the fleet's store, no
# persistence), memcached on 127.0.0.1:11290, and the instances of
# deploy/fleet/fleet-{1,2,3}.toml on 127.0.0.1:11391..11393 (metrics on
# 127.0.0.1:9391..9393).
#
# The instances run from copies of their configurations in a temporary
# directory, which holds their state files and is removed at the end.
# Ctrl-C (or SIGTERM to this script), or any instance exiting, stops
# everything this script started: the instances first (they drain), then
# memcached and Redis. A memcached or Redis that already listens on its
# port is used and left running.
set -euo pipefail
bin=${1:?usage: fleet.sh KVTHROTTLE_BINARY}
here=$(cd "$(dirname "$0")/.." && pwd)

command -v redis-server >/dev/null 2>&1 || {
  echo "redis-server not found: run \`make deps\` (as root) or: sudo apt-get install -y redis-server" >&2
  exit 1
}

listening() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvthrottle-fleet.XXXXXX")
redis=""
mc=""
instances=()

# stop PID NAME: SIGTERM, then wait for it.
stop() {
  kill -TERM "$1" 2>/dev/null || true
  wait "$1" 2>/dev/null || true
  echo "$2: stopped (pid $1)"
}

cleanup() {
  # A second signal (make forwards one, Ctrl-C twice) must not cut the
  # cleanup short and leave Redis or memcached running.
  trap "" INT TERM
  trap - EXIT
  local pid
  for pid in "${instances[@]}"; do stop "$pid" "kvthrottle"; done
  [ -z "$mc" ] || stop "$mc" memcached
  [ -z "$redis" ] || stop "$redis" redis-server
  rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# wait_port PORT PID NAME: wait up to 5 s for PORT to accept connections
# while PID lives.
wait_port() {
  for _ in $(seq 50); do
    listening "$1" && return 0
    kill -0 "$2" 2>/dev/null || { echo "$3 exited at start" >&2; return 1; }
    sleep 0.1
  done
  listening "$1" || { echo "$3 did not start on 127.0.0.1:$1" >&2; return 1; }
}

if listening 6390; then
  echo "redis: something already listens on 127.0.0.1:6390; using it (it keeps running after the fleet stops)"
else
  # In a session of its own, so that Ctrl-C does not reach it: it stops
  # after the instances, which report to it while they drain.
  setsid redis-server --bind 127.0.0.1 --port 6390 --save "" --appendonly no \
    --protected-mode no --daemonize no --dir "$tmp" --loglevel warning &
  redis=$!
  wait_port 6390 "$redis" redis-server || { redis=""; exit 1; }
  echo "redis: started on 127.0.0.1:6390 (pid $redis, no persistence); it stops with the fleet"
fi

if listening 11290; then
  echo "memcached: something already listens on 127.0.0.1:11290; using it (it keeps running after the fleet stops)"
else
  user=()
  [ "$(id -u)" -eq 0 ] && user=(-u nobody)
  memcached -l 127.0.0.1 -p 11290 -U 0 -m 256 "${user[@]}" &
  mc=$!
  wait_port 11290 "$mc" memcached || { mc=""; exit 1; }
  echo "memcached: started on 127.0.0.1:11290 (pid $mc); it stops with the fleet"
fi

for i in 1 2 3; do
  cp "$here/deploy/fleet/fleet-$i.toml" "$tmp/"
  "$bin" serve --config "$tmp/fleet-$i.toml" &
  instances+=($!)
done
echo "fleet \"demo\": instances on 127.0.0.1:11391, :11392, :11393 (metrics :9391..:9393); Ctrl-C stops everything"

# Until Ctrl-C or the first instance to exit.
set +e
wait -n "${instances[@]}"
rc=$?
set -e
echo "an instance exited (status $rc): stopping the fleet" >&2
exit "$rc"
