#include "rendezvous/store_client.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <limits>
#include <random>
#include <thread>

#include "common/error.h"
#include "ddprun/v1/store.grpc.pb.h"
#include "rendezvous/grpc_util.h"
#include "rendezvous/store_limits.h"

namespace ddprun {

namespace {

using std::chrono::milliseconds;

// Added to every call's deadline beyond its own timeout, so that a server-side timeout, whose
// message names the missing keys, reaches the client before the client's deadline fires.
constexpr milliseconds kDeadlineMargin{2000};
constexpr milliseconds kFirstBackoff{20};
constexpr milliseconds kMaxBackoff{1000};

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
  explicit Impl(StoreClientOptions o)
      : options(std::move(o)), channel(makeChannel(options.address)), stub(v1::Store::NewStub(channel)) {
    connect();
  }

  // A fresh context per call: the token and a deadline of `wait` plus the margin.
  void prepare(grpc::ClientContext& context, milliseconds wait) const {
    if (!options.token.empty()) context.AddMetadata(kTokenMetadataKey, options.token);
    context.set_deadline(std::chrono::system_clock::now() + std::max(wait, milliseconds(0)) +
                         kDeadlineMargin);
  }

  void fillScope(v1::Scope* scope) const {
    scope->set_run_id(options.runId);
    scope->set_round(options.round);
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
      default:
        throw Error(msg);
    }
  }

  StoreClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::Store::Stub> stub;

 private:
  // Asks the channel to connect until it is READY, sleeping a jittered, doubling delay between
  // attempts so that many workers starting together do not retry in lockstep.
  void connect() {
    const auto deadline = std::chrono::steady_clock::now() + options.connectTimeout;
    std::mt19937_64 rng(std::random_device{}());
    milliseconds backoff = kFirstBackoff;
    for (;;) {
      auto state = channel->GetState(/*try_to_connect=*/true);
      // Let this attempt resolve: IDLE and CONNECTING are on the way to READY or a failure.
      while (state == GRPC_CHANNEL_IDLE || state == GRPC_CHANNEL_CONNECTING) {
        const auto attemptEnd = std::min(deadline, std::chrono::steady_clock::now() + kMaxBackoff);
        const auto wallEnd = std::chrono::system_clock::now() +
                             (attemptEnd - std::chrono::steady_clock::now());
        if (!channel->WaitForStateChange(state, wallEnd)) break;
        state = channel->GetState(/*try_to_connect=*/true);
      }
      if (state == GRPC_CHANNEL_READY) return;
      const auto left = deadline - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) {
        throw ConnectionError("cannot connect to the store at " + options.address + " within " +
                              std::to_string(options.connectTimeout.count()) + " ms");
      }
      std::uniform_real_distribution<double> jitter(0.5, 1.5);
      const auto sleep = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
          backoff * jitter(rng));
      std::this_thread::sleep_for(std::min(sleep, left));
      backoff = std::min(backoff * 2, kMaxBackoff);
    }
  }
};

StoreClient::StoreClient(StoreClientOptions options) : impl_(std::make_unique<Impl>(std::move(options))) {}
StoreClient::~StoreClient() = default;
StoreClient::StoreClient(StoreClient&&) noexcept = default;
StoreClient& StoreClient::operator=(StoreClient&&) noexcept = default;

const StoreClientOptions& StoreClient::options() const { return impl_->options; }

void StoreClient::set(const std::string& key, const std::string& value) {
  validateStoreKey(key);
  validateStoreValue(key, value);
  v1::SetRequest request;
  impl_->fillScope(request.mutable_scope());
  request.set_key(key);
  request.set_value(value);
  v1::SetResponse response;
  grpc::ClientContext context;
  impl_->prepare(context, impl_->options.timeout);
  impl_->check(impl_->stub->Set(&context, request, &response), "set of '" + key + "'");
}

std::string StoreClient::get(const std::string& key) {
  validateStoreKey(key);
  v1::GetRequest request;
  impl_->fillScope(request.mutable_scope());
  request.set_key(key);
  request.set_timeout_ms(toTimeoutMs(impl_->options.timeout));
  v1::GetResponse response;
  grpc::ClientContext context;
  impl_->prepare(context, impl_->options.timeout);
  impl_->check(impl_->stub->Get(&context, request, &response), "get of '" + key + "'");
  return std::move(*response.mutable_value());
}

int64_t StoreClient::add(const std::string& key, int64_t delta) {
  validateStoreKey(key);
  v1::AddRequest request;
  impl_->fillScope(request.mutable_scope());
  request.set_key(key);
  request.set_delta(delta);
  v1::AddResponse response;
  grpc::ClientContext context;
  impl_->prepare(context, impl_->options.timeout);
  impl_->check(impl_->stub->Add(&context, request, &response), "add to '" + key + "'");
  return response.value();
}

std::string StoreClient::compareSet(const std::string& key, const std::string& expected,
                                    const std::string& desired) {
  validateStoreKey(key);
  validateStoreValue(key, expected);
  validateStoreValue(key, desired);
  v1::CompareSetRequest request;
  impl_->fillScope(request.mutable_scope());
  request.set_key(key);
  request.set_expected(expected);
  request.set_desired(desired);
  v1::CompareSetResponse response;
  grpc::ClientContext context;
  impl_->prepare(context, impl_->options.timeout);
  impl_->check(impl_->stub->CompareSet(&context, request, &response),
               "compare_set of '" + key + "'");
  return std::move(*response.mutable_value());
}

void StoreClient::wait(const std::vector<std::string>& keys) { wait(keys, impl_->options.timeout); }

void StoreClient::wait(const std::vector<std::string>& keys, milliseconds timeout) {
  for (const auto& key : keys) validateStoreKey(key);
  v1::WaitRequest request;
  impl_->fillScope(request.mutable_scope());
  for (const auto& key : keys) request.add_keys(key);
  request.set_timeout_ms(toTimeoutMs(timeout));
  v1::WaitResponse response;
  grpc::ClientContext context;
  impl_->prepare(context, timeout);
  impl_->check(impl_->stub->Wait(&context, request, &response), "wait for " + quoteKeys(keys));
}

bool StoreClient::check(const std::vector<std::string>& keys) {
  for (const auto& key : keys) validateStoreKey(key);
  v1::CheckRequest request;
  impl_->fillScope(request.mutable_scope());
  for (const auto& key : keys) request.add_keys(key);
  v1::CheckResponse response;
  grpc::ClientContext context;
  impl_->prepare(context, impl_->options.timeout);
  impl_->check(impl_->stub->Check(&context, request, &response), "check of " + quoteKeys(keys));
  return response.all_present();
}

bool StoreClient::deleteKey(const std::string& key) {
  validateStoreKey(key);
  v1::DeleteRequest request;
  impl_->fillScope(request.mutable_scope());
  request.set_key(key);
  v1::DeleteResponse response;
  grpc::ClientContext context;
  impl_->prepare(context, impl_->options.timeout);
  impl_->check(impl_->stub->Delete(&context, request, &response), "delete of '" + key + "'");
  return response.deleted();
}

int64_t StoreClient::numKeys() {
  v1::NumKeysRequest request;
  impl_->fillScope(request.mutable_scope());
  v1::NumKeysResponse response;
  grpc::ClientContext context;
  impl_->prepare(context, impl_->options.timeout);
  impl_->check(impl_->stub->NumKeys(&context, request, &response), "num_keys");
  return response.count();
}

}  // namespace ddprun
