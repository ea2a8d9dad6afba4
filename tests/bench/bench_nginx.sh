#!/bin/bash
# bench_nginx.sh: what ngx_http_rl_module costs nginx. wrk (Debian's) against
# nginx serving a small static file, four instances started side by side:
# without rl (the reference: no module loaded), an exact rule (Redis), a
# synced rule (an rl-aggregator started here) and nginx's own limit_req
# (each worker alone). The runs take the four in turn, starting each round
# with the next one, so that the machine's drift falls on all of them; the
# ratios are taken within each round, then their median.
#
# Every limit is far above the offered rate and every request carries the
# same API key: the figures are the check's cost, not cheap 429s (a run
# with any non-2xx answer fails the benchmark).
#
# One worker per instance: this machine's two cores hold wrk (one thread),
# the worker (its agent runs in the worker's own loop), and for rl Redis
# and the aggregator. A second worker would only take turns with them.
#
#   bench_nginx.sh BUILD_DIR   (by `make bench`, under with-redis, which
#                               gives RL_TEST_REDIS)
# Tables on stdout; figures and targets into $RL_BENCH_OUT (bench_report.h's
# format), judged by scripts/bench.sh.
set -euo pipefail

build=$(cd "$1" && pwd)
me="bench nginx"
. scripts/lib.sh

redis=${RL_TEST_REDIS:?run through make bench (with-redis)}
bench_out=${RL_BENCH_OUT:-$build/bench}
out=$bench_out/nginx
module=$build/nginx/ngx_http_rl_module.so
seconds=3
runs=7
if [ "${RL_BENCH_QUICK:-0}" != 0 ]; then
    seconds=1
    runs=3
fi
threads=1
connections=32
key=ak_bench
configs="off exact synced limit_req"

trap stop_everything EXIT
trap 'exit 130' INT TERM

rm -rf "$out"
mkdir -p "$out"
# nginx reads relative paths (rl_config's too) from its prefix, $out/$c.
out=$(cd "$out" && pwd)

free_port reports
free_port totals
# A billion a second: never reached, so every request is checked and
# allowed.
rule="{name: per-key, match: api_key, limit: 1000000000, period: 1s"
cat > "$out/exact.yaml" <<EOF
store: {url: "redis://$redis"}
rules:
  - $rule}
EOF
cat > "$out/synced.yaml" <<EOF
store: {url: "redis://$redis"}
aggregator: {reports: "tcp://127.0.0.1:$reports", totals: "tcp://127.0.0.1:$totals"}
rules:
  - $rule, mode: synced}
EOF
"$build/bin/rl-aggregator" --config "$out/synced.yaml" 2> "$out/aggregator.log" &
agg_pid=$!
daemons+=("$agg_pid")
wait_for "$out/aggregator.log" "event=listening" "rl-aggregator"

declare -A port worker
for c in $configs; do
    free_port "port[$c]"
    main="" http="" server="        location / { }"
    case $c in
    exact | synced)
        main="load_module $module;"
        http="    rl_config $out/$c.yaml;
    rl_attr api_key \$http_x_api_key;"
        server="        location / { rl on; }"
        ;;
    limit_req)
        # a rate in ms: requests in the same millisecond count against
        # the burst, which must hold them
        http="    limit_req_zone \$http_x_api_key zone=per_key:1m rate=1000000000r/s;"
        server="        location / { limit_req zone=per_key burst=1000000 nodelay; }"
        ;;
    esac
    nginx_conf "$out/$c" "${port[$c]}" 1 "$main" "$http" "$server"
    nginx_start "$out/$c" 1
    worker[$c]=$(ps -o pid= --ppid "${nginx_pids[-1]}" | tr -d ' ')
done

# Each rl instance checks the request: its RateLimit headers say so.
for c in exact synced; do
    if ! curl -s -o /dev/null -D - -H "X-Api-Key: $key" \
        "http://127.0.0.1:${port[$c]}/index.html" | grep -qi '^RateLimit-Remaining:'; then
        echo "$me: nginx with the $c rule answered without RateLimit headers" >&2
        exit 1
    fi
done

# CPU seconds (user and system) a process has used, all its threads: the
# nginx worker's (its agent included), the aggregator's.
tick=$(getconf CLK_TCK)
cpu_s() { sed 's/.*) //' "/proc/$1/stat" | awk -v t="$tick" '{ print ($12 + $13) / t }'; }
# What the check costs outside nginx: Redis's CPU (INFO cpu) and the
# aggregator's.
others_s() {
    local r
    r=$(redis-cli -h "${redis%:*}" -p "${redis##*:}" info cpu |
        awk -F: '/^used_cpu_(sys|user):/ { s += $2 } END { print s }')
    awk -v r="$r" -v a="$(cpu_s "$agg_pid")" 'BEGIN { print r + a }'
}

# wrk_run CONFIG SECONDS: one wrk run; prints "requests/s p99-in-ms
# non-2xx socket-errors requests".
wrk_run() {
    wrk -t"$threads" -c"$connections" -d"$2s" --latency \
        -H "X-Api-Key: $key" "http://127.0.0.1:${port[$1]}/index.html" |
        tee -a "$out/wrk-$1.log" |
        awk '
        function ms(v) {
            if (v ~ /us$/) return v / 1000
            if (v ~ /ms$/) return v + 0
            if (v ~ /m$/) return v * 60000
            return v * 1000 # s
        }
        /^ *99%/ { p99 = ms($2) }
        /^Requests\/sec:/ { rps = $2 }
        /Non-2xx or 3xx responses:/ { bad = $NF }
        /Socket errors:/ { errs = $4 + $6 + $8 + $10 }
        / requests in / { n = $1 }
        END { printf "%s %.3f %d %d %d\n", rps, p99, bad, errs, n }'
}

# A warm-up of each (first sightings, connections to Redis), not counted.
for c in $configs; do
    wrk_run "$c" 1 > /dev/null
done

: > "$out/runs.tsv"
names=($configs)
for r in $(seq 0 $((runs - 1))); do
    for i in 0 1 2 3; do
        c=${names[$(((r + i) % 4))]}
        w0=$(cpu_s "${worker[$c]}") o0=$(others_s)
        read -r rps p99 bad errs n < <(wrk_run "$c" "$seconds")
        w1=$(cpu_s "${worker[$c]}") o1=$(others_s)
        if [ -z "$rps" ] || [ "$bad" != 0 ] || [ "$errs" != 0 ]; then
            echo "$me: $c, run $r: $bad non-2xx answers, $errs socket errors" \
                 "(see $out/wrk-$c.log)" >&2
            exit 1
        fi
        awk -v r="$r" -v c="$c" -v rps="$rps" -v p99="$p99" -v n="$n" \
            -v w0="$w0" -v w1="$w1" -v o0="$o0" -v o1="$o1" 'BEGIN {
            printf "%d\t%s\t%s\t%s\t%.2f\t%.2f\n", r, c, rps, p99,
                   (w1 - w0) * 1e6 / n, (o1 - o0) * 1e6 / n }' \
            >> "$out/runs.tsv"
    done
done

# median / min / max of a column of numbers on stdin: "min median max"
summary() {
    sort -g | awk '{ v[NR] = $1 } END { printf "%s %s %s\n", v[1], v[int((NR + 1) / 2)], v[NR] }'
}
col() { # CONFIG FIELD(3 = requests/s, 4 = p99, 5 = worker's CPU µs per
        # request, 6 = Redis's and the aggregator's)
    awk -F'\t' -v c="$1" -v f="$2" '$2 == c { print $f }' "$out/runs.tsv"
}
ratio() { # CONFIG FIELD: CONFIG's FIELD over off's, per run
    awk -F'\t' -v c="$1" -v f="$2" '
        $2 == "off" { ref[$1] = $f } $2 == c { v[$1] = $f }
        END { for (r in v) printf "%.4f\n", v[r] / ref[r] }' "$out/runs.tsv"
}
med() { "$@" | summary | cut -d' ' -f2; }

label_off="without rl (no module loaded)"
label_exact="with rl, exact rule (Redis)"
label_synced="with rl, synced rule (aggregator)"
label_limit_req="with its own limit_req (each worker alone)"
label() { local v="label_$1"; echo "${!v}"; }

echo "## nginx with rl: wrk against a static file ($runs runs of ${seconds} s per config)"
echo
echo "nginx $("$nginx_bin" -v 2>&1 | sed 's|.*/||'), one worker per instance;"
echo "wrk -t$threads -c$connections --latency, one API key, every limit far above the"
echo "offered rate (no request rejected). The four instances take turns in"
echo "each round; ratios are to nginx without rl in the same round."
echo
echo "The CPU columns say where a request's time goes: the nginx worker's"
echo "(its agent included) and Redis's plus the aggregator's, per"
echo "request (medians; wrk's own is the rest of the two cores)."
echo
echo "| nginx | requests/s min | median | max | p99 ms min | median | max | req/s / without rl | p99 / without rl | worker CPU µs / request | Redis + aggregator CPU µs / request |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for c in $configs; do
    read -r rmin rmed rmax < <(col "$c" 3 | summary)
    read -r pmin pmed pmax < <(col "$c" 4 | summary)
    printf '| %s | %.0f | %.0f | %.0f | %.2f | %.2f | %.2f | %.2f | %.2f | %.1f | %.1f |\n' \
        "$(label "$c")" "$rmin" "$rmed" "$rmax" "$pmin" "$pmed" "$pmax" \
        "$(med ratio "$c" 3)" "$(med ratio "$c" 4)" "$(med col "$c" 5)" \
        "$(med col "$c" 6)"
done

tsv() { # FILE FIELDS...: one tab-separated line into $RL_BENCH_OUT/FILE
    local f=$1
    shift
    [ -n "${RL_BENCH_OUT:-}" ] || return 0
    (IFS=$'\t'; echo "$*") >> "$RL_BENCH_OUT/$f"
}
# 26692.4 as "26,692", as bench_int writes the report's other figures
thousands() { printf '%.0f' "$1" | sed ':a; s/\B[0-9]\{3\}\>/,&/; ta'; }
off_rps=$(thousands "$(med col off 3)")
off_p99=$(med col off 4)
for c in exact synced limit_req; do
    tsv figures.tsv "nginx $(label "$c"): requests/s, p99" \
        "$(printf '%s req/s, p99 %.2f ms (%.2f× / %.2f× of nginx without rl)' \
            "$(thousands "$(med col "$c" 3)")" "$(med col "$c" 4)" \
            "$(med ratio "$c" 3)" "$(med ratio "$c" 4)")" \
        "$(printf 'nginx without rl: %s req/s, p99 %.2f ms' "$off_rps" "$off_p99")"
done
tsv targets.tsv "nginx, synced rule: requests/s / without rl" \
    "$(printf '%.2f' "$(med ratio synced 3)")" ">=" 0.90 x
tsv targets.tsv "nginx, exact rule: requests/s / without rl" \
    "$(printf '%.2f' "$(med ratio exact 3)")" ">=" 0.75 x
tsv targets.tsv "nginx, exact rule: p99 / without rl" \
    "$(printf '%.2f' "$(med ratio exact 4)")" "<=" 1.50 x
