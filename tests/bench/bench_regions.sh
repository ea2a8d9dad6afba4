#!/bin/bash
# bench_regions.sh: the two regions load tests of
# tests/integration/test_regions.c (three regions, their links 40, 80 and
# 150 ms one way, twice a global limit of 300 offered) at the issue's
# shape, 300 per 10 s synced every second (RL_TEST_REGIONS_SHAPE=10s/1s;
# make test runs them at 4s/200ms), one at a time as make test runs
# them, with the same assertions. About 2.5 minutes. Writes a section of
# the figure lines the tests print and their results; a failed test's
# assertion messages are in it, and the script then fails.
#
#   bench_regions.sh BUILD_DIR   (by `make bench`, with the test
#   environment; RL_TEST_REGIONS_SHAPE for another shape)
set -euo pipefail

build=$1
bench_out=${RL_BENCH_OUT:-$build/bench}
out=$bench_out/regions
shape=${RL_TEST_REGIONS_SHAPE:-10s/1s}
# A try-out runs the tests' own shape, a minute shorter.
[ "${RL_BENCH_QUICK:-0}" = 0 ] || shape=4s/200ms
tests='regions/@(three_regions*|a_region_cut*)'

rm -rf "$out"
mkdir -p "$out/daemon-logs"
log=$out/tests.log
status=0
RL_TEST_REGIONS_SHAPE=$shape RL_TEST_LOGDIR="$(cd "$out" && pwd)/daemon-logs" \
    bash scripts/criterion-alone.sh "$build/tests/rl-tests" \
    --verbose --filter "$tests" >"$log" 2>&1 || status=$?
# A filter that matched nothing checked nothing.
grep -q 'Synthesis: Tested: [1-9]' "$log" || status=1

# result NAME: "passed", or "**failed**" and its assertion messages (or
# Criterion's line: a crash, a timeout), or "**did not run**".
result() {
    grep -q "^\[PASS\] regions::$1:" "$log" && { echo passed; return; }
    grep -q "^\[FAIL\] regions::$1:" "$log" || { echo '**did not run**'; return; }
    printf '**failed**: %s\n' "$(awk -v t="[FAIL] regions::$1:" '
        /^\[RUN \]/ { msg = "" }
        /^\[----\]   [^ ]/ { sub(/^\[----\]   /, ""); msg = msg " " $0 }
        index($0, t) == 1 { print msg == "" ? $0 : substr(msg, 2); exit }' \
        "$log")"
}

demand=$(grep -m 1 '^regions: most' "$log" || true)
periods=$(grep '^regions: period' "$log" || true)
cut=$(grep -m 1 '^regions cut:' "$log" || true)

cat <<TABLE
## Regions: one global limit across three regions (issue 32)

The load tests of \`tests/integration/test_regions.c\` at
\`RL_TEST_REGIONS_SHAPE=$shape\` (period / sync interval): three regions on
this machine, each its own redis-server, rl-aggregator and two agents, the
exchanges delayed 40 ms (eu–us), 80 ms (us–ap) and 150 ms (eu–ap) one
way, a global rule of 300 a period offered twice the limit. Targets: no
span of one period over 1.05 of the limit (1.1 with a region cut off), at
least 0.9 of it in each aligned period of steady overload.

| test | result |
|---|---|
| 70/20/10, then 10/20/70 (\`three_regions_at_twice_the_limit_follow_their_demand\`) | $(result three_regions_at_twice_the_limit_follow_their_demand) |
| 70/20/10, ap cut off for three periods (\`a_region_cut_off_keeps_its_part\`) | $(result a_region_cut_off_keeps_its_part) |

\`\`\`
${demand:-regions: no figures (see $log)}
$periods
${cut:-regions cut: no figures (see $log)}
\`\`\`
TABLE

# The headline figures and targets, from the lines the tests printed.
if [ -n "$demand" ]; then
    read -r most limit p0 p1 p2 p3 p4 p5 < <(echo "$demand" | sed -n \
        's/.*most in a period \([0-9]*\) of \([0-9]*\); periods \([0-9 ]*\);.*/\1 \2 \3/p')
    # Steady overload: the second and third periods of each split.
    least=$(printf '%s\n' "$p1" "$p2" "$p4" "$p5" | sort -n | head -1)
    printf 'three regions, %s per period (%s), twice the limit 70/20/10 then 10/20/70\tmost in any span of one period %s; per period %s %s %s %s %s %s\t%s\n' \
        "$limit" "$shape" "$most" "$p0" "$p1" "$p2" "$p3" "$p4" "$p5" \
        "$(echo "$demand" | sed 's/.*; //')" >>"$bench_out/figures.tsv"
    printf 'regions (%s): most in any span of one period / limit\t%.2f\t<=\t1.05\tx\n' \
        "$shape" "$(awk -v n="$most" -v l="$limit" 'BEGIN { print n / l }')" >>"$bench_out/targets.tsv"
    printf 'regions (%s): least per period in steady overload / limit\t%.2f\t>=\t0.90\tx\n' \
        "$shape" "$(awk -v n="$least" -v l="$limit" 'BEGIN { print n / l }')" >>"$bench_out/targets.tsv"
fi
if [ -n "$cut" ]; then
    printf 'three regions, ap cut off for three periods (%s)\t%s\t\n' \
        "$shape" "${cut#regions cut: }" >>"$bench_out/figures.tsv"
fi

if [ "$status" != 0 ]; then
    echo "bench regions: failed; see $log" >&2
    grep -E '^\[(----|FAIL)\]' "$log" \
        | grep -vE '^\[----\] (Criterion v|  *$)' >&2 || true
fi
exit "$status"
