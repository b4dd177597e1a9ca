// Percentile: the value below which a given fraction of a sample falls, the one definition every
// Folio report uses (`folio bench`, the server load generator), so that two tools given the same
// latencies print the same p99.
//
// Definition: linear interpolation between the closest ranks, numpy.percentile's default
// ("linear", Hyndman and Fan's type 7). With the n values sorted ascending as v[0..n-1], the
// rank of fraction f is r = f * (n - 1); the result is v[floor(r)] + (r - floor(r)) *
// (v[floor(r) + 1] - v[floor(r)]). So p0 is the minimum, p100 the maximum, p50 of {1, 2, 3, 4}
// is 2.5, and p99 of 1..100 is 99.01 (rank 98.01). It is chosen over the floor (or nearest)
// rank because it moves smoothly as samples are added, and matches what a reader checking a
// report with numpy gets.
//
// An empty sample gives 0, not NaN: reports print a row even when it has no samples (TPOT when
// every request produced a single token), and NaN would be `null` in their JSON.
#pragma once

#include <span>
#include <vector>

namespace folio {

// Requires: 0 <= fraction <= 1. `values` in any order; 0 when empty.
double percentile(std::vector<double> values, double fraction);

// The same for values already sorted ascending, without the copy and the sort, for callers that
// take several percentiles of one sample.
// Requires: 0 <= fraction <= 1; `sorted` ascending (checked in debug builds).
double percentile_of_sorted(std::span<const double> sorted, double fraction);

}  // namespace folio
