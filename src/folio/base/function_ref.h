// FunctionRef: a non-owning reference to a callable, two words wide and never allocating. Used
// where a callee runs a callback before returning (ThreadPool::parallel_for), so the callable
// outlives every call.
#pragma once

#include <memory>
#include <type_traits>
#include <utility>

#include "folio/base/thread_annotations.h"

namespace folio {

template <typename Signature>
class FunctionRef;

template <typename Return, typename... Args>
class FunctionRef<Return(Args...)> {
 public:
  template <typename Callable,
            typename = std::enable_if_t<!std::is_same_v<std::decay_t<Callable>, FunctionRef> &&
                                        std::is_invocable_r_v<Return, Callable&, Args...>>>
  FunctionRef(Callable&& callable)  // NOLINT: implicit by design, like std::function
      : object_(const_cast<void*>(static_cast<const void*>(std::addressof(callable)))),
        // Not analysed: a callback that needs a lock says so itself (a FOLIO_REQUIRES on the
        // lambda, whose body is then checked), and the analysis cannot follow the call through
        // this type-erased pointer to check the caller held it.
        invoke_([](void* object, Args... args) FOLIO_NO_THREAD_SAFETY_ANALYSIS -> Return {
          return (*static_cast<std::remove_reference_t<Callable>*>(object))(
              std::forward<Args>(args)...);
        }) {}

  Return operator()(Args... args) const { return invoke_(object_, std::forward<Args>(args)...); }

 private:
  void* object_;
  Return (*invoke_)(void*, Args...);
};

}  // namespace folio
