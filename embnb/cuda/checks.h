// embnb's argument and data checks: c10's error types (Python sees ValueError,
// TypeError or RuntimeError), made without a C++ backtrace. TORCH_CHECK's
// errors capture one when made (backtrace() walks every frame); on the lent
// GPU machines (Ubuntu 24.04, GCC 13.3, torch 2.11+cu130) that walk segfaulted
// for every c10 error an extension threw, while a std::runtime_error passed
// (pytorch/pytorch#117645 shows the same crash inside backtrace()).
#pragma once

#include <c10/util/Exception.h>
#include <c10/util/Lazy.h>
#include <c10/util/StringUtil.h>

#include <memory>
#include <string>

namespace embnb {

inline c10::Backtrace no_backtrace() {
  static const c10::Backtrace none =
      std::make_shared<c10::PrecomputedLazyValue<std::string>>(std::string());
  return none;
}

}  // namespace embnb

#define EMBNB_CHECK_AS(error, cond, ...)                                  \
  do {                                                                    \
    if (C10_UNLIKELY(!(cond))) {                                          \
      throw error(c10::str(__VA_ARGS__), ::embnb::no_backtrace());        \
    }                                                                     \
  } while (0)
#define EMBNB_CHECK(cond, ...) EMBNB_CHECK_AS(c10::Error, cond, __VA_ARGS__)
#define EMBNB_CHECK_VALUE(cond, ...) EMBNB_CHECK_AS(c10::ValueError, cond, __VA_ARGS__)
#define EMBNB_CHECK_TYPE(cond, ...) EMBNB_CHECK_AS(c10::TypeError, cond, __VA_ARGS__)
