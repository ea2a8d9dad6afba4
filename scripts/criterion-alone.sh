#!/bin/bash
# Runs a Criterion test binary in two passes: first the selected tests that
# tests/run-alone.txt names, one at a time, then the other selected tests
# RL_TEST_JOBS at once (unset or empty: as Criterion runs them by default,
# one per core). Timing tests with ten agents hold their bounds alone but
# not always beside another test on two cores; the list says which and why.
#
#   criterion-alone.sh BINARY [CRITERION ARGS...]
#
# A --filter in the arguments selects as it would for BINARY alone (an
# extended glob on "suite/name"). Exit status: the first failing pass's.
set -u
shopt -s extglob
binary=$1
shift
alone_list=${RL_TEST_ALONE:-tests/run-alone.txt}
[ -r "$alone_list" ] || {
    echo "criterion-alone: cannot read $alone_list" >&2
    exit 2
}

jobs=${RL_TEST_JOBS:-}
[[ -z $jobs || $jobs =~ ^[1-9][0-9]*$ ]] || {
    echo "criterion-alone: RL_TEST_JOBS must be a positive number, not '$jobs'" >&2
    exit 2
}

filter='*' args=()
while [ $# -gt 0 ]; do
    case $1 in
    --filter) filter=$2; shift 2 ;;
    --filter=*) filter=${1#--filter=}; shift ;;
    *) args+=("$1"); shift ;;
    esac
done

mapfile -t patterns < <(sed -e 's/#.*//' -e 's/[[:space:]]*$//' \
    "$alone_list" | grep .)
tests=$("$binary" --list 2>&1 | awk '
    /^[^ ]+: [0-9]+ tests?$/ { suite = $1; sub(/:$/, "", suite); next }
    NF { print suite "/" $NF }') || {
    echo "criterion-alone: $binary --list failed" >&2
    exit 2
}

# matched: the patterns that put a selected test in the first pass.
alone=() others=()
declare -A matched=()
for t in $tests; do
    # shellcheck disable=SC2053 # the filter is a glob on purpose
    [[ $t == $filter ]] || continue
    pass=others
    for p in "${patterns[@]}"; do
        # shellcheck disable=SC2053
        [[ $t == $p ]] && { pass=alone; matched[$p]=1; break; }
    done
    eval "$pass+=(\"\$t\")"
done

# Nothing selected: let Criterion say so ("Tested: 0"), as it would.
if [ ${#alone[@]} -eq 0 ] && [ ${#others[@]} -eq 0 ]; then
    exec "$binary" "${args[@]}" --filter "$filter"
fi
joined() { local IFS='|'; echo "@($*)"; }
if [ ${#alone[@]} -gt 0 ]; then
    "$binary" "${args[@]}" --jobs 1 --filter "$(joined "${alone[@]}")" ||
        exit
fi
# The others as the filter less the patterns that matched: Criterion's
# matcher fails an assertion on a list of some 300 names, not on a double
# negation. It takes some 80 ms a pattern to match a negation against
# every test (2.2 s for the whole list): a pattern that selected nothing
# is left out, and with none the filter is the caller's own (make mutants'
# filters rarely name a test of the list).
if [ ${#others[@]} -gt 0 ]; then
    [ -n "$jobs" ] && args+=(--jobs "$jobs")
    [ ${#matched[@]} -eq 0 ] && exec "$binary" "${args[@]}" --filter "$filter"
    exec "$binary" "${args[@]}" --filter "!(!($filter)|$(IFS='|'
        echo "${!matched[*]}"))"
fi
