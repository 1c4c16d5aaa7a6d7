// Status with a message: the internal form of sinkattn_status_t + sinkattn_last_error().
#pragma once

#include <string>
#include <utility>

#include "sinkattn/sinkattn.h"

namespace sinkattn {

struct Status {
  sinkattn_status_t code = SINKATTN_OK;
  std::string message;

  static Status ok() { return {}; }
  bool is_ok() const { return code == SINKATTN_OK; }
};

inline Status invalid(std::string msg) { return {SINKATTN_ERR_INVALID_ARGUMENT, std::move(msg)}; }
inline Status unsupported(std::string msg) { return {SINKATTN_ERR_UNSUPPORTED, std::move(msg)}; }
inline Status internal_error(std::string msg) { return {SINKATTN_ERR_INTERNAL, std::move(msg)}; }

#define SINKATTN_RETURN_IF_ERROR(expr)          \
  do {                                          \
    ::sinkattn::Status _st = (expr);            \
    if (!_st.is_ok()) return _st;               \
  } while (0)

}  // namespace sinkattn
