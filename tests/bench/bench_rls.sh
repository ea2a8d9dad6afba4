#!/bin/bash
# bench_rls.sh: rl-rls's calls per second against Redis's own for the same
# commands at the same depth. h2load (nghttp2-client) sends pre-framed
# unary gRPC calls (a 5-byte prefix and a RateLimitRequest of one
# descriptor, written here byte by byte) on one connection, 64 streams at
# once, to rl-rls with one loop (one core's worth); the reference is
# redis-benchmark -c 1 -P 64 running the two commands each call sends
# (INCRBY and PEXPIRE: the pair's rate is 1 / (1/a + 1/b)). The runs
# alternate, and the ratio is taken within each round, then the median.
#
# h2load counts HTTP statuses; a gRPC error is a 200 too. So the calls
# are counted where they land: the Redis window key's count must lie
# between the calls h2load completed and those it started (the last
# depth's worth were in flight when it stopped), or the run fails.
#
# At half the median peak, h2load --rps paces the same calls, and each
# call's time (its --log-file) gives p50, p99 and p99.9. Per core: the
# calls h2load completed over rl-rls's CPU seconds meanwhile
# (/proc/PID/stat).
#
# Then a descriptor with rl's extension asking for a token bucket, against
# rl_check_rule_async on the same rule at the same rate and depth
# (bench-rule-async: one caller keeping 64 checks in flight), alternating.
#
#   bench_rls.sh BUILD_DIR   (by `make bench`, under with-redis)
set -euo pipefail

build=$(cd "$1" && pwd)
me="bench rls"
. scripts/lib.sh

redis=${RL_TEST_REDIS:?run through make bench (with-redis)}
bench_out=${RL_BENCH_OUT:-$build/bench}
out=$bench_out/rls
seconds=3
runs=5
if [ "${RL_BENCH_QUICK:-0}" != 0 ]; then
    seconds=1
    runs=2
fi
depth=64

trap stop_everything EXIT
trap 'exit 130' INT TERM
rm -rf "$out"
mkdir -p "$out/rt/config"
out=$(cd "$out" && pwd)

cat > "$out/rt/config/bench.yaml" <<'YAML'
domain: bench
descriptors:
  - key: k
    rate_limit: {unit: hour, requests_per_unit: 4000000000}
  - key: t
    rate_limit: {unit: hour, requests_per_unit: 1000000000}
    rl: {algorithm: token_bucket}
YAML
# RateLimitRequest{domain "bench", descriptors [{entries [{k: v}]}]}:
# field 1 (domain) 0a 05 "bench"; field 2 (a descriptor) 12 08, its entry
# 0a 06, key 0a 01 "k", value 12 01 "v". 17 bytes, after gRPC's prefix.
printf '\x00\x00\x00\x00\x11\x0a\x05bench\x12\x08\x0a\x06\x0a\x01k\x12\x01v' \
    > "$out/call.bin"
# The same with the entry t: v.
printf '\x00\x00\x00\x00\x11\x0a\x05bench\x12\x08\x0a\x06\x0a\x01t\x12\x01v' \
    > "$out/call_tb.bin"

free_port grpc
free_port http
free_port debug
RUNTIME_ROOT=$out RUNTIME_SUBDIRECTORY=rt REDIS_SOCKET_TYPE=tcp \
REDIS_URL=$redis GRPC_HOST=127.0.0.1 GRPC_PORT=$grpc HOST=127.0.0.1 \
PORT=$http DEBUG_HOST=127.0.0.1 DEBUG_PORT=$debug LOG_LEVEL=info \
    "$build/bin/rl-rls" --workers 1 2> "$out/rls.log" &
daemons+=("$!")
wait_for "$out/rls.log" "event=listening" "rl-rls"

host=${redis%:*}
rport=${redis##*:}
url="http://127.0.0.1:$grpc/envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit"

# The calls h2load completed and started ("done started"; those in flight
# when it stopped reached rl-rls, and count).
h2() {
    h2load -c 1 -m "$depth" -D "$seconds" -d "$out/${call:-call}.bin" \
        -H 'content-type: application/grpc' -H 'te: trailers' "$@" "$url" \
        > "$out/h2load.txt"
    awk '/^requests:/ { print $8, $4 } ' "$out/h2load.txt" | head -1
}

rate_of() {
    awk '/^finished in/ { print $4 }' "$out/h2load.txt"
}

# rl-rls's CPU time so far (user and system, in clock ticks: fields 14
# and 15 of /proc/PID/stat, after the name in parentheses).
rls_pid=${daemons[-1]}
hz=$(getconf CLK_TCK)
cpu_ticks() {
    sed 's/^.*) //' "/proc/$rls_pid/stat" | awk '{ print $12 + $13 }'
}

# Calls per second of rl-rls's CPU: the calls h2load completed over the
# CPU seconds rl-rls used meanwhile ("calls/s per core": its rate divided
# by the cores it kept busy).
per_core() {
    awk -v c="$1" -v t="$2" -v hz="$hz" \
        'BEGIN { if (t > 0) printf "%.0f", c * hz / t; else print "n/a" }'
}

# p50, p99 and p99.9 in µs of a paced run's calls: h2load's --log-file
# holds a line per call (its start in µs, its HTTP status, µs to the end
# of its response).
percentiles() {
    cut -f3 "$1" | sort -n | awk '{ a[NR] = $1 }
        function q(p,   i) { i = int(NR * p + 0.999999); if (i < 1) i = 1;
                             return a[i] }
        END { if (NR == 0) { print "n/a n/a n/a 0"; exit }
              print q(0.50), q(0.99), q(0.999), NR }'
}

redis_rate() {
    redis-benchmark -h "$host" -p "$rport" -c 1 -P "$depth" -n "$1" -q \
        "${@:2}" | awk '{ for (i = 1; i <= NF; i++) if ($i ~ /requests/) \
        { print $(i - 1); exit } }'
}

# The sum of the window keys' counts: every call counted once.
counted() {
    redis-cli -h "$host" -p "$rport" --scan --pattern 'rls:*' | while read -r k; do
        redis-cli -h "$host" -p "$rport" GET "$k"
    done | awk '{ s += $1 } END { print s + 0 }'
}

ratios=()
rates=()
refs=()
total=0
started=0
cores=()
for round in $(seq 1 "$runs"); do
    t0=$(cpu_ticks)
    read -r done_calls started_calls < <(h2)
    cores+=("$(per_core "$done_calls" $(($(cpu_ticks) - t0)))")
    rate=$(rate_of)
    total=$((total + done_calls))
    started=$((started + started_calls))
    incr=$(redis_rate 500000 INCRBY rb:k 1)
    pexp=$(redis_rate 500000 PEXPIRE rb:k 1000)
    ref=$(awk -v a="$incr" -v b="$pexp" 'BEGIN { printf "%.0f", 1 / (1 / a + 1 / b) }')
    ratio=$(awk -v r="$rate" -v f="$ref" 'BEGIN { printf "%.2f", r / f }')
    echo "round $round: rl-rls $rate calls/s (${cores[-1]} per core), Redis pair $ref/s (INCRBY $incr, PEXPIRE $pexp): $ratio" >&2
    rates+=("$rate")
    refs+=("$ref")
    ratios+=("$ratio")
done
median() { printf '%s\n' "$@" | sort -g | awk '{ a[NR] = $1 } END { print a[int((NR + 1) / 2)] }'; }
got=$(counted)
if [ "$got" -lt "$total" ] || [ "$got" -gt "$started" ]; then
    echo "$me: Redis counted $got calls, h2load completed $total of" \
        "$started" >&2
    exit 1
fi

# p99 at half the peak: the same connection and depth, paced.
half=$(awk -v r="$(median "${rates[@]}")" 'BEGIN { printf "%d", r / 2 }')
h2 --rps "$half" --log-file="$out/paced.log" > /dev/null
got=$(counted)
read -r p50 p99 p999 paced < <(percentiles "$out/paced.log")

med_ratio=$(median "${ratios[@]}")
cat <<TABLE
## rl-rls (issue 30)

One connection, $depth streams, one descriptor (a fixed window), rl-rls
with one loop; Redis's own rate for INCRBY and PEXPIRE at the same depth
(redis-benchmark -c 1 -P $depth), rounds alternating; every call h2load
completed was counted in Redis ($got in all).

| | calls/s (median of $runs) |
|---|---|
| rl-rls | $(median "${rates[@]}") |
| rl-rls, per core (calls / its CPU seconds) | $(median "${cores[@]}") |
| Redis, the same commands | $(median "${refs[@]}") |
| ratio (median of rounds) | $med_ratio (target ≥ 0.7) |

At half the peak ($half calls/s asked, h2load \`--rps\`, $paced calls):
p50 $p50 µs, **p99 $p99 µs**, p99.9 $p999 µs (each call's time from its
start to its response's end, h2load's \`--log-file\`). Per core: the
calls h2load completed over rl-rls's CPU seconds meanwhile (utime and
stime of /proc/PID/stat), so h2load's and Redis's share of the two cores
is not counted against it.
TABLE

# The token bucket: rl-rls against rl_check_rule_async, same rule, rate
# and depth, rounds alternating.
tb_ratios=()
tb_rates=()
tb_refs=()
tb_cores=()
for round in $(seq 1 "$runs"); do
    t0=$(cpu_ticks)
    read -r done_calls _ < <(call=call_tb h2)
    tb_cores+=("$(per_core "$done_calls" $(($(cpu_ticks) - t0)))")
    rate=$(rate_of)
    ref=$("$build/bench/bench-rule-async" "$redis" "$seconds" "$depth" \
        1000000000 3600000)
    ratio=$(awk -v r="$rate" -v f="$ref" 'BEGIN { printf "%.2f", r / f }')
    echo "round $round: rl-rls token bucket $rate calls/s, rl_check_rule_async $ref/s: $ratio" >&2
    tb_rates+=("$rate")
    tb_refs+=("$ref")
    tb_ratios+=("$ratio")
done
tb_ratio=$(median "${tb_ratios[@]}")
tb_half=$(awk -v r="$(median "${tb_rates[@]}")" 'BEGIN { printf "%d", r / 2 }')
call=call_tb h2 --rps "$tb_half" --log-file="$out/paced_tb.log" > /dev/null
read -r tb_p50 tb_p99 tb_p999 tb_paced < <(percentiles "$out/paced_tb.log")
cat <<TABLE

A descriptor asking for a token bucket (\`rl: {algorithm: token_bucket}\`),
the same connection and depth, against \`rl_check_rule_async\` on the same
rule at the same rate, $depth checks in flight from one caller
(bench-rule-async), rounds alternating:

| | checks/s (median of $runs) |
|---|---|
| rl-rls, token bucket | $(median "${tb_rates[@]}") |
| rl-rls, per core (calls / its CPU seconds) | $(median "${tb_cores[@]}") |
| rl_check_rule_async | $(median "${tb_refs[@]}") |
| ratio (median of rounds) | $tb_ratio (target ≥ 0.7) |

At half the peak ($tb_half calls/s asked, $tb_paced calls): p50 $tb_p50 µs,
**p99 $tb_p99 µs**, p99.9 $tb_p999 µs.
TABLE
printf 'rl-rls, token bucket: calls/s / rl_check_rule_async\t%s\t>=\t0.70\tx\n' \
    "$tb_ratio" >> "$bench_out/targets.tsv"
printf 'rl-rls, fixed window: calls/s / Redis for its commands\t%s\t>=\t0.70\tx\n' \
    "$med_ratio" >> "$bench_out/targets.tsv"
