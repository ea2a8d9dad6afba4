#!/bin/bash
# `make run-nginx`: the seed's scenario through nginx. A private
# redis-server and five nginx instances of two workers each (ten workers)
# with ngx_http_rl_module on loopback ports; one client with a limit of 100
# requests a minute sends 200 requests round-robin over the five, with curl,
# a connection per request so that the kernel spreads them over each
# instance's workers (reuseport). Then the same with nginx's own limit_req
# at the same rate. Prints what each let through and how many workers
# served, and stops everything it started (also on Ctrl-C).
#
# Usage: scripts/demo-nginx.sh BUILD_DIR   (make run-nginx calls it)
set -euo pipefail
me="rl demo"
. scripts/lib.sh

build=$(cd "${1:-build}" && pwd)
out=$build/run-nginx
module=$build/nginx/ngx_http_rl_module.so
instances=5
workers=2
requests=200
limit=100

trap stop_everything EXIT
trap 'echo; echo "rl demo: interrupted, stopping everything"; exit 130' INT TERM

rm -rf "$out"
mkdir -p "$out"
redis_start "$out"
daemons+=("$redis_pid")
cat > "$out/rl.yaml" <<EOF
store: {url: "redis://127.0.0.1:$redis_port", timeout_ms: 100}
rules:
  - {name: per-key, match: api_key, limit: $limit, period: 1m}
EOF

# Plays the scenario against $instances fresh instances; $2 and $3 are the
# http block's lines and the location's. One line per request in
# $out/$1.log, from the access logs: the worker's pid and the status.
play() {
    local mode=$1 urls=() i port dir
    for i in $(seq 1 $instances); do
        dir=$out/$mode-$i
        free_port port
        # reuseport: a socket per worker, and the kernel hands each new
        # connection to one of them
        nginx_conf "$dir" "$port reuseport" "$workers" "load_module $module;" \
            "    log_format demo '\$pid \$status';
$2" "        location / { access_log $out/$mode.log demo; $3 }"
        nginx_start "$dir" "$workers"
        urls+=("http://127.0.0.1:$port/index.html")
    done
    local round=()
    for n in $(seq 0 $((requests - 1))); do
        round+=(-o /dev/null "${urls[$((n % instances))]}")
    done
    curl -s -H "X-Api-Key: ak_abc123_$mode" -H "Connection: close" \
        "${round[@]}"
    # the access logs are written when each request ends; a graceful stop
    # waits for all of them
    nginx_stop_all
}

play rl "    rl_config $out/rl.yaml;
    rl_attr api_key \$http_x_api_key;" "rl on;"
# nginx's own: the same rate, with a burst so that a fresh zone lets
# $limit through at once, as the rule's full bucket does
play limit_req "    limit_req_zone \$http_x_api_key zone=per_key:1m rate=${limit}r/m;
    limit_req_status 429;" "limit_req zone=per_key burst=$((limit - 1)) nodelay;"

allowed() { awk '$2 == 200' "$out/$1.log" | wc -l; }
served() { awk '{ print $1 }' "$out/$1.log" | sort -u | wc -l; }

echo "rl demo: one client, $limit requests a minute, $requests requests" \
     "round-robin over $instances nginx instances x $workers workers" \
     "(curl, a connection per request)"
printf '\n%-42s %6s %8s %8s  %s\n' "nginx" "sent" "allowed" "workers" "expected"
printf '%-42s %6d %8d %8d  %s\n' "with rl, exact rule (one bucket in Redis)" \
    "$requests" "$(allowed rl)" "$(served rl)" "exactly $limit"
printf '%-42s %6d %8d %8d  %s\n' "with limit_req (each instance alone)" \
    "$requests" "$(allowed limit_req)" "$(served limit_req)" \
    "$requests: $instances zones of $limit, $((requests / instances)) each"
echo
echo "Per-request results (worker pid, status): $out/rl.log, $out/limit_req.log"
