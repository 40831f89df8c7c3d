#include "store/core/store_status.h"

#include <exception>
#include <new>

#include "common/error.h"
#include "common/error_message.h"

namespace ddprun {

StoreStatus::StoreStatus(StoreCode c, std::string m) : code(c), message(boundedErrorMessage(std::move(m))) {}

StoreStatus StoreStatus::fromCurrentException() {
  try {
    throw;
  } catch (const ConfigError& e) {
    return {StoreCode::kInvalidArgument, e.what()};
  } catch (const TimeoutError& e) {
    return {StoreCode::kDeadlineExceeded, e.what()};
  } catch (const ClosedError& e) {
    return {StoreCode::kUnavailable, e.what()};
  } catch (const ConnectionError& e) {
    return {StoreCode::kUnavailable, e.what()};
  } catch (const StateError& e) {
    return {StoreCode::kFailedPrecondition, e.what()};
  } catch (const CapacityError& e) {
    return {StoreCode::kResourceExhausted, e.what()};
  } catch (const std::bad_alloc&) {
    return {StoreCode::kResourceExhausted, "the store is out of memory"};
  } catch (const std::exception& e) {
    return {StoreCode::kInternal, e.what()};
  } catch (...) {
    return {StoreCode::kUnknown, "unknown error in the store"};
  }
}

}  // namespace ddprun
