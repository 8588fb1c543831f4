#!/usr/bin/env bash
# Starts memcached on 127.0.0.1:11211 unless something already listens there.
set -euo pipefail
if (exec 3<>/dev/tcp/127.0.0.1/11211) 2>/dev/null; then
  echo "memcached: something already listens on 127.0.0.1:11211; using it"
  exit 0
fi
user=()
[ "$(id -u)" -eq 0 ] && user=(-u root)
memcached -d -l 127.0.0.1 -p 11211 -U 0 -m 256 "${user[@]}"
for _ in $(seq 50); do
  (exec 3<>/dev/tcp/127.0.0.1/11211) 2>/dev/null && { echo "memcached: started on 127.0.0.1:11211"; exit 0; }
  sleep 0.1
done
echo "memcached did not start on 127.0.0.1:11211" >&2
exit 1
