#!/bin/bash
# `make run`: the seed's scenario end to end. A private redis-server, the
# aggregator and ten rl-gateways on loopback ports; one client with a limit
# of 100 requests a minute sends 200 requests round-robin over the ten, with
# curl, once per mode. Prints a table and the three-rule decision table,
# writes a PNG plot, and stops everything it started (also on Ctrl-C).
#
# Usage: scripts/demo.sh BUILD_DIR   (make run calls it after building)
set -euo pipefail
me="rl demo"
. scripts/lib.sh

build=${1:-build}
bin=$build/bin
out=$build/run
gateways=10
requests=200
limit=100

pids=()
redis_pid=""
cleanup() {
    trap - EXIT INT TERM
    for pid in "${pids[@]}" $redis_pid; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${pids[@]}" $redis_pid; do
        wait "$pid" 2>/dev/null || true
    done
}
trap cleanup EXIT
trap 'echo; echo "rl demo: interrupted, stopping everything"; exit 130' INT TERM

rm -rf "$out"
mkdir -p "$out"

redis_start "$out"

free_port reports_port
free_port totals_port
reports="tcp://127.0.0.1:$reports_port"
totals="tcp://127.0.0.1:$totals_port"
header() {
    cat <<EOF
store: {url: "redis://127.0.0.1:$redis_port", timeout_ms: 100}
aggregator: {reports: "$reports", totals: "$totals", sync_interval_ms: 1000}
rules:
EOF
}
per_key() { # mode
    echo "  - {name: per-key, match: api_key, limit: $limit, period: 1m, mode: $1}"
}
for mode in local exact synced; do
    { header; per_key "$mode"; } > "$out/$mode.yaml"
done
{
    header
    echo "  - {name: per-ip, match: ip, limit: 1000, period: 1m}"
    per_key exact
    echo "  - {name: per-tenant, match: tenant, limit: 10000, period: 1h, mode: synced}"
} > "$out/seed.yaml"
# The aggregator sums every synced rule the gateways use.
{ header; per_key synced
  echo "  - {name: per-tenant, match: tenant, limit: 10000, period: 1h, mode: synced}"
} > "$out/aggregator.yaml"

"$bin/rl-aggregator" --config "$out/aggregator.yaml" 2> "$out/aggregator.log" &
pids+=($!)
wait_for "$out/aggregator.log" "event=listening" "rl-aggregator"

# Plays the scenario against ten fresh gateways on config $2; one line per
# request in $out/$1.csv: seconds since the first request, HTTP status,
# Retry-After, and the rule the RateLimit-Policy header names.
play() {
    local mode=$1 config=$2 urls=() gw_pids=()
    for i in $(seq 1 $gateways); do
        local port
        free_port port
        "$bin/rl-gateway" --listen "127.0.0.1:$port" --config "$config" \
            2> "$out/$mode-gateway-$i.log" &
        gw_pids+=($!)
        pids+=($!)
        wait_for "$out/$mode-gateway-$i.log" "event=listening" "rl-gateway"
        urls+=("http://127.0.0.1:$port/orders")
    done
    # The fleet has been up a while: each gateway has reported the rule once
    # (another client), so the aggregator knows how many agents share it.
    for u in "${urls[@]}"; do
        curl -s -o /dev/null -H "X-Api-Key: ak_warmup_$mode" \
            -H "X-Tenant: org_warmup" "$u"
    done
    sleep 2.5
    local round=()
    for n in $(seq 0 $((requests - 1))); do
        round+=(-o /dev/null "${urls[$((n % gateways))]}")
    done
    curl -s -H "X-Api-Key: ak_abc123_$mode" -H "X-Tenant: org_acme_$mode" \
        -w '%{time_total}|%{http_code}|%header{retry-after}|%header{ratelimit-policy}\n' \
        "${round[@]}" |
        awk -F'|' '{ t += $1; printf "%.4f,%s,%s,%s\n", t, $2, $3, $4 }' \
            > "$out/$mode.csv"
    for pid in "${gw_pids[@]}"; do kill -TERM "$pid"; done
    for pid in "${gw_pids[@]}"; do wait "$pid" || true; done
}

allowed() { grep -c ',200,' "$out/$1.csv" || true; }

echo "rl demo: one client, $limit requests a minute, $requests requests" \
     "round-robin over $gateways rl-gateways (curl, keep-alive)"
for mode in local exact synced seed; do
    play "$mode" "$out/$mode.yaml"
done

bound=$((2 * (limit + gateways)))
printf '\n%-34s %8s %8s  %s\n' "mode" "sent" "allowed" "expected"
printf '%-34s %8d %8d  %s\n' "local (each gateway counts alone)" \
    "$requests" "$(allowed local)" "~$requests: $gateways buckets of $limit"
printf '%-34s %8d %8d  %s\n' "exact (one bucket in Redis)" \
    "$requests" "$(allowed exact)" "exactly $limit"
printf '%-34s %8d %8d  %s\n' "synced (local counts + aggregator)" \
    "$requests" "$(allowed synced)" "at most $bound: 2 x (limit + agents)"
printf '%-34s %8d %8d  %s\n' "seed's three rules (ip/key/tenant)" \
    "$requests" "$(allowed seed)" "$limit: per-key binds"

echo
echo "Decision table, seed's three rules (what the $requests requests got):"
printf '%-13s %-12s %-12s %8s\n' "decision" "rule" "Retry-After" "requests"
awk -F, '{
    rule = $4; sub(/;.*/, "", rule); gsub(/"/, "", rule)
    decision = ($2 == 200) ? "allow" : "reject (" $2 ")"
    retry = ($3 == "") ? "-" : $3 " s"
    n[decision "|" rule "|" retry]++
} END { for (k in n) { split(k, f, "|"); printf "%-13s %-12s %-12s %8d\n", f[1], f[2], f[3], n[k] } }' \
    "$out/seed.csv" | sort

# Cumulative allowed over time, one line per mode, the limit drawn.
for mode in local exact synced seed; do
    awk -F, '$2 == 200 { n++ } { printf "%s %d\n", $1 * 1000, n }' \
        "$out/$mode.csv" > "$out/$mode.dat"
done
gnuplot <<EOF
set terminal pngcairo size 900,560
set output "$out/allowed.png"
set title "One client, $limit requests/minute, $requests requests over $gateways gateways"
set xlabel "ms since the first request"
set ylabel "requests allowed (cumulative)"
set key left top
set yrange [0:$((requests + 20))]
plot "$out/local.dat" with steps lw 2 title "local (each gateway alone)", \
     "$out/exact.dat" with steps lw 2 title "exact (one bucket in Redis)", \
     "$out/synced.dat" with steps lw 2 title "synced (aggregator)", \
     "$out/seed.dat" with steps lw 2 dt 2 title "seed's three rules", \
     $limit with lines lc rgb "red" dt 3 lw 2 title "limit ($limit)"
EOF
echo
echo "Plot: $out/allowed.png (per-request results: $out/<mode>.csv)"
