#!/usr/bin/env bash
# Every "docs/<page>.md#<anchor>" that the sources put in messages names a
# heading that exists (GitHub's anchor: lower case, punctuation dropped,
# spaces to dashes), and the rendezvous pointer is among them.
#
# Usage: docs_links_test.sh
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
cd "$repo"

fail() { echo "FAILED: $*" >&2; exit 1; }

links=$(grep -rhoE 'docs/[A-Za-z0-9_-]+\.md#[A-Za-z0-9_-]+' framework backends plugins apps benchmarks scripts 2>/dev/null |
  sort -u)
[ -n "$links" ] || fail "no docs/<page>.md#<anchor> pointer in the sources"
grep -qx 'docs/clusters.md#diagnosing-a-rendezvous-that-does-not-complete' <<<"$links" ||
  fail "the rendezvous pointer (framework/core/help_links.hpp) is gone"

bad=0
for link in $links; do
  page=${link%%#*}
  anchor=${link#*#}
  [ -f "$page" ] || { echo "missing page: $link"; bad=1; continue; }
  if ! grep -E '^#{1,6} ' "$page" | sed -E 's/^#+ +//' | tr 'A-Z' 'a-z' | sed -E 's/[^a-z0-9 _-]//g; s/ /-/g' |
    grep -qx -- "$anchor"; then
    echo "no heading for: $link"
    bad=1
  else
    echo "ok: $link"
  fi
done
[ "$bad" -eq 0 ] || fail "pointers to headings that do not exist (above)"
echo "PASSED: $(wc -w <<<"$links") pointer(s) name existing headings"
