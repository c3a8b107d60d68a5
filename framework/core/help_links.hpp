// Where error messages send the reader: headings of docs/ pages, as GitHub
// anchors them (lower case, spaces to dashes). tests/cluster/docs_links_test.sh
// checks that every docs/<page>.md#<anchor> named in the sources exists.
#pragma once

namespace ddp {

// Appended to every error that means "the ranks did not all meet": store
// connect and wait timeouts, collectives that time out, rank-layout mistakes.
inline constexpr const char kRendezvousHelp[] = "see docs/clusters.md#diagnosing-a-rendezvous-that-does-not-complete";

}  // namespace ddp
