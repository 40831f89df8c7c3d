// A store client for the chaos suite's history check (tests/chaos/test_store_history.py). It runs
// with a worker's environment (the test copies it from a live worker of a job, so the round stays
// current while clients crash and restart), and the test SIGKILLs it at random moments.
//
//   store_history_client run ID LOG OPS   cycles through set, add, compare_set; after each call is
//                                          acknowledged, appends one line to LOG with one write(2)
//                                          (so a SIGKILL loses no line of an acknowledged call):
//                                            set KEY VALUE | add DELTA | cas KEY RESULT
//   store_history_client get               reads keys from stdin, prints "KEY<TAB>VALUE" or
//                                          "KEY<TAB>MISSING" for each
#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <iostream>
#include <string>

#include "worker_sdk/ddp.h"

namespace {

void logLine(int fd, const std::string& line) {
  const std::string text = line + "\n";
  if (::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    std::perror("store_history_client: log");
    std::exit(1);
  }
}

int run(ddp::Store& store, const std::string& id, const std::string& logPath, long ops) {
  const int log = ::open(logPath.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (log < 0) {
    std::perror("store_history_client: open log");
    return 1;
  }
  for (long i = 0; i < ops; ++i) {
    switch (i % 3) {
      case 0: {
        const std::string key = "set/" + id + "/" + std::to_string(i);
        const std::string value = id + ":" + std::to_string(i);
        store.set(key, value);
        logLine(log, "set " + key + " " + value);
        break;
      }
      case 1:
        store.add("counter", 1);
        logLine(log, "add 1");
        break;
      default: {
        // Every client contests the same keys in the same order: one winner each.
        const std::string key = "cas/" + std::to_string(i / 3);
        const std::string result = store.compareSet(key, "", id);
        logLine(log, "cas " + key + " " + result);
        break;
      }
    }
  }
  ::close(log);
  return 0;
}

int get(ddp::Store& store) {
  std::string key;
  while (std::getline(std::cin, key)) {
    if (key.empty()) continue;
    std::cout << key << "\t" << (store.check({key}) ? store.get(key) : std::string("MISSING")) << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    const std::string mode = argc > 1 ? argv[1] : "";
    if (mode != "get" && !(mode == "run" && argc == 5)) {
      std::fprintf(stderr, "usage: store_history_client run ID LOG OPS | get\n");
      return 2;
    }
    auto store = ddp::makeStore(ddp::Env::fromEnviron(), std::chrono::seconds(30));
    if (mode == "get") return get(*store);
    return run(*store, argv[2], argv[3], std::atol(argv[4]));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "store_history_client: %s\n", e.what());
    return 1;
  }
}
