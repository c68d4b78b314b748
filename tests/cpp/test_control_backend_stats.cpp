// The backend stats interface (backend.h) as the UDP backend fills it: names, kinds, labels,
// values that follow the traffic, and the STATS text the control plane appends.
#include <arpa/inet.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <set>
#include <thread>

#include "harness.h"
#include "switch/config.h"
#include "switch/engine/engine.h"
#include "switch/io/udp/udp_backend.h"

using namespace gradswitch;

namespace {

const BackendStat* find(const std::vector<BackendStat>& stats, const std::string& name, int label = -1) {
  for (const BackendStat& s : stats)
    if (name == s.name && (label < 0 || (s.label && s.label_value == unsigned(label)))) return &s;
  return nullptr;
}

}  // namespace

TEST(udp_backend_stats_count_datagrams_per_thread_and_cpu) {
  SwitchConfig config;
  config.control_host = "127.0.0.1";
  config.threads = 2;
  config.drop_rate = 1.0;  // every datagram is an injected drop: counted by the backend, not the engine
  Engine engine(EngineConfig{config.threads, 4});
  std::unique_ptr<Backend> backend;
  std::string error;
  // A free pair of ports: try a few in the dynamic range.
  for (unsigned port = 40000 + unsigned(getpid()) % 20000, tries = 0; !backend && tries < 50;
       port += 2, ++tries) {
    config.data_port = static_cast<uint16_t>(port);
    backend = make_udp_backend(engine, config, &error);
  }
  CHECK(backend != nullptr);
  if (!backend) return;
  CHECK(std::string(backend->name()) == "udp");

  std::atomic<bool> stop{false};
  std::thread runner([&] { backend->run(stop); });
  int fd = ::socket(AF_INET, SOCK_DGRAM, 0);
  sockaddr_in to{};
  to.sin_family = AF_INET;
  to.sin_port = htons(config.data_port + 1);  // thread 1
  inet_pton(AF_INET, "127.0.0.1", &to.sin_addr);
  const char junk[40] = {};
  for (int i = 0; i < 5; ++i) ::sendto(fd, junk, sizeof junk, 0, reinterpret_cast<sockaddr*>(&to), sizeof to);
  ::close(fd);
  std::vector<BackendStat> stats;
  for (int i = 0; i < 400; ++i) {  // bounded wait for the data thread (2 s)
    stats = backend->stats();
    const BackendStat* drops = find(stats, "injected_drops");
    if (drops && drops->value == 5) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  stop.store(true);
  runner.join();
  stats = backend->stats();

  const BackendStat* drops = find(stats, "injected_drops");
  CHECK(drops && drops->value == 5 && drops->kind == BackendStat::Kind::kCounter && !drops->label);
  const BackendStat* rx0 = find(stats, "rx_datagrams", 0);
  const BackendStat* rx1 = find(stats, "rx_datagrams", 1);
  CHECK(rx0 && rx0->value == 0 && std::string(rx0->label) == "thread");
  CHECK(rx1 && rx1->value == 5);
  const BackendStat* cpu1 = find(stats, "cpu_ns", 1);
  CHECK(cpu1 && cpu1->value > 0);  // the thread ran, and its CPU time survives its end
  // Every name is unique per label value, and every stat has help text.
  std::set<std::string> keys;
  for (const BackendStat& s : stats) {
    CHECK(s.help && std::strlen(s.help) > 10);
    CHECK(keys.insert(std::string(s.name) + "/" + (s.label ? std::to_string(s.label_value) : "-")).second);
  }
  const std::string text = format_backend_stats(*backend);
  CHECK(text.find("udp.injected_drops=5") != std::string::npos);
  CHECK(text.find("udp.thread1.rx_datagrams=5") != std::string::npos);
  CHECK(text.find("udp.thread0.rx_datagrams=0") != std::string::npos);
}

GS_TEST_MAIN()
