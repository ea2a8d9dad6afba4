# scripts/lib.sh: what the bash scripts that start rl's daemons and nginx
# share (make run, make run-nginx, the nginx benchmark). Sourced, not run;
# the caller sets `me` (its name in messages) and `set -euo pipefail`.

# free_port VAR: a loopback port nothing listens on (checked just before
# use) into VAR, never one handed out before by this shell. A variable,
# not $(...): a subshell would forget the ports it handed out.
used_ports=" "
free_port() {
    local p
    while :; do
        p=$((10000 + RANDOM % 22000)) # below the ephemeral range
        case "$used_ports" in *" $p "*) continue ;; esac
        if ! (exec 3<>/dev/tcp/127.0.0.1/$p) 2>/dev/null; then
            used_ports="$used_ports$p "
            printf -v "$1" '%s' "$p"
            return
        fi
    done
}

# wait_for FILE PATTERN WHAT: until FILE holds PATTERN (5 s at most), or
# the script ends with FILE shown.
wait_for() {
    for _ in $(seq 1 250); do
        grep -q "$2" "$1" 2>/dev/null && return 0
        sleep 0.02
    done
    echo "$me: $3 did not start; its log:" >&2
    cat "$1" >&2
    exit 1
}

# redis_start DIR: a private redis-server on a free loopback port, without
# persistence, logging to DIR/redis.log; sets redis_port and redis_pid
# (the caller stops it) and returns once it answers.
redis_start() {
    free_port redis_port
    redis-server --port "$redis_port" --bind 127.0.0.1 --save "" \
        --appendonly no --logfile "$1/redis.log" &
    redis_pid=$!
    for _ in $(seq 1 250); do
        redis-cli -p "$redis_port" ping >/dev/null 2>&1 && return 0
        sleep 0.02
    done
    echo "$me: redis-server did not answer; its log:" >&2
    cat "$1/redis.log" >&2
    exit 1
}

# nginx instances: each in its own prefix (config, pid file, error log,
# temporary files, html/index.html), its master our child in a process
# group of its own, so that nginx_stop_all stops its workers too whatever
# happened. Debian's nginx, as the tests run it.
nginx_bin=/usr/sbin/nginx
nginx_pids=()

# running PID: whether our child PID still runs (an exited child stays a
# zombie until waited for, and kill -0 succeeds on a zombie).
running() {
    local state
    state=$(ps -o stat= -p "$1" 2>/dev/null) && [ "${state#Z}" = "$state" ]
}

# nginx_conf DIR PORT WORKERS MAIN HTTP SERVER: DIR/nginx.conf, listening
# on 127.0.0.1:PORT (PORT may carry listen's options: "8080 reuseport")
# with WORKERS workers; MAIN, HTTP and SERVER are lines
# for the main context (load_module), the http block and the server block.
# No access log: its writes would be part of every figure measured.
nginx_conf() {
    local dir=$1
    mkdir -p "$dir/html" "$dir/tmp"
    # nginx reads a relative path from its prefix (-p DIR): DIR/DIR/...
    dir=$(cd "$dir" && pwd)
    echo hello > "$dir/html/index.html"
    cat > "$dir/nginx.conf" <<EOF
$4
worker_processes $3;
pid $dir/nginx.pid;
error_log $dir/error.log notice;
events { worker_connections 1024; }
http {
    access_log off;
    keepalive_requests 1000000;
    client_body_temp_path $dir/tmp/body;
    proxy_temp_path $dir/tmp/proxy;
    fastcgi_temp_path $dir/tmp/fastcgi;
    uwsgi_temp_path $dir/tmp/uwsgi;
    scgi_temp_path $dir/tmp/scgi;
$5
    server {
        listen 127.0.0.1:$2;
        root $dir/html;
$6
    }
}
EOF
}

# nginx_start DIR WORKERS: starts the instance of DIR/nginx.conf in the
# foreground (daemon off: $! is the master) and waits until its workers
# have started and it accepts connections (15 s at most).
nginx_start() {
    local dir workers=$2 pid port
    dir=$(cd "$1" && pwd)
    port=$(sed -n 's/.*listen 127\.0\.0\.1:\([0-9]*\).*/\1/p' "$dir/nginx.conf")
    setsid "$nginx_bin" -p "$dir" -c "$dir/nginx.conf" -e "$dir/error.log" \
        -g 'daemon off;' 2>> "$dir/error.log" &
    pid=$!
    nginx_pids+=("$pid")
    for _ in $(seq 1 750); do
        if ! running "$pid"; then
            echo "$me: nginx in $dir exited at start; its log:" >&2
            cat "$dir/error.log" >&2
            exit 1
        fi
        if [ "$(grep -c 'start worker process' "$dir/error.log")" -ge "$workers" ] \
            && (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
            return 0
        fi
        sleep 0.02
    done
    echo "$me: nginx in $dir did not start $workers workers on $port" >&2
    cat "$dir/error.log" >&2
    exit 1
}

# nginx_stop_all: a graceful stop (SIGQUIT: workers close their agents,
# which flushes synced counts) of every instance started, then SIGKILL to
# the process group of any still there after 20 s.
nginx_stop_all() {
    local pid
    for pid in "${nginx_pids[@]}"; do
        kill -QUIT "$pid" 2>/dev/null || true
    done
    for pid in "${nginx_pids[@]}"; do
        for _ in $(seq 1 1000); do
            running "$pid" || break
            sleep 0.02
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    done
    nginx_pids=()
}

# Everything else a script started (redis-server, rl-aggregator): their
# pids, stopped by stop_everything after nginx.
daemons=()

# stop_everything: for `trap stop_everything EXIT`: every nginx instance
# started, then the daemons (SIGTERM, and waits for them).
stop_everything() {
    local pid
    trap - EXIT INT TERM
    nginx_stop_all
    for pid in "${daemons[@]}"; do
        kill -TERM "$pid" 2>/dev/null || true
    done
    for pid in "${daemons[@]}"; do
        wait "$pid" 2>/dev/null || true
    done
}
