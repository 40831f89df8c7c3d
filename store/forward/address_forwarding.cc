#include "store/forward/address_forwarding.h"

#include <spdlog/spdlog.h>

#include <memory>
#include <utility>

#include "ddprun/v1/store.pb.h"
#include "store/core/store_status.h"
#include "store/forward/forwarding_sink.h"

namespace ddprun {

namespace {

class UnavailableSink final : public StoreRequestSink {
 public:
  UnavailableSink(Respond respond, std::string why) : respond_(std::move(respond)), why_(std::move(why)) {}
  void handle(v1::StoreRequest& request) override {
    v1::StoreResponse response;
    response.set_id(request.id());
    response.mutable_status()->set_code(static_cast<int32_t>(StoreCode::kUnavailable));
    response.mutable_status()->set_message(why_);
    respond_(std::move(response));
  }
  void end() override {}

 private:
  Respond respond_;
  std::string why_;
};

}  // namespace

StoreRequestSink::Factory unavailableSinks(std::string why) {
  return [why = std::move(why)](StoreRequestSink::Respond respond) -> std::shared_ptr<StoreRequestSink> {
    return std::make_shared<UnavailableSink>(std::move(respond), why);
  };
}

SinksForAddress forwardingByAddress(StoreClientOptions client) {
  struct State {
    StoreClientOptions client;
    std::string address;
    std::shared_ptr<StoreForwarder> forwarder;
  };
  auto state = std::make_shared<State>();
  state->client = std::move(client);
  return [state](const std::string& address) -> StoreRequestSink::Factory {
    if (!state->forwarder || state->address != address) {
      if (state->forwarder) state->forwarder->stop();
      state->forwarder.reset();
      state->address = address;
      StoreForwarderOptions options;
      options.client = state->client;
      options.client.address = address;
      try {
        state->forwarder = std::make_shared<StoreForwarder>(std::move(options));
      } catch (const std::exception& e) {
        const std::string why = "torch's store cannot reach the job's store at " + address + ": " + e.what();
        spdlog::error("{}", why);
        state->address.clear();  // tried again at the next round
        return unavailableSinks(why);
      }
    }
    return state->forwarder->factory();
  };
}

}  // namespace ddprun
