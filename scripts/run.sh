#!/usr/bin/env bash
# make run: memcached on 127.0.0.1:11211, then the proxy in the foreground.
#
# A memcached started here is this script's child: unprivileged (as
# "nobody" when the script runs as root; memcached refuses to run as root
# otherwise), not daemonized, and stopped when the proxy exits (Ctrl-C or
# SIGTERM to the proxy). A server that already listens on 127.0.0.1:11211
# is used and left running.
set -euo pipefail
bin=${1:?usage: run.sh KVTHROTTLE_BINARY CONFIG}
config=${2:?usage: run.sh KVTHROTTLE_BINARY CONFIG}

listening() { (exec 3<>/dev/tcp/127.0.0.1/11211) 2>/dev/null; }

mc=""
stop_memcached() {
  [ -n "$mc" ] || return 0
  kill "$mc" 2>/dev/null || true
  wait "$mc" 2>/dev/null || true
  echo "memcached: stopped (pid $mc)"
}
trap stop_memcached EXIT

if listening; then
  echo "memcached: something already listens on 127.0.0.1:11211; using it (it keeps running after the proxy stops)"
else
  user=()
  [ "$(id -u)" -eq 0 ] && user=(-u nobody)
  # Started in the background of a non-interactive shell, memcached ignores
  # the terminal's Ctrl-C; the EXIT trap stops it after the proxy.
  memcached -l 127.0.0.1 -p 11211 -U 0 -m 256 "${user[@]}" &
  mc=$!
  for _ in $(seq 50); do
    listening && break
    kill -0 "$mc" 2>/dev/null || { mc=""; echo "memcached exited at start" >&2; exit 1; }
    sleep 0.1
  done
  listening || { echo "memcached did not start on 127.0.0.1:11211" >&2; exit 1; }
  echo "memcached: started on 127.0.0.1:11211 (pid $mc, user ${user[1]:-$(id -un)}); it stops when the proxy does"
fi

"$bin" serve --config "$config"
