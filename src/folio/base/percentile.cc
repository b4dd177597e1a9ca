#include "folio/base/percentile.h"

#include <algorithm>
#include <cmath>

#include "folio/base/check.h"

namespace folio {

double percentile(std::vector<double> values, double fraction) {
  std::sort(values.begin(), values.end());
  return percentile_of_sorted(values, fraction);
}

double percentile_of_sorted(std::span<const double> sorted, double fraction) {
  // Written so that a NaN fraction fails too.
  FOLIO_CHECK(fraction >= 0 && fraction <= 1, "percentile fraction {} outside [0, 1]", fraction);
  FOLIO_DCHECK(std::is_sorted(sorted.begin(), sorted.end()), "percentile of unsorted values");
  if (sorted.empty()) return 0;
  const double rank = fraction * static_cast<double>(sorted.size() - 1);
  const size_t below = static_cast<size_t>(std::floor(rank));
  const double weight = rank - static_cast<double>(below);
  // An exact rank returns its value as is: no neighbour past the end at p100, and no
  // inf - inf = NaN when the sample holds infinities.
  if (weight == 0) return sorted[below];
  return sorted[below] + weight * (sorted[below + 1] - sorted[below]);
}

}  // namespace folio
