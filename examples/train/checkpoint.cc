#include "examples/train/checkpoint.h"

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <stdexcept>

namespace train {

namespace {
constexpr char kMagic[8] = {'D', 'D', 'P', 'C', 'K', 'P', 'T', '1'};
}  // namespace

void saveCheckpoint(const std::string& path, const Checkpoint& checkpoint) {
  const std::string temp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    const int32_t epochs = checkpoint.epochsDone;
    const uint64_t count = checkpoint.params.size();
    out.write(kMagic, sizeof kMagic);
    out.write(reinterpret_cast<const char*>(&epochs), sizeof epochs);
    out.write(reinterpret_cast<const char*>(&checkpoint.seed), sizeof checkpoint.seed);
    out.write(reinterpret_cast<const char*>(&count), sizeof count);
    out.write(reinterpret_cast<const char*>(checkpoint.params.data()),
              static_cast<std::streamsize>(count * sizeof(float)));
    out.flush();
    if (!out) throw std::runtime_error("cannot write checkpoint " + temp);
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    std::remove(temp.c_str());
    throw std::runtime_error("cannot rename checkpoint " + temp + " to " + path);
  }
}

std::optional<Checkpoint> loadCheckpoint(const std::string& path, std::size_t paramCount) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    if (::access(path.c_str(), F_OK) != 0) return std::nullopt;
    throw std::runtime_error("cannot read checkpoint " + path);
  }
  char magic[sizeof kMagic];
  int32_t epochs = 0;
  uint64_t seed = 0;
  uint64_t count = 0;
  in.read(magic, sizeof magic);
  in.read(reinterpret_cast<char*>(&epochs), sizeof epochs);
  in.read(reinterpret_cast<char*>(&seed), sizeof seed);
  in.read(reinterpret_cast<char*>(&count), sizeof count);
  if (!in || !std::equal(magic, magic + sizeof magic, kMagic) || count != paramCount || epochs < 0) {
    throw std::runtime_error(path + " is not a checkpoint of this model (" + std::to_string(paramCount) +
                             " parameters)");
  }
  Checkpoint c;
  c.epochsDone = epochs;
  c.seed = seed;
  c.params.resize(count);
  in.read(reinterpret_cast<char*>(c.params.data()), static_cast<std::streamsize>(count * sizeof(float)));
  if (!in) throw std::runtime_error("checkpoint " + path + " is truncated");
  return c;
}

}  // namespace train
