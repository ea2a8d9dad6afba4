#!/bin/sh
# `make profile`: the instruction counts the docs quote, measured with
# callgrind so that anyone can reproduce them (instructions, unlike times,
# do not move with the machine's other tenants). Usage (from make):
#   scripts/profile.sh BUILD_DIR
# Writes BUILD_DIR/profile/profile.md and keeps callgrind's files beside it
# (callgrind_annotate reads them). Two loads, each under with-redis:
#   - synced: RL_PROFILE_CHECKS (1,000,000) synced checks over 1,000 keys on
#     one thread, collected inside rl_check only, first sightings excluded;
#   - exact: redis-server itself under callgrind, collecting inside FCALL
#     and EVALSHA: RL_PROFILE_CALLS (5,000) calls of rl's function and of
#     the seed's script on new keys, then on the same keys again.
set -eu

build=$1
runner=$build/tests/with-redis
profile=$build/bench/profile
checks=${RL_PROFILE_CHECKS:-1000000}
calls=${RL_PROFILE_CALLS:-5000}
rm -rf "$build/profile"
mkdir -p "$build/profile/synced" "$build/profile/exact"
out=$(cd "$build/profile" && pwd) # redis-server changes directory
report=$out/profile.md

{
    echo "# rl instruction counts (\`make profile\`)"
    echo
    echo "Revision \`$(git describe --always --dirty 2>/dev/null || echo unknown)\`,"
    echo "$(date -u '+%Y-%m-%d %H:%M UTC'), $(valgrind --version),"
    echo "redis-server $(redis-server --version | sed 's/.*v=\([^ ]*\).*/\1/'),"
    echo "$(cc --version | head -1)."
    echo
} >"$report"

echo "profile: $checks synced checks under callgrind"
"$runner" -- valgrind --tool=callgrind \
    --callgrind-out-file="$out/synced/callgrind.out.%p" \
    --toggle-collect=rl_check --dump-before=measured_checks \
    "$profile" synced "$checks" 2>"$out/synced/valgrind.log"
# The dump made on entry to the measured loop holds the first sightings;
# the last one, written at exit, the measured checks alone.
last=""
for f in "$out"/synced/callgrind.out.*; do
    case ${f##*/callgrind.out.} in *.*) ;; *) last=$f ;; esac
done
instructions=$(sed -n 's/^totals: *//p' "$last")
awk -v i="$instructions" -v n="$checks" 'BEGIN {
    printf "## Synced check\n\n"
    printf "| figure | instructions |\n|---|---|\n"
    printf "| %d checks over 1,000 keys, one thread, inside rl_check | %d |\n", n, i
    printf "| per check | %.1f |\n\n", i / n
}' >>"$report"

echo "profile: rl's function and the seed's script in redis-server under callgrind"
cat >"$out/redis-callgrind" <<EOF
#!/bin/sh
exec valgrind --tool=callgrind --callgrind-out-file=$out/exact/callgrind.out.%p \
    --toggle-collect=fcallCommand --toggle-collect=evalShaCommand \
    --dump-before=echoCommand redis-server "\$@"
EOF
chmod +x "$out/redis-callgrind"
{
    echo "## Exact path: instructions per call inside redis-server"
    echo
    echo "$calls calls on new keys, then the same keys again; inside"
    echo "\`fcallCommand\` / \`evalShaCommand\` (the call, not reading the"
    echo "request or writing the reply)."
    echo
} >>"$report"
RL_REDIS_SERVER=$out/redis-callgrind RL_PROFILE_DIR=$out/exact \
    "$runner" -- "$profile" exact "$calls" >>"$report"
cat "$report"
echo "profile: wrote $report"
