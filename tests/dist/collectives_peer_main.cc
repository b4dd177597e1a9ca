// A member of a gloo group in a process of its own, for gloo_process_test.cc:
//   dist_collectives_peer script STORE RANK SIZE TIMEOUT_MS OUTPUT_FILE
//     runs collectives_script.h and writes its transcript to OUTPUT_FILE; exit 0 on success
//   dist_collectives_peer join-and-wait STORE RANK SIZE TIMEOUT_MS
//     joins, then waits for a message from rank 0 that never comes (the test kills or stops
//     this process meanwhile)
// Errors are printed to stderr with exit status 1.
#include <cstdio>
#include <fstream>
#include <string>

#include "collectives_script.h"
#include "folio/dist/gloo_collectives.h"

int main(int argc, char** argv) {
  using namespace folio;
  if (argc < 6) {
    std::fprintf(stderr, "usage: %s script|join-and-wait STORE RANK SIZE TIMEOUT_MS [OUTPUT]\n",
                 argv[0]);
    return 2;
  }
  const std::string mode = argv[1];
  const dist::GlooGroupOptions options{.rank = std::stoi(argv[3]),
                                       .size = std::stoi(argv[4]),
                                       .store_directory = argv[2],
                                       .store_address = {},
                                       .group_id = "processes",
                                       .epoch = 0,
                                       .host = "127.0.0.1",
                                       .timeout = std::chrono::milliseconds(std::stoi(argv[5]))};
  auto member = dist::connect_gloo_group(options);
  if (!member.ok()) {
    std::fprintf(stderr, "%s\n", member.status().to_string().c_str());
    return 1;
  }
  if (mode == "join-and-wait") {
    std::byte byte{};
    const Status status = (*member)->recv(std::span(&byte, 1), 0);
    std::fprintf(stderr, "%s\n", status.to_string().c_str());
    return 1;
  }
  if (mode != "script" || argc < 7) {
    std::fprintf(stderr, "unknown mode '%s' or no output file\n", mode.c_str());
    return 2;
  }
  std::vector<std::byte> transcript;
  const Status status = dist::testing::run_script(**member, transcript);
  if (!status.ok()) {
    std::fprintf(stderr, "%s\n", status.to_string().c_str());
    return 1;
  }
  std::ofstream output(argv[6], std::ios::binary);
  output.write(reinterpret_cast<const char*>(transcript.data()),
               static_cast<std::streamsize>(transcript.size()));
  return output.good() ? 0 : 1;
}
