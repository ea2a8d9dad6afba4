#!/bin/sh
# `make bench`: every benchmark in one run, one report. Usage (from make):
#   scripts/bench.sh BUILD_DIR [VAR=value...]   (the test environment)
# Writes BUILD_DIR/bench/report.md and BUILD_DIR/bench/bench.png. Each
# program starts its own redis-server (or cluster) through with-redis.
set -eu

build=$1
shift
out=$build/bench
mkdir -p "$out"
runner=$build/tests/with-redis
report=$out/report.md

# The peer: rate-limiter-flexible on ioredis, from the npm registry, into a
# folder of the build. Pinned, so that runs compare.
sh scripts/deps.sh gnuplot-nox
command -v npm >/dev/null 2>&1 || sh scripts/deps.sh nodejs npm
peer_dir=$out/node
if [ ! -d "$peer_dir/node_modules/rate-limiter-flexible" ]; then
    echo "bench: installing rate-limiter-flexible and ioredis into $peer_dir"
    mkdir -p "$peer_dir"
    npm install --prefix "$peer_dir" --no-audit --no-fund --silent \
        rate-limiter-flexible@11.4.0 ioredis@6.0.0
fi
export NODE_PATH="$peer_dir/node_modules"
export RL_BENCH_PEER="$PWD/tests/bench/rlf_peer.js"
export RL_BENCH_OUT="$out"

version() { dpkg-query -W -f='${Version}' "$1" 2>/dev/null || echo unknown; }

{
    echo "# rl benchmark report"
    echo
    echo "Made by \`make bench\` on $(date -u '+%Y-%m-%d %H:%M UTC'). Speed"
    echo "figures are min / median / max over runs; compare the ratios"
    echo "within a run: the machines are shared and noisy."
    echo
    echo "| machine | |"
    echo "|---|---|"
    echo "| CPU | $(nproc) × $(sed -n 's/^model name[^:]*: //p' /proc/cpuinfo | head -1) |"
    echo "| memory | $(awk '/MemTotal/ {printf "%.1f GiB", $2 / 1048576}' /proc/meminfo) |"
    echo "| kernel | $(uname -sr) |"
    echo "| load average at start | $(cut -d' ' -f1-3 /proc/loadavg) |"
    echo "| rl | $(git describe --always --dirty 2>/dev/null || echo unknown) |"
    echo "| redis-server | $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/') |"
    echo "| compiler | $(cc --version | head -1) |"
    echo "| hiredis / libuv / nng | $(version libhiredis-dev) / $(version libuv1-dev) / $(version libnng-dev) |"
    echo "| Node.js | $(node --version) |"
    echo "| peer | $(node "$RL_BENCH_PEER" version) |"
    echo
} >"$report"

echo "bench: exact path (about 5 minutes)"
"$runner" -- "$build/bench/bench-exact" | tee -a "$report"
echo "bench: synced path"
"$runner" -- "$build/bench/bench-synced" "$build/bin/rl-aggregator" \
    | tee -a "$report"

# The ten-agent test, as `make test` runs it: its windows against its bound.
echo "bench: the ten-agent test (about 40 s)"
env "$@" "$runner" -- "$build/tests/rl-tests" \
    --filter 'synced/ten_agents_stay_within_the_bound' >"$out/fleet.log" 2>&1 \
    || echo "bench: the ten-agent test failed, see $out/fleet.log" >&2
{
    echo
    echo "## Ten agents, one tenant, offered twice its limit (the test)"
    echo
    echo "| window | offered | admitted | limit | admitted / limit | stated bound | every gateway alone |"
    echo "|---|---|---|---|---|---|---|"
    sed -n 's/.*window \([0-9]*\): offered \([0-9]*\), admitted \([0-9]*\) (limit \([0-9]*\), [^,]*, stated bound \([0-9]*\), seed baseline \([0-9]*\)).*/\1 \2 \3 \4 \5 \6/p' \
        "$out/fleet.log" | awk '{printf "| %d | %d | %d | %d | %.2f | %d | %d |\n", $1, $2, $3, $4, $3 / $4, $5, $6}'
    echo
} | tee -a "$report"

echo "bench: Redis Cluster"
"$runner" --cluster -- "$build/bench/bench-cluster" | tee -a "$report"

gnuplot <<GNUPLOT
set terminal pngcairo size 1200,500 noenhanced
set output "$out/bench.png"
set multiplot layout 1,2 title "rl exact path, one rule, one redis-server (medians)"
set logscale x 2
set xrange [0.8:90]
set xtics ("1" 1, "16" 16, "64" 64)
set xlabel "requests in flight"
set key top left
set grid
set ylabel "requests per second"
plot for [k=0:4] "$out/exact.dat" using 1:(column(2 + 2 * k)) with linespoints lw 2 \
    title word("rl_check_async rl_check(threads) ceiling seed-script rate-limiter-flexible", k + 1)
set ylabel "p99 latency (µs)"
set logscale y
plot for [k=0:4] "$out/exact.dat" using 1:(column(3 + 2 * k)) with linespoints lw 2 \
    title word("rl_check_async rl_check(threads) ceiling seed-script rate-limiter-flexible", k + 1)
unset multiplot
GNUPLOT
echo "bench: wrote $report and $out/bench.png"
