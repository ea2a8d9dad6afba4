#!/usr/bin/env bash
# make mutants: applies each deliberate breakage in tests/mutants/ (or only
# those named) in turn to a copy of the tree, builds it and runs the tests
# the mutant's "tests:" filter selects through `make test`'s runner. Some
# test must fail. The file format is in tests/mutants/README.md.
#
#   mutants.sh [NAME...]      NAME: a file in tests/mutants, without .mutant
#
# The copy is build/mutants/tree, refreshed from the checkout's files (git
# ls-files, committed or not) at every run and built without LTO, so that a
# mutant costs an incremental build. Logs go to build/mutants/logs, the
# table also to build/mutants/report.txt. The exit status is non-zero if
# the unmutated copy fails those tests, or a mutant survives, is stale or
# malformed, does not build, or its run fails without a failing test.
# A run that takes over MUTANT_TIMEOUT seconds (default 300) is stopped and
# counted as caught: `make test` would hang on it.
set -uo pipefail
cd "$(dirname "$0")/.."
out=build/mutants
tree=$out/tree
logs=$out/logs
timeout_s=${MUTANT_TIMEOUT:-300}
jobs=$(nproc)
# The copy is built the same way whatever make called this script with.
unset MAKEFLAGS MFLAGS MAKELEVEL MAKEOVERRIDES

die() {
    echo "mutants: $*" >&2
    exit 1
}

now() { echo "$EPOCHREALTIME"; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

select_mutants() {
    if [ $# -eq 0 ]; then
        mutants=(tests/mutants/*.mutant)
        [ -e "${mutants[0]}" ] || die "no tests/mutants/*.mutant"
        return
    fi
    mutants=()
    for name in "$@"; do
        local f=tests/mutants/${name%.mutant}.mutant
        [ -f "$f" ] || die "no $f"
        mutants+=("$f")
    done
}

# Copies what differs (a fresh mtime, so make rebuilds what depends on it,
# also a file a stopped run left mutated) and removes what is gone.
sync_tree() {
    git rev-parse --git-dir >/dev/null 2>&1 ||
        die "needs a git checkout: the copy is made from git ls-files"
    mkdir -p "$tree"
    local list=$out/files f
    git ls-files --cached --others --exclude-standard |
        while IFS= read -r f; do [ -f "$f" ] && printf '%s\n' "$f"; done |
        sort -u >"$list"
    while IFS= read -r f; do
        cmp -s "$f" "$tree/$f" 2>/dev/null && continue
        mkdir -p "$tree/$(dirname "$f")" && cp "$f" "$tree/$f" ||
            die "cannot copy $f into $tree"
    done <"$list"
    (cd "$tree" && find . -path ./build -prune -o -type f -print) |
        sed 's|^\./||' | sort | comm -13 "$list" - |
        while IFS= read -r f; do rm -f "$tree/$f"; done
}

build() {
    make -C "$tree" -j"$jobs" LTO= all build/tests/rl-tests \
        build/tests/with-redis >"$1" 2>&1
}

# The suites of the test files that use the Redis Cluster the runner can
# start: starting one takes seconds, most mutants' tests never touch it.
cluster_suites=$(grep -l RL_TEST_CLUSTER tests/unit/*.c tests/integration/*.c |
    xargs sed -n 's/^\(Parameterized\)\{0,1\}Test(\([a-z_0-9]*\),.*/\2/p' |
    sort -u)

# --cluster when a filter (suite/test globs, or @(a|b) of them) may select
# a test of those suites: the suite part of each glob is matched as a glob.
runner_args() {
    local f=${1#@(} alt pattern suite
    local -a alts
    IFS='|' read -ra alts <<<"${f%)}"
    for alt in "${alts[@]}"; do
        pattern=${alt%%/*}
        for suite in $cluster_suites; do
            # shellcheck disable=SC2053 # the pattern is a glob on purpose
            [[ $suite == $pattern ]] && { echo --cluster; return; }
        done
    done
}

# Runs the tests a filter selects, verbose, so that the log names every
# test that ran ([PASS]) or failed ([FAIL]). timeout runs them in a process
# group of their own, which an interrupted run stops (see stop).
runner=""
run_tests() {
    timeout -k 20 "$timeout_s" make -C "$tree" LTO= test \
        RUNNER_ARGS="$(runner_args "$1")" \
        CRITERION_ARGS="--verbose --filter '$1'" >"$2" 2>&1 &
    runner=$!
    wait "$runner"
    local rc=$?
    runner=""
    return "$rc"
}

failed_in() {
    sed -n 's/^\[FAIL\] \([^ :]*::[^ :]*\):.*/\1/p' "$1" | sort -u |
        paste -sd ' ' -
}

tested_in() {
    sed -n 's/.*Synthesis: Tested: \([0-9]*\).*/\1/p' "$1" | tail -n 1
}

# The mutated file while a mutant is applied, so that an interrupted run
# puts it back.
mutated=""
restore() {
    [ -n "$mutated" ] || return 0
    cp "$out/original" "$tree/$mutated" && touch "$tree/$mutated"
    mutated=""
}
stop() {
    [ -z "$runner" ] || kill -TERM -- "-$runner" 2>/dev/null
    wait
    restore
    exit 130
}
trap restore EXIT
trap stop INT TERM

row() { printf '%-44s %-9s %6s  %s\n' "$@" | tee -a "$out/report.txt"; }

select_mutants "$@"
start=$(now)
rm -rf "$logs" "$out/report.txt"
mkdir -p "$logs"
sync_tree
build "$logs/clean.build.log" ||
    die "the unmutated copy does not build; see $logs/clean.build.log"

# name, status, file, tests, reason: one line per mutant.
mapfile -t checked < <(perl scripts/mutants.pl check "$tree" "${mutants[@]}")

# Every filter once, on the unmutated copy: a test that fails there would
# "catch" every mutant.
filters=$(printf '%s\n' "${checked[@]}" | awk -F'\t' '$2 == "ok" { print $4 }' |
    sort -u | paste -sd '|' -)
if [ -n "$filters" ]; then
    t=$(now)
    run_tests "@($filters)" "$logs/clean.test.log"
    rc=$?
    failed=$(failed_in "$logs/clean.test.log")
    if [ "$rc" -ne 0 ] || [ -n "$failed" ]; then
        die "the unmutated copy fails the mutants' tests (${failed:-exit status $rc}); see $logs/clean.test.log"
    fi
    echo "mutants: the unmutated copy passes $(tested_in "$logs/clean.test.log") tests in $(since "$t") s"
fi

row mutant result seconds "caught by"
bad=0
for line in "${checked[@]}"; do
    IFS=$'\t' read -r name status file tests reason <<<"$line"
    t=$(now)
    if [ "$status" != ok ]; then
        row "$name" "$status" - "$reason"
        bad=$((bad + 1))
        continue
    fi
    perl scripts/mutants.pl apply "$tree" "tests/mutants/$name.mutant" \
        "$out/original" 2>"$logs/$name.apply.log"
    if [ $? -ne 0 ]; then
        row "$name" ERROR - "$(cat "$logs/$name.apply.log")"
        bad=$((bad + 1))
        continue
    fi
    mutated=$file
    if ! build "$logs/$name.build.log"; then
        restore
        row "$name" NOBUILD "$(since "$t")" "see $logs/$name.build.log"
        bad=$((bad + 1))
        continue
    fi
    run_tests "$tests" "$logs/$name.test.log"
    rc=$?
    restore
    failed=$(failed_in "$logs/$name.test.log")
    tested=$(tested_in "$logs/$name.test.log")
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
        row "$name" caught "$(since "$t")" "timeout: over ${timeout_s} s"
    elif [ -n "$failed" ]; then
        row "$name" caught "$(since "$t")" "$failed"
    elif [ "${tested:-0}" -eq 0 ]; then
        row "$name" ERROR "$(since "$t")" "'$tests' selects no test"
        bad=$((bad + 1))
    elif [ "$rc" -ne 0 ]; then
        row "$name" ERROR "$(since "$t")" "exit status $rc, no failed test; see $logs/$name.test.log"
        bad=$((bad + 1))
    else
        row "$name" SURVIVED "$(since "$t")" "$tested tests passed: $tests"
        bad=$((bad + 1))
    fi
done
echo "mutants: ${#checked[@]} mutants, $bad not caught, $(since "$start") s in all" |
    tee -a "$out/report.txt"
[ "$bad" -eq 0 ]
