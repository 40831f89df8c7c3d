#include "store/client/store_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cstdlib>
#include <string_view>
#include <limits>

#include "common/error.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "rpc/grpc_util.h"
#include "store/core/store_limits.h"
#include "store/client/store_session_client.h"
#include "store/wire/store_wire_client.h"

namespace ddprun {

namespace {

using std::chrono::milliseconds;

// Added to every call's deadline beyond its own timeout, so that a server-side timeout, whose
// message names the missing keys, reaches the client before the client's deadline fires.
constexpr milliseconds kDeadlineMargin{2000};

static_assert(kMaxStoreValueBytes + kMaxStoreKeyBytes + 64 * 1024 <=
                  static_cast<std::size_t>(kMaxMessageBytes),
              "a message must hold the largest value with its key");

uint32_t toTimeoutMs(milliseconds timeout) {
  const auto ms = std::max<int64_t>(timeout.count(), 0);
  return static_cast<uint32_t>(std::min<int64_t>(ms, std::numeric_limits<uint32_t>::max()));
}

}  // namespace

class StoreClient::Impl {
 public:
  explicit Impl(StoreClientOptions o) : options(std::move(o)) {
    if (useWire(options)) {
      wire = std::make_unique<detail::StoreWireClient>(detail::StoreWireClientOptions{
          options.address, options.token, options.connectTimeout, options.keepalive});
      if (wire->opened() == detail::StoreWireClient::Opened::kNotWire) wire.reset();
    }
    if (!wire) {
      session = std::make_unique<detail::StoreSessionClient>(
          detail::StoreSessionClientOptions{options.address, options.token, options.connectTimeout},
          makeChannel(options.address, options.keepalive, options.tls));
    }
  }

  static bool useWire(const StoreClientOptions& o) {
    if (o.tls.enabled || o.transport == StoreClientOptions::Transport::kGrpc) return false;
    const char* forced = std::getenv("DDPRUN_STORE_TRANSPORT");
    return !(forced && std::string_view(forced) == "grpc");
  }

  void fillScope(v1::Scope* scope) const {
    scope->set_run_id(options.runId);
    scope->set_round(options.round);
  }

  // Sends `request` over the session with a deadline of `wait` plus the margin, and returns the
  // response, or throws the exception its status maps to.
  v1::StoreResponse run(v1::StoreRequest& request, milliseconds wait, const std::string& what) {
    const auto deadline =
        std::chrono::steady_clock::now() + std::max(wait, milliseconds(0)) + kDeadlineMargin;
    v1::StoreResponse response = wire ? wire->call(request, deadline) : session->call(request, deadline);
    if (response.has_status() && response.status().code() != 0) {
      check(grpc::Status(static_cast<grpc::StatusCode>(response.status().code()),
                         response.status().message()),
            what);
    }
    return response;
  }

  // Maps the status of a failed call back to the exception the server started from.
  void check(const grpc::Status& status, const std::string& what) const {
    if (status.ok()) return;
    const std::string msg = "store " + what + " at " + options.address + ": " + status.error_message();
    switch (status.error_code()) {
      case grpc::StatusCode::DEADLINE_EXCEEDED:
        throw TimeoutError(msg);
      case grpc::StatusCode::UNAVAILABLE:
      case grpc::StatusCode::CANCELLED:
        throw ConnectionError(msg);
      case grpc::StatusCode::UNAUTHENTICATED:
        throw ConnectionError("store " + what + " at " + options.address + ": invalid job token");
      case grpc::StatusCode::FAILED_PRECONDITION:
        throw StateError(msg);
      case grpc::StatusCode::INVALID_ARGUMENT:
        throw ConfigError(msg);
      case grpc::StatusCode::RESOURCE_EXHAUSTED:
        throw CapacityError(msg);
      default:
        throw Error(msg);
    }
  }

  StoreClientOptions options;
  std::unique_ptr<detail::StoreWireClient> wire;          // one of the two
  std::unique_ptr<detail::StoreSessionClient> session;
};

StoreClient::StoreClient(StoreClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
StoreClient::~StoreClient() = default;
StoreClient::StoreClient(StoreClient&&) noexcept = default;
StoreClient& StoreClient::operator=(StoreClient&&) noexcept = default;

const StoreClientOptions& StoreClient::options() const { return impl_->options; }

void StoreClient::set(const std::string& key, const std::string& value) {
  validateStoreKey(key);
  validateStoreValue(key, value);
  v1::StoreRequest request;
  auto* op = request.mutable_set();
  impl_->fillScope(op->mutable_scope());
  op->set_key(key);
  op->set_value(value);
  impl_->run(request, impl_->options.timeout, "set of '" + key + "'");
}

std::string StoreClient::get(const std::string& key) {
  validateStoreKey(key);
  v1::StoreRequest request;
  auto* op = request.mutable_get();
  impl_->fillScope(op->mutable_scope());
  op->set_key(key);
  op->set_timeout_ms(toTimeoutMs(impl_->options.timeout));
  auto response = impl_->run(request, impl_->options.timeout, "get of '" + key + "'");
  return std::move(*response.mutable_get()->mutable_value());
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  validateStoreKey(key);
  v1::StoreRequest request;
  auto* op = request.mutable_add();
  impl_->fillScope(op->mutable_scope());
  op->set_key(key);
  op->set_delta(delta);
  return impl_->run(request, impl_->options.timeout, "add to '" + key + "'").add().value();
}

std::string StoreClient::compareSet(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  validateStoreKey(key);
  validateStoreValue(key, expected);
  validateStoreValue(key, desired);
  v1::StoreRequest request;
  auto* op = request.mutable_compare_set();
  impl_->fillScope(op->mutable_scope());
  op->set_key(key);
  op->set_expected(expected);
  op->set_desired(desired);
  auto response = impl_->run(request, impl_->options.timeout, "compare_set of '" + key + "'");
  return std::move(*response.mutable_compare_set()->mutable_value());
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, impl_->options.timeout); }

void StoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  for (const auto& key : keys) validateStoreKey(key);
  v1::StoreRequest request;
  auto* op = request.mutable_wait();
  impl_->fillScope(op->mutable_scope());
  for (const auto& key : keys) op->add_keys(key);
  op->set_timeout_ms(toTimeoutMs(timeout));
  impl_->run(request, timeout, "wait for " + quoteKeys(keys));
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) validateStoreKey(key);
  v1::StoreRequest request;
  auto* op = request.mutable_check();
  impl_->fillScope(op->mutable_scope());
  for (const auto& key : keys) op->add_keys(key);
  return impl_->run(request, impl_->options.timeout, "check of " + quoteKeys(keys)).check().all_present();
}

bool StoreClient::deleteKey(const std::string& key) {
  validateStoreKey(key);
  v1::StoreRequest request;
  auto* op = request.mutable_delete_key();
  impl_->fillScope(op->mutable_scope());
  op->set_key(key);
  return impl_->run(request, impl_->options.timeout, "delete of '" + key + "'").delete_key().deleted();
}

v1::StoreResponse StoreClient::call(v1::StoreRequest& request, milliseconds wait) {
  const auto deadline = std::chrono::steady_clock::now() + std::max(wait, milliseconds(0)) + kDeadlineMargin;
  auto failed = [](grpc::StatusCode code, const std::string& message) {
    v1::StoreResponse response;
    response.mutable_status()->set_code(static_cast<int32_t>(code));
    response.mutable_status()->set_message(message);
    return response;
  };
  try {
    return impl_->wire ? impl_->wire->call(request, deadline) : impl_->session->call(request, deadline);
  } catch (const ConnectionError& e) {  // reconnecting failed
    return failed(grpc::StatusCode::UNAVAILABLE, e.what());
  } catch (const std::exception& e) {
    return failed(grpc::StatusCode::INTERNAL, "store call at " + impl_->options.address + ": " + e.what());
  }
}

int64_t StoreClient::numKeys() {
  v1::StoreRequest request;
  impl_->fillScope(request.mutable_num_keys()->mutable_scope());
  return impl_->run(request, impl_->options.timeout, "num_keys").num_keys().count();
}

}  // namespace ddprun
