#!/usr/bin/env bash
# make mutants: applies each deliberate breakage in tests/mutants/ (or only
# those named) to a copy of the tree, builds it and runs the tests the
# mutant's "tests:" filter selects through `make test`'s runner. Some test
# must fail. The file format is in tests/mutants/README.md.
#
#   mutants.sh [NAME...]      NAME: a file in tests/mutants, without .mutant
#
# MUTANT_JOBS mutants (default: the number of cores) are tried at once,
# each in its own copy, build/mutants/tree-N, with its own runner (each
# runner starts its servers on free ports). The copies are refreshed from
# the checkout's files (git ls-files, committed or not) at every run and
# built without LTO (linked by gold where cc has it), so that a mutant
# costs an incremental build; a missing tree-N starts as a copy of the
# built tree-1. Logs go to
# build/mutants/logs, the table, in the mutants' order whatever order they
# finish in, also to build/mutants/report.txt. The exit status is non-zero if
# the unmutated copy fails those tests, or a mutant survives, is stale or
# malformed, does not build, or its run fails without a failing test.
# A run that takes over MUTANT_TIMEOUT seconds (default 300) is stopped and
# counted as caught: `make test` would hang on it.
# MUTANT_BASELINE=no skips the run of every mutant's tests on the unmutated
# copy: for CI, where `make test` has just passed them on the same files.
# MUTANT_BUILD_ONLY=yes refreshes and builds the copies, then stops: CI
# builds them while `make test`'s tests leave the cores idle.
set -uo pipefail
shopt -s extglob
cd "$(dirname "$0")/.."
out=build/mutants
logs=$out/logs
results=$out/results
timeout_s=${MUTANT_TIMEOUT:-300}
jobs=$(nproc)
workers=${MUTANT_JOBS:-$jobs}
[[ $workers =~ ^[1-9][0-9]*$ ]] || {
    echo "mutants: MUTANT_JOBS must be a positive number, not '$workers'" >&2
    exit 1
}
baseline=${MUTANT_BASELINE:-yes}
[[ $baseline =~ ^(yes|no)$ ]] || {
    echo "mutants: MUTANT_BASELINE must be yes or no, not '$baseline'" >&2
    exit 1
}
build_only=${MUTANT_BUILD_ONLY:-no}
[[ $build_only =~ ^(yes|no)$ ]] || {
    echo "mutants: MUTANT_BUILD_ONLY must be yes or no, not '$build_only'" >&2
    exit 1
}
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
list_files() {
    git rev-parse --git-dir >/dev/null 2>&1 ||
        die "needs a git checkout: the copy is made from git ls-files"
    local f
    git ls-files --cached --others --exclude-standard |
        while IFS= read -r f; do [ -f "$f" ] && printf '%s\n' "$f"; done |
        sort -u >"$out/files"
}
# sync_tree TREE (after list_files)
sync_tree() {
    local tree=$1 list=$out/files f
    mkdir -p "$tree"
    while IFS= read -r f; do
        cmp -s "$f" "$tree/$f" 2>/dev/null && continue
        mkdir -p "$tree/$(dirname "$f")" && cp "$f" "$tree/$f" ||
            die "cannot copy $f into $tree"
    done <"$list"
    (cd "$tree" && find . -path ./build -prune -o -type f -print) |
        sed 's|^\./||' | sort | comm -13 "$list" - |
        while IFS= read -r f; do rm -f "$tree/$f"; done
}

# A mutant of librl (two thirds of them) links every program again, nine
# links that took most of its build: gold, where cc has it, links them in
# about half ld.bfd's time (rl-tests 0.8 s against 1.6 s, rl-rls 0.3
# against 0.8). The code linked is the same objects'.
gold_flag() {
    local probe=$out/gold-probe
    echo 'int main(void) { return 0; }' |
        "${CC:-cc}" -fuse-ld=gold -x c - -o "$probe" >/dev/null 2>&1 &&
        echo -fuse-ld=gold
    rm -f "$probe"
}
# build TREE LOG
build() {
    make -C "$1" -j"$jobs" LTO= LDFLAGS="$ldflags" all build/tests/rl-tests \
        build/tests/with-redis build/nginx/ngx_http_rl_module.so >"$2" 2>&1
}

# The tests that use the Redis Cluster the runner can start: starting one
# takes seconds, most mutants' tests never touch it. A test is one if its
# body names RL_TEST_CLUSTER; every test of a file that names it outside a
# test's body (in a helper) is one too. Listed from tree-1's test binary,
# once it is built (list_cluster_tests).
cluster_patterns() {
    awk '
    FNR == 1 { head = ""; intest = 0 }
    /^(Parameterized)?Test\(/ { head = $0; intest = 0 }
    head != "" && !intest {
        if (head != $0) head = head $0
        if (head ~ /\)/) {
            h = head
            sub(/^(Parameterized)?Test\(/, "", h)
            gsub(/[ \t]/, "", h)
            split(h, a, /[,)]/)
            test = a[1] "/" a[2]
            suite_of[FILENAME, a[1]] = 1
            intest = 1
            head = ""
        }
        next
    }
    /^}/ { intest = 0; next }
    /RL_TEST_CLUSTER/ { if (intest) print test; else helper[FILENAME] = 1 }
    END {
        for (k in suite_of) {
            split(k, p, SUBSEP)
            if (p[1] in helper) print p[2] "/*"
        }
    }' tests/unit/*.c tests/integration/*.c
}
# list_cluster_tests BINARY
list_cluster_tests() {
    local t p
    local -a patterns
    mapfile -t patterns < <(cluster_patterns)
    cluster_tests=()
    for t in $("$1" --list 2>&1 | awk '
        /^[^ ]+: [0-9]+ tests?$/ { suite = $1; sub(/:$/, "", suite); next }
        NF { print suite "/" $NF }'); do
        for p in "${patterns[@]}"; do
            # shellcheck disable=SC2053 # the pattern is a glob on purpose
            [[ $t == $p ]] && { cluster_tests+=("$t"); break; }
        done
    done
}

# --cluster when a filter (a Criterion --filter glob, extended) selects
# one of those tests.
runner_args() {
    local t
    for t in "${cluster_tests[@]}"; do
        # shellcheck disable=SC2053 # the filter is a glob on purpose
        [[ $t == $1 ]] && { echo --cluster; return; }
    done
}

# run_tests TREE FILTER LOG: runs the tests a filter selects, verbose, so
# that the log names every test that ran ([PASS]) or failed ([FAIL]).
# timeout runs them in a process group of their own, whose id is in
# TREE.runner while they run, for an interrupted run to stop (see stop).
run_tests() {
    timeout -k 20 "$timeout_s" make -C "$1" LTO= LDFLAGS="$ldflags" test \
        RUNNER_ARGS="$(runner_args "$2")" \
        CRITERION_ARGS="--verbose --filter '$2'" >"$3" 2>&1 &
    local runner=$!
    echo "$runner" >"$1.runner"
    wait "$runner"
    local rc=$?
    rm -f "$1.runner"
    return "$rc"
}

failed_in() {
    sed -n 's/^\[FAIL\] \([^ :]*::[^ :]*\):.*/\1/p' "$1" | sort -u |
        paste -sd ' ' -
}

# The tests a run ran: Criterion's syntheses (one a pass of
# scripts/criterion-alone.sh) summed.
tested_in() {
    sed -n 's/.*Synthesis: Tested: \([0-9]*\).*/\1/p' "$1" |
        awk '{ n += $1 } END { if (NR) print n }'
}

# restore N FILE: puts tree-N's FILE back as it was before the mutant,
# from tree-N.original, which is there only while a mutant is applied.
restore() {
    [ -f "$out/tree-$1.original" ] || return 0
    cp "$out/tree-$1.original" "$out/tree-$1/$2" && touch "$out/tree-$1/$2"
}

# try NAME FILE TESTS N, in the background: applies the mutant to tree-N,
# builds it, runs its tests, puts the file back, and leaves its row in
# $results/NAME: the result, the seconds, then the "caught by" text.
try() {
    local name=$1 file=$2 tests=$3 n=$4 tree=$out/tree-$4
    local t rc failed tested
    local result secs reason
    t=$(now)
    rm -f "$tree.original"
    if ! perl scripts/mutants.pl apply "$tree" "tests/mutants/$name.mutant" \
        "$tree.original" 2>"$logs/$name.apply.log"; then
        result=ERROR secs=- reason=$(cat "$logs/$name.apply.log")
    elif ! build "$tree" "$logs/$name.build.log"; then
        restore "$n" "$file"
        result=NOBUILD secs=$(since "$t") reason="see $logs/$name.build.log"
    else
        run_tests "$tree" "$tests" "$logs/$name.test.log"
        rc=$?
        restore "$n" "$file"
        failed=$(failed_in "$logs/$name.test.log")
        tested=$(tested_in "$logs/$name.test.log")
        secs=$(since "$t")
        if grep -q 'RL_TEST_CLUSTER is not set' "$logs/$name.test.log"; then
            result=ERROR reason="a test wants the cluster the runner did not start; see $logs/$name.test.log"
        elif [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
            result=caught reason="timeout: over ${timeout_s} s"
        elif [ -n "$failed" ]; then
            result=caught reason=$failed
        elif [ "${tested:-0}" -eq 0 ]; then
            result=ERROR reason="'$tests' selects no test"
        elif [ "$rc" -ne 0 ]; then
            result=ERROR reason="exit status $rc, no failed test; see $logs/$name.test.log"
        else
            result=SURVIVED reason="$tested tests passed: $tests"
        fi
    fi
    rm -f "$tree.original"
    printf '%s\n%s\n%s\n' "$result" "$secs" "$reason" >"$results/$name.tmp" &&
        mv "$results/$name.tmp" "$results/$name"
}

# While a try runs: its pid to its tree, and the tree to the file it
# mutated, so that an interrupted run stops them and puts the files back.
declare -A tree_of=() mutated=()
cleanup() {
    local n
    for n in "${!mutated[@]}"; do restore "$n" "${mutated[$n]}"; done
}
stop() {
    local pid n
    for pid in "${!tree_of[@]}"; do kill -TERM -- "-$pid" 2>/dev/null; done
    for n in "${!mutated[@]}"; do
        [ -f "$out/tree-$n.runner" ] &&
            kill -TERM -- "-$(cat "$out/tree-$n.runner")" 2>/dev/null
    done
    wait
    cleanup
    exit 130
}
trap cleanup EXIT
trap stop INT TERM

row() { printf '%-44s %-9s %6s  %s\n' "$@" | tee -a "$out/report.txt"; }

select_mutants "$@"
start=$(now)
# tree and original: where a run before MUTANT_JOBS kept its one copy.
rm -rf "$logs" "$results" "$out/report.txt" "$out/tree" "$out/original" \
    "$out"/tree-*.original "$out"/tree-*.runner
mkdir -p "$logs" "$results"
ldflags="${LDFLAGS:+$LDFLAGS }$(gold_flag)"
list_files
sync_tree "$out/tree-1"
build "$out/tree-1" "$logs/clean.build.log" ||
    die "the unmutated copy does not build; see $logs/clean.build.log"
list_cluster_tests "$out/tree-1/build/tests/rl-tests"
[ "${#cluster_tests[@]}" -gt 0 ] ||
    die "no test of $out/tree-1 uses the Redis Cluster: is --list broken?"

# name, status, file, tests, reason: one line per mutant.
mapfile -t checked < <(perl scripts/mutants.pl check "$out/tree-1" "${mutants[@]}")

# own_path FILE TREE: FILE, copied from tree-1 into TREE, names tree-1's
# path. nginx's configure (half a minute on one core) wrote its text files
# with it: they get TREE's, so nginx is not configured again; its objects
# name it only in their debug information. Anything else (a linked
# program, the example's rpath) goes, to be linked again in TREE.
own_path() {
    case $1 in
    "$2"/build/nginx/objs/*.o) ;;
    "$2"/build/nginx/*)
        if grep -qI . "$1"; then
            # Its time kept, so that nothing is older or newer than it was.
            cp -p "$1" "$1.time" &&
                sed -i "s|$PWD/$out/tree-1|$PWD/$2|g" "$1" &&
                touch -r "$1.time" "$1" && rm -f "$1.time"
        else
            rm -f "$1"
        fi
        ;;
    *) rm -f "$1" ;;
    esac
}

# As many copies as mutants to try at once. A new one starts as a copy of
# the built tree-1 (same times, so nothing is compiled again) less what
# names tree-1's path (own_path), then each is refreshed and built.
ok=$(printf '%s\n' "${checked[@]}" | awk -F'\t' '$2 == "ok"' | wc -l)
trees=$((workers < ok ? workers : ok))
[ "$trees" -ge 1 ] || trees=1
for ((n = 2; n <= trees; n++)); do
    tree=$out/tree-$n
    if [ ! -d "$tree" ]; then
        cp -a "$out/tree-1" "$tree" || die "cannot copy $out/tree-1 to $tree"
        grep -rlF "$PWD/$out/tree-1" "$tree/build" --exclude-dir=obj |
            while IFS= read -r f; do own_path "$f" "$tree"; done
    fi
    sync_tree "$tree"
    build "$tree" "$logs/clean.build-$n.log" ||
        die "the unmutated $tree does not build; see $logs/clean.build-$n.log"
done
if [ "$build_only" = yes ]; then
    echo "mutants: $trees copies built in $(since "$start") s"
    exit 0
fi

# Every filter once, on the unmutated copy: a test that fails there would
# "catch" every mutant. MUTANT_BASELINE=no leaves it out where every test
# has just passed on the same files (CI runs make test first).
filters=$(printf '%s\n' "${checked[@]}" | awk -F'\t' '$2 == "ok" { print $4 }' |
    sort -u | paste -sd '|' -)
if [ "$baseline" = no ]; then
    echo "mutants: the unmutated copy's run left out (MUTANT_BASELINE=no)"
elif [ -n "$filters" ]; then
    t=$(now)
    run_tests "$out/tree-1" "@($filters)" "$logs/clean.test.log"
    rc=$?
    failed=$(failed_in "$logs/clean.test.log")
    if [ "$rc" -ne 0 ] || [ -n "$failed" ]; then
        # CI keeps only the end of what a run printed: the failures' lines.
        grep -E '^\[(----|FAIL)\]|Assertion|CRASH|Timed out' \
            "$logs/clean.test.log" | tail -n 40 >&2
        die "the unmutated copy fails the mutants' tests (${failed:-exit status $rc}); see $logs/clean.test.log"
    fi
    echo "mutants: the unmutated copy passes $(tested_in "$logs/clean.test.log") tests in $(since "$t") s"
fi

# The rows in the mutants' order, as far as their results are in.
row mutant result seconds "caught by"
bad=0 shown=0 next=0
names=()
for line in "${checked[@]}"; do names+=("${line%%$'\t'*}"); done
show_ready() {
    local f result secs reason
    while [ "$shown" -lt "${#checked[@]}" ]; do
        f=$results/${names[$shown]}
        [ -f "$f" ] || return 0
        { read -r result; read -r secs; reason=$(cat); } <"$f"
        row "${names[$shown]}" "$result" "$secs" "$reason"
        [ "$result" = caught ] || bad=$((bad + 1))
        shown=$((shown + 1))
    done
}

# Each try runs in a process group of its own (set -m), which stop ends
# whole: its build, its runner's make.
set -m
free=()
for ((n = 1; n <= trees; n++)); do free+=("$n"); done
while [ "$next" -lt "${#checked[@]}" ] || [ "${#tree_of[@]}" -gt 0 ]; do
    if [ "$next" -lt "${#checked[@]}" ] && [ "${#free[@]}" -gt 0 ]; then
        IFS=$'\t' read -r name status file tests reason <<<"${checked[$next]}"
        next=$((next + 1))
        if [ "$status" != ok ]; then
            printf '%s\n-\n%s\n' "$status" "$reason" >"$results/$name"
        else
            n=${free[0]}
            free=("${free[@]:1}")
            mutated[$n]=$file
            try "$name" "$file" "$tests" "$n" </dev/null &
            tree_of[$!]=$n
        fi
        show_ready
        continue
    fi
    done_pid=""
    wait -n -p done_pid "${!tree_of[@]}"
    [ -n "$done_pid" ] || continue
    n=${tree_of[$done_pid]}
    unset "tree_of[$done_pid]" "mutated[$n]"
    free+=("$n")
    show_ready
done
set +m
show_ready
# CI keeps only the end of what a run printed: the rows not caught again.
if [ "$bad" -gt 0 ]; then
    echo "mutants not caught:"
    awk '$2 != "caught" && NR > 1' "$out/report.txt"
fi
echo "mutants: ${#checked[@]} mutants, $bad not caught, $(since "$start") s in all" |
    tee -a "$out/report.txt"
[ "$bad" -eq 0 ]
