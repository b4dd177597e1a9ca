// StrongId: an integer identifier with a type of its own, so a PageId cannot be passed where a
// BlockId is expected. Declare one per concept:
//   struct PageIdTag {};
//   using PageId = StrongId<PageIdTag, int32_t>;
// The default-constructed id is invalid (-1 for signed, max for unsigned representations).
#pragma once

#include <compare>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <limits>
#include <type_traits>

#include <fmt/format.h>

namespace folio {

template <typename Tag, typename Representation = int32_t>
class StrongId {
  static_assert(std::is_integral_v<Representation>);

 public:
  using representation_type = Representation;
  static constexpr Representation kInvalid = std::is_signed_v<Representation>
                                                 ? Representation(-1)
                                                 : std::numeric_limits<Representation>::max();

  constexpr StrongId() = default;
  constexpr explicit StrongId(Representation value) : value_(value) {}

  constexpr Representation value() const { return value_; }
  constexpr bool is_valid() const { return value_ != kInvalid; }
  static constexpr StrongId invalid() { return StrongId(); }

  constexpr auto operator<=>(const StrongId&) const = default;

 private:
  Representation value_ = kInvalid;
};

}  // namespace folio

template <typename Tag, typename Representation>
struct std::hash<folio::StrongId<Tag, Representation>> {
  size_t operator()(folio::StrongId<Tag, Representation> id) const noexcept {
    return std::hash<Representation>()(id.value());
  }
};

template <typename Tag, typename Representation>
struct fmt::formatter<folio::StrongId<Tag, Representation>> : fmt::formatter<Representation> {
  auto format(folio::StrongId<Tag, Representation> id, fmt::format_context& context) const {
    return fmt::formatter<Representation>::format(id.value(), context);
  }
};
