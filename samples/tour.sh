#!/bin/sh
# The README tour: rmqstore on the bundled sample stores. Needs `rmqstore` on PATH.
# Read-only on the samples themselves; anything that writes works on a copy in a temp dir.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
store="$here/multi-segment"

step() { printf '\n== %s\n$ %s\n' "$1" "$2"; }

step "What is in the store" "rmqstore stats samples/multi-segment"
rmqstore stats "$store"

step "The first messages, in CommitLog order" "rmqstore dump samples/multi-segment --limit 5 --body none"
rmqstore dump "$store" --limit 5 --body none

step "Look a key up through the IndexFiles" "rmqstore query-key samples/multi-segment --topic OrderEvents --key order-1010"
rmqstore query-key "$store" --topic OrderEvents --key order-1010 --body text

step "IPv6 hosts and non-ASCII tags, keys and bodies" "rmqstore dump samples/ipv6-unicode --limit 3 --body text"
rmqstore dump "$here/ipv6-unicode" --limit 3 --body text

step "Check the healthy stores (exit 0)" "rmqstore verify samples/multi-segment"
rmqstore verify "$here/multi-segment"
rmqstore verify "$here/ipv6-unicode"

step "Check a crashed store: torn tail, abort file (exit 1 = problems found)" "rmqstore verify samples/crashed"
rc=0
rmqstore verify "$here/crashed" || rc=$?
if [ "$rc" -ne 1 ]; then
    echo "tour: expected exit 1 from verify on samples/crashed, got $rc" >&2
    exit 1
fi
echo "(exit $rc, as expected)"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cp -R "$here/crashed" "$work/crashed"
step "Repair a copy of it (backup kept beside it), then verify again" "rmqstore repair /tmp/…/crashed --yes && rmqstore verify /tmp/…/crashed"
rmqstore repair "$work/crashed" --yes
rmqstore verify "$work/crashed"
echo
echo "tour: done"
