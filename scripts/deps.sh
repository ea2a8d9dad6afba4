#!/bin/sh
# Installs the Debian packages rl builds and tests with, only those missing.
# Called by `make deps` (and so by `make` and `make test`): on a fresh Debian
# machine, as root, `make test` alone sets everything up. With arguments, it
# installs those packages instead (`make fuzz` asks for clang this way).
# nginx-dev brings the sources and configure flags of Debian's nginx, which
# the module (nginx/) is built against so that it loads into
# /usr/sbin/nginx; the tests start that nginx, and wrk benchmarks it.
# prometheus brings promtool, which the metrics tests run on every metrics
# page (`promtool check metrics`); the Prometheus server is not used.
# gdb prints the stacks of a daemon that a test could not stop.
# rl-rls (rls/) speaks gRPC over HTTP/2 with nghttp2 and protobuf-c; its
# tests call it with a real gRPC client (grpcio, in the system Python) and
# its benchmark drives it with h2load (nghttp2-client). Its /json endpoint
# reads and writes JSON with jansson.
set -eu

packages="build-essential pkg-config libuv1-dev libnng-dev libhiredis-dev libssl-dev \
libmsgpack-dev libcyaml-dev libyaml-dev libcriterion-dev libhttp-parser-dev libsystemd-dev \
redis-server redis-tools openssl systemd faketime \
nginx nginx-dev wrk prometheus gdb \
libprotobuf-c-dev protobuf-c-compiler libnghttp2-dev libjansson-dev \
nghttp2-client python3-grpcio python3-protobuf protobuf-compiler"
[ $# -gt 0 ] && packages="$*"

# One dpkg-query for all: every make runs this (make mutants, twice a
# mutant), and one query a package took half a second.
# shellcheck disable=SC2086  # word splitting of the package list is wanted
installed=" $(dpkg-query -W -f='${Package} ${db:Status-Status}\n' $packages \
    2>/dev/null | awk '$2 == "installed" { printf "%s ", $1 }')"
missing=""
for p in $packages; do
    case $installed in
    *" $p "*) ;;
    *) missing="$missing $p" ;;
    esac
done
[ -z "$missing" ] && exit 0

if [ "$(id -u)" != 0 ]; then
    echo "rl: missing Debian packages:$missing" >&2
    echo "rl: install them as root, then run make again:" >&2
    echo "    apt-get update && apt-get install -y$missing" >&2
    exit 1
fi

echo "rl: installing missing Debian packages:$missing"
export DEBIAN_FRONTEND=noninteractive
apt-get update
# shellcheck disable=SC2086  # word splitting of the package list is wanted
apt-get install -y --no-install-recommends $missing
