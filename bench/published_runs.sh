#!/bin/sh
# The published runs of docs/benchmarks.md ("Results").
# `sh bench/published_runs.sh [DATE [RUN ...]]` writes bench/results/DATE-RUN/
# (DATE defaults to today's; RUN to all of: reference api-json html-pages
# many-keys sweep-procs serializers stampede http http-outage). Every run interleaves
# its targets 3 times (--repeat 3; http-outage 2). html-pages runs at its scenario's
# default ops (20,000 per process). many-keys runs 10,000 of its 100,000: each of its
# 18 target runs pre-fills a million keys, and at the default the run would take hours
# on a 2-core machine. The others use fewer ops so that the whole set fits in about an
# hour and a half, http another hour and a quarter, http-outage 12 minutes
# (docs/benchmarks.md says which).
set -u  # not -e: a run whose target failed exits 1, and the next runs still go
cd "$(dirname "$0")/.."
DATE=${1:-$(date -u +%Y-%m-%d)}
[ $# -gt 0 ] && shift
RUNS=${*:-reference api-json html-pages many-keys sweep-procs serializers stampede http http-outage}
DJCB=${DJCB:-.venv/bin/djcachebench}
OUT=bench/results
ALL=locmem,sqlite,tiered,redis,memcached,diskcache

for run in $RUNS; do
    case $run in
    reference)
        "$DJCB" bench --scenario reference --ops 20000 --repeat 3 --backends "$ALL" \
            --out "$OUT/$DATE-reference" ;;
    api-json)
        "$DJCB" bench --scenario api-json --ops 5000 --warmup 200 --repeat 3 --backends "$ALL" \
            --out "$OUT/$DATE-api-json" ;;
    html-pages)
        "$DJCB" bench --scenario html-pages --repeat 3 --backends "$ALL" \
            --out "$OUT/$DATE-html-pages" ;;
    many-keys)
        "$DJCB" bench --scenario many-keys --ops 10000 --repeat 3 --backends "$ALL" \
            --out "$OUT/$DATE-many-keys" ;;
    sweep-procs)
        "$DJCB" sweep --vary procs=1,2,4,8,16 --scenario reference --ops 2000 --warmup 200 \
            --repeat 3 --backends "$ALL" --out "$OUT/$DATE-sweep-procs" ;;
    serializers)
        "$DJCB" bench --scenario api-json --ops 5000 --warmup 200 --repeat 3 \
            --backends sqlite,tiered,redis --serializer pickle,msgpack \
            --out "$OUT/$DATE-serializers"
        "$DJCB" serializers --out "$OUT/$DATE-serializers" ;;
    stampede)
        "$DJCB" stampede --repeat 3 --backends "$ALL" --out "$OUT/$DATE-stampede" ;;
    http)
        # 7 routes x 6 targets x 30 s x 3 runs: about 75 minutes.
        "$DJCB" http --duration 30 --repeat 3 --backends "$ALL" --out "$OUT/$DATE-http" ;;
    http-outage)
        # TieredCache over redis with and without its breaker, redis stopped every 2 s
        # and every 4 s: about 12 minutes.
        for every in 2 4; do
            "$DJCB" http --backends tiered-redis --breaker on,off --l2-outage "$every" \
                --duration 24 --routes light-page,session --repeat 2 --stampede-clients 20 \
                --out "$OUT/$DATE-http-outage-${every}s"
        done ;;
    *)
        echo "unknown run: $run" >&2
        exit 2 ;;
    esac
done
