#!/usr/bin/env bash
# What an outgoing message's row costs PostgreSQL itself, apart from round
# trips and from this crate's client code: pgbench runs a handler's
# transaction (the claim and one UPDATE) without and with the outbox's
# insert of one 128-byte message with its headers (the statement the runtime
# sends with a handler's COMMIT), each transaction in one pipeline (no round
# trip between its statements), prepared, alternately, on 1 and 8
# connections. Prints each run's transactions per second and the medians'
# ratio. The tables are the runtime's own migrations, in a schema of the
# bench's, dropped at the end.
#
# Usage: tests/benches/outbox_row.sh [ROUNDS=3] [SECONDS=5]
# Server: INBOX_TEST_POSTGRES_URL (default postgres://postgres@127.0.0.1:5432/test);
# binaries: INBOX_TEST_PG_BIN, else the newest /usr/lib/postgresql/<version>/bin.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
seconds=${2:-5}
url=${INBOX_TEST_POSTGRES_URL:-postgres://postgres@127.0.0.1:5432/test}
bin=${INBOX_TEST_PG_BIN:-$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)}
schema=inbox_outbox_row_bench
scratch=$(mktemp -d)
cleanup() {
    "$bin/psql" -q "$url" -c "DROP SCHEMA IF EXISTS $schema CASCADE" >/dev/null 2>&1 || true
    rm -rf "$scratch"
}
trap cleanup EXIT

{
    echo "SET client_min_messages = warning;"
    echo "DROP SCHEMA IF EXISTS $schema CASCADE; CREATE SCHEMA $schema; SET search_path = $schema;"
    for up in inbox-runtime/migrations/postgres/*/up.sql; do cat "$up"; echo; done
    echo "CREATE TABLE accounts (id INT PRIMARY KEY, cents BIGINT NOT NULL);"
    echo "INSERT INTO accounts SELECT n, 0 FROM generate_series(1, 100) n;"
} | "$bin/psql" -q -v ON_ERROR_STOP=1 "$url" >/dev/null

body='INSERT INTO inbox_messages (handler, message_id) VALUES ('"'"'bench'"'"', gen_random_uuid()::text) ON CONFLICT DO NOTHING;
UPDATE accounts SET cents = cents + 1 WHERE id = :account;'
message="INSERT INTO inbox_outbox (id, destination, headers, payload) VALUES (gen_random_uuid()::text, 'receipts', decode(repeat('ab', 40), 'hex'), decode(repeat('cd', 128), 'hex'));"
printf '\\set account random(1, 100)\nBEGIN;\n\\startpipeline\n%s\n\\endpipeline\nCOMMIT;\n' \
    "$body" >"$scratch/handler.sql"
printf '\\set account random(1, 100)\nBEGIN;\n\\startpipeline\n%s\n%s\n\\endpipeline\nCOMMIT;\n' \
    "$body" "$message" >"$scratch/outbox.sql"

run() {
    PGOPTIONS="-c search_path=$schema" "$bin/pgbench" -n -M prepared -c "$2" -j "$2" \
        -T "$seconds" -f "$scratch/$1.sql" "$url" 2>/dev/null |
        awk '/^tps/ {print $3}'
}
median() { sort -n | awk '{v[NR] = $1} END {print v[int((NR + 1) / 2)]}'; }

for clients in 1 8; do
    : >"$scratch/handler.tps"
    : >"$scratch/outbox.tps"
    for round in $(seq 1 "$rounds"); do
        for variant in handler outbox; do
            tps=$(run "$variant" "$clients")
            echo "$tps" >>"$scratch/$variant.tps"
            echo "connections $clients round $round $variant: $tps tps"
        done
    done
    handler=$(median <"$scratch/handler.tps")
    outbox=$(median <"$scratch/outbox.tps")
    echo "connections $clients: handler $handler tps, with the message $outbox tps," \
        "ratio $(awk -v a="$outbox" -v b="$handler" 'BEGIN {printf "%.2f", a / b}')"
done
