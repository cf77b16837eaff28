// A stand-in for the caller's all-gather (a process group's, MPI's) between the processes of one test, host or GPU
// tier: through files in a directory every process sees.
#pragma once
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace megamoe::test {

// The caller's all-gather, as the tests carry it out between fork()ed ranks: each rank publishes its bytes as the file
// dir/STAGE.RANK (written, then renamed into place) and returns every rank's, in rank order, once all are there
// (at most `boundS` seconds). Also serves as a barrier.
inline std::vector<uint8_t> allGatherThroughFiles(const std::string& dir, const std::string& stage, int rank,
                                                  int nranks, const std::vector<uint8_t>& mine, double boundS = 20) {
  auto name = [&](int r) { return dir + "/" + stage + "." + std::to_string(r); };
  {
    const std::string temp = name(rank) + ".tmp";
    FILE* f = std::fopen(temp.c_str(), "wb");
    if (!f || std::fwrite(mine.data(), 1, mine.size(), f) != mine.size() || std::fclose(f) != 0)
      throw std::runtime_error("cannot write " + temp);
    std::filesystem::rename(temp, name(rank));
  }
  std::vector<uint8_t> all;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(boundS);
  for (int r = 0; r < nranks; ++r) {
    while (!std::filesystem::exists(name(r))) {
      if (std::chrono::steady_clock::now() > deadline)
        throw std::runtime_error("rank " + std::to_string(r) + " never published " + stage);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    FILE* f = std::fopen(name(r).c_str(), "rb");
    if (!f) throw std::runtime_error("cannot read " + name(r));
    std::vector<uint8_t> bytes(std::filesystem::file_size(name(r)));
    const size_t n = std::fread(bytes.data(), 1, bytes.size(), f);
    std::fclose(f);
    if (n != bytes.size()) throw std::runtime_error("short read of " + name(r));
    all.insert(all.end(), bytes.begin(), bytes.end());
  }
  return all;
}

}  // namespace megamoe::test
