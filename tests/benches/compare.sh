#!/usr/bin/env bash
# Before and after: the throughput bench (`throughput/main.rs`) built at a
# base commit and at the working tree, run alternately as processes of their
# own (base, head, base, head, …), and for every table row the median over
# the runs of its ratio to `no-dedup` measured inside each run, for each
# side, and head ÷ base. Each run's ratio is taken against its own baseline,
# in its own interleaved rounds, so the machine's drift between runs cancels.
#
# Usage: tests/benches/compare.sh BASE [RUNS=3] [FEATURES=postgres,mysql,sqlite,async]
# The bench's INBOX_BENCH_* variables choose what each run measures, e.g.
#   INBOX_BENCH_VARIANTS=handler,duplicate INBOX_BENCH_CONNECTIONS=1 \
#   INBOX_BENCH_ROUNDS=6 INBOX_BENCH_ROUND_TRIPS=0 tests/benches/compare.sh 9a88948
# The base is built in a worktree under target/compare with a target
# directory of its own (or INBOX_COMPARE_BASE_BENCH names its executable,
# built at BASE with the same features, in a target directory other than
# this one's: a base built here, from files newer than the head's, leaves
# the head's executable looking up to date to cargo, which then runs the
# base's code as the head's; two identical executables are refused); both
# builds are release builds.
set -euo pipefail
cd "$(dirname "$0")/../.."
base=${1:?usage: compare.sh BASE [RUNS] [FEATURES]}
runs=${2:-3}
features=${3:-postgres,mysql,sqlite,async}
root=$PWD
work=$root/target/compare

# The path of the throughput bench's executable built in directory $1.
build() {
    (cd "$1" && CARGO_TARGET_DIR=$2 cargo bench -p inbox-tests --bench throughput --no-run \
        --message-format=json --features "$features") |
        grep -o '"executable":"[^"]*/throughput-[^"]*"' | tail -n 1 | cut -d '"' -f 4
}

if [ -n "${INBOX_COMPARE_BASE_BENCH:-}" ]; then
    # The base's executable, built earlier (at BASE, with the same features).
    base_bench=$INBOX_COMPARE_BASE_BENCH
else
    mkdir -p "$work"
    if [ ! -d "$work/base" ]; then
        git worktree add --detach "$work/base" "$base" >/dev/null
    else
        git -C "$work/base" checkout --quiet --detach "$base"
    fi
    base_bench=$(build "$work/base" "$work/base-target")
fi
head_bench=$(build "$root" "$root/target")
if cmp -s "$base_bench" "$head_bench"; then
    echo "the base's and the head's benches are the same executable: nothing to compare," >&2
    echo "or the head's was not rebuilt (see this script's header)" >&2
    exit 1
fi
echo "base $base: $base_bench"
echo "head $(git rev-parse --short HEAD)$(git diff --quiet || echo ' (+ working tree)'): $head_bench"

for run in $(seq 1 "$runs"); do
    for side in base head; do
        bench=${side}_bench
        echo "run $run: $side" >&2
        "${!bench}" --bench | sed "s/^/$side /"
    done
done | awk '
    # A table title: "<side> <backend>, <mode>, <n> connection(s) (load average …)".
    / connections? \(load average/ {
        side = $1; sub(/^[a-z]+ /, ""); sub(/ \(load average.*/, ""); table = $0; next
    }
    # A row: "<side>   <variant> <msgs/s> <ratio> (<range>) …".
    $2 ~ /^[a-z]/ && $4 ~ /^[0-9.]+$/ && $5 ~ /^\(/ {
        key = table " | " $2
        if (!(key in seen)) { seen[key] = 1; order[++keys] = key }
        ratios[key, $1] = ratios[key, $1] " " $4
    }
    function median(list,    values, n, i, j, t) {
        n = split(list, values, " ")
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++)
            if (values[j] + 0 < values[i] + 0) { t = values[i]; values[i] = values[j]; values[j] = t }
        return n ? values[int((n + 1) / 2)] : "nan"
    }
    END {
        printf "\n%-48s %-17s %8s %8s %10s\n", "table | variant", "", "base", "head", "head/base"
        for (k = 1; k <= keys; k++) {
            key = order[k]
            b = median(ratios[key, "base"]); h = median(ratios[key, "head"])
            printf "%-66s %8s %8s %10.3f\n", key, b, h, (b > 0 ? h / b : 0)
        }
        print "\n(ratios: x no-dedup, median over the runs of each side)"
    }'
