#!/usr/bin/env bash
# Makes sure the tools kvthrottle's tests and `make run` need are present:
# memcached (the server), libmemcached-tools (memccapable, memccp, memccat,
# memcstat, memcaslap), redis-server (the fleet's store, for the fleet tests
# and `make fleet`), nutcracker (twemproxy, the text-protocol proxy `make
# bench` compares kvthrottle with), and the independent clients the tests
# drive: memjs (Node.js), dalli (Ruby), pymemcache, python-memcached and
# pylibmc, bmemcached (Python), php-memcache and php-memcached (PHP),
# openssl's s_client; nc and curl for the README's tour; GNU time for
# make test's pass timings. Installs Debian's
# packages when missing and running as root; otherwise says exactly what
# to install and fails.
set -euo pipefail

missing=()
command -v memcached >/dev/null 2>&1 || missing+=(memcached)
if [ "${1:-}" != "--server-only" ]; then
  { command -v memccapable >/dev/null 2>&1 && command -v memcaslap >/dev/null 2>&1; } || missing+=(libmemcached-tools)
  command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
  # Debian installs it in /usr/sbin, not on every user's PATH.
  { command -v nutcracker >/dev/null 2>&1 || [ -x /usr/sbin/nutcracker ]; } || missing+=(nutcracker)
  { command -v node >/dev/null 2>&1 && command -v npm >/dev/null 2>&1; } || missing+=(nodejs npm)
  # Debian's ruby-dalli does not pull in ruby itself.
  ruby -e 'require "dalli"' >/dev/null 2>&1 || missing+=(ruby ruby-dalli)
  /usr/bin/python3 -c 'import pymemcache' >/dev/null 2>&1 || missing+=(python3-pymemcache)
  # python-memcached and pylibmc: the first-contact tests' text and SASL clients.
  /usr/bin/python3 -c 'import memcache' >/dev/null 2>&1 || missing+=(python3-memcache)
  /usr/bin/python3 -c 'import pylibmc' >/dev/null 2>&1 || missing+=(python3-pylibmc)
  # python-binary-memcached (bmemcached): a pure-Python binary SASL client.
  /usr/bin/python3 -c 'import bmemcached' >/dev/null 2>&1 || missing+=(python3-binary-memcached)
  # nc and curl: the README's tour, which internal/docscheck runs.
  command -v nc >/dev/null 2>&1 || missing+=(netcat-openbsd)
  command -v curl >/dev/null 2>&1 || missing+=(curl)
  # GNU time: make test TESTJSON=DIR records each pass's CPU seconds with it.
  [ -x /usr/bin/time ] || missing+=(time)
  # openssl: TestTLSOpenSSL's independent TLS client (it fails without it).
  command -v openssl >/dev/null 2>&1 || missing+=(openssl)
  # php-memcache (pecl memcache, text) and php-memcached (libmemcached, SASL).
  { command -v php >/dev/null 2>&1 && php -r 'exit(class_exists("Memcache") && class_exists("Memcached") ? 0 : 1);' >/dev/null 2>&1; } || missing+=(php-cli php-memcache php-memcached)
fi

# memjs (an independent Node.js client) for the integration tests.
install_memjs() {
  [ "${1:-}" = "--server-only" ] && return 0
  local dir; dir="$(dirname "$0")/../testdata/memjs"
  [ -d "$dir/node_modules/memjs" ] && return 0
  echo "installing memjs (npm) into testdata/memjs ..."
  (cd "$dir" && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
}

if [ ${#missing[@]} -eq 0 ]; then
  install_memjs "${1:-}"
  exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
  echo "kvthrottle needs these Debian packages: ${missing[*]}" >&2
  echo "install them with: sudo apt-get update && sudo apt-get install -y ${missing[*]}" >&2
  exit 1
fi
if ! command -v apt-get >/dev/null 2>&1; then
  echo "no apt-get here: install ${missing[*]} with your package manager" >&2
  exit 1
fi
echo "installing ${missing[*]} ..."
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq "${missing[@]}" >/dev/null
echo "installed ${missing[*]}"
install_memjs "${1:-}"
