#!/usr/bin/env bash
# The library loads libibverbs with dlopen (src/transport/ibverbs/ibverbs_library.cpp): it must neither
# name libibverbs among the libraries it needs nor leave an ibverbs symbol for the dynamic linker, or it
# would fail to load on a host without rdma-core (or with an older one).
set -euo pipefail
library="$1"
needed=$(readelf -d "$library" | grep NEEDED || true)
if grep -qi ibverbs <<<"$needed"; then
  echo "FAIL: $library needs libibverbs:"; echo "$needed"; exit 1
fi
undefined=$(nm -D --undefined-only "$library" | grep -E ' _?_?ibv_' || true)
if [[ -n "$undefined" ]]; then
  echo "FAIL: $library leaves ibverbs symbols to the dynamic linker:"; echo "$undefined"; exit 1
fi
echo "OK: $library neither needs libibverbs nor leaves an ibverbs symbol undefined"
