// The metrics endpoint's pieces: the Prometheus text writer and the HTTP server (a real socket on
// loopback, a port chosen by the kernel).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "harness.h"
#include "switch/metrics/exposition.h"
#include "switch/metrics/http_server.h"

using namespace gradswitch::metrics;

// CHECK for strings: both texts are printed when they differ.
static void check_text(const std::string& got, const std::string& want, int line) {
  if (got == want) return;
  std::fprintf(stderr, "  line %d: got\n%s\n  want\n%s\n", line, got.c_str(), want.c_str());
  ++gs_test::failures();
}
#define CHECK_TEXT(got, want) check_text(got, want, __LINE__)

TEST(exposition_writes_families_labels_and_histograms) {
  Exposition e;
  e.family("gradswitch_packets_received_total", Exposition::Type::kCounter, "Datagrams received.");
  e.sample({}, uint64_t{42});
  e.family("gradswitch_job_idle_seconds", Exposition::Type::kGauge, "Time since\nthe last packet.");
  e.sample({{"job", "a\"b\\c\nd"}, {"job_id", "7"}}, 1.5);
  e.family("gradswitch_round_duration_seconds", Exposition::Type::kHistogram, "Rounds.");
  e.histogram({{"job", "x"}}, {0.001, 0.01}, {3, 0, 2}, 0.25);
  const std::string want =
      "# HELP gradswitch_packets_received_total Datagrams received.\n"
      "# TYPE gradswitch_packets_received_total counter\n"
      "gradswitch_packets_received_total 42\n"
      "# HELP gradswitch_job_idle_seconds Time since the last packet.\n"
      "# TYPE gradswitch_job_idle_seconds gauge\n"
      "gradswitch_job_idle_seconds{job=\"a\\\"b\\\\c\\nd\",job_id=\"7\"} 1.5\n"
      "# HELP gradswitch_round_duration_seconds Rounds.\n"
      "# TYPE gradswitch_round_duration_seconds histogram\n"
      "gradswitch_round_duration_seconds_bucket{job=\"x\",le=\"0.001\"} 3\n"
      "gradswitch_round_duration_seconds_bucket{job=\"x\",le=\"0.01\"} 3\n"
      "gradswitch_round_duration_seconds_bucket{job=\"x\",le=\"+Inf\"} 5\n"
      "gradswitch_round_duration_seconds_sum{job=\"x\"} 0.25\n"
      "gradswitch_round_duration_seconds_count{job=\"x\"} 5\n";
  CHECK_TEXT(e.text(), want);
}

TEST(values_print_short_and_exact) {
  CHECK_TEXT(format_value(2.5e-6), std::string("2.5e-06"));
  CHECK_TEXT(format_value(0.1), std::string("0.1"));
  CHECK_TEXT(format_value(3.0), std::string("3"));
  CHECK_TEXT(format_value(1.0 / 0.0), std::string("+Inf"));
}

TEST(http_answers_metrics_and_refuses_the_rest) {
  auto render = [](const std::string&) -> std::optional<std::string> { return std::string("m 1\n"); };
  HttpReply r = answer_http("GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n", render);
  CHECK(r.scrape);
  CHECK(r.bytes.rfind("HTTP/1.1 200 OK\r\n", 0) == 0);
  CHECK(r.bytes.find("Content-Type: text/plain; version=0.0.4") != std::string::npos);
  CHECK(r.bytes.find("Content-Length: 4\r\n") != std::string::npos);
  CHECK(r.bytes.size() > 4 && r.bytes.compare(r.bytes.size() - 4, 4, "m 1\n") == 0);
  CHECK(answer_http("GET /metrics?x=1 HTTP/1.0\r\n\r\n", render).scrape);
  HttpReply head = answer_http("HEAD /metrics HTTP/1.1\r\n\r\n", render);
  CHECK(!head.scrape && head.bytes.find("m 1") == std::string::npos);
  CHECK(answer_http("GET /other HTTP/1.1\r\n\r\n", render).bytes.rfind("HTTP/1.1 404", 0) == 0);
  CHECK(answer_http("POST /metrics HTTP/1.1\r\n\r\n", render).bytes.rfind("HTTP/1.1 405", 0) == 0);
  CHECK(answer_http("garbage\r\n\r\n", render).bytes.rfind("HTTP/1.1 400", 0) == 0);
  CHECK(answer_http("\r\n\r\n", render).bytes.rfind("HTTP/1.1 400", 0) == 0);
}

TEST(http_passes_the_bearer_token_and_a_refusal_is_a_401_without_data) {
  std::string seen = "unset";
  auto render = [&](const std::string& bearer) -> std::optional<std::string> {
    seen = bearer;
    if (bearer != "t0ken") return std::nullopt;
    return std::string("gradswitch_secret_series 1\n");
  };
  HttpReply ok =
      answer_http("GET /metrics HTTP/1.1\r\nHost: x\r\nauthorization:  bearer t0ken \r\n\r\n", render);
  CHECK(ok.scrape && !ok.refused && seen == "t0ken");
  CHECK(ok.bytes.find("gradswitch_secret_series 1") != std::string::npos);
  // none, another scheme, a wrong token: 401, the scheme to use, and nothing of the metrics
  for (const char* header : {"", "Authorization: Basic dTpw\r\n", "Authorization: Bearer t0kem\r\n"}) {
    HttpReply r = answer_http(std::string("GET /metrics HTTP/1.1\r\nHost: x\r\n") + header + "\r\n", render);
    CHECK(r.refused && !r.scrape);
    CHECK(r.bytes.rfind("HTTP/1.1 401 Unauthorized\r\n", 0) == 0);
    CHECK(r.bytes.find("\r\nWWW-Authenticate: Bearer realm=\"gradswitch\"") != std::string::npos);
    CHECK((r.bytes.find("error=\"invalid_token\"") != std::string::npos) == (header[0] != 0));
    CHECK(r.bytes.find("gradswitch_secret_series") == std::string::npos);
  }
  CHECK(answer_http("HEAD /metrics HTTP/1.1\r\n\r\n", render).refused);
  CHECK(bearer_credential("GET / HTTP/1.1\r\nX-Authorization: Bearer a\r\n\r\n").bearer.empty());
  CHECK(bearer_credential("GET / HTTP/1.1\r\nAuthorization: Bearer a\r\nAuthorization: Bearer b\r\n\r\n")
            .bearer == "a");
}

// Sends `request` (in two pieces, 50 ms apart, when `split` is set) and reads the whole reply.
static std::string fetch(uint16_t port, const std::string& request, size_t split = 0) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return "";
  }
  if (split) {
    (void)!::send(fd, request.data(), split, 0);
    ::usleep(50'000);
  }
  (void)!::send(fd, request.data() + split, request.size() - split, 0);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

TEST(http_server_serves_scrapes_on_a_socket) {
  int renders = 0;
  HttpServer server("127.0.0.1", 0, [&](const std::string&) -> std::optional<std::string> {
    return "gradswitch_up " + std::to_string(++renders) + "\n";
  });
  std::string error;
  CHECK(server.start(&error));
  CHECK(server.port() != 0);
  CHECK(server.url() == "http://127.0.0.1:" + std::to_string(server.port()) + "/metrics");
  std::string a = fetch(server.port(), "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
  std::string b = fetch(server.port(), "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n");
  CHECK(a.find("\r\n\r\ngradswitch_up 1\n") != std::string::npos);
  CHECK(b.find("\r\n\r\ngradswitch_up 2\n") != std::string::npos);
  // a request that arrives in pieces; one whose headers do not end within the size limit
  CHECK(fetch(server.port(), "GET / HTTP/1.1\r\nHost: t\r\n\r\n", 7).rfind("HTTP/1.1 200 OK", 0) == 0);
  std::string big(10000, 'a');
  CHECK(fetch(server.port(), "GET /metrics HTTP/1.1\r\nX: " + big).rfind("HTTP/1.1 431", 0) == 0);
  CHECK(server.scrapes() == 2);
  // the port is taken while it runs
  HttpServer clash("127.0.0.1", server.port(),
                   [](const std::string&) { return std::optional<std::string>(); });
  CHECK(!clash.start(&error));
  CHECK(error.find("--metrics-port") != std::string::npos);
  server.stop();
  server.stop();
}

static int connect_to(uint16_t port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(port);
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

TEST(idle_connections_do_not_keep_a_scrape_out) {
  // Before, 64 idle connections took every place and the listening socket was not even read until
  // they timed out: a scrape behind them waited or failed.
  HttpServer server("127.0.0.1", 0, [](const std::string&) -> std::optional<std::string> {
    return std::string("gradswitch_up 1\n");
  });
  std::string error;
  CHECK(server.start(&error));
  std::vector<int> idle;
  for (int i = 0; i < 200; ++i) {
    int fd = connect_to(server.port());
    if (fd >= 0) idle.push_back(fd);
    if (i % 2) (void)!::send(fd, "GET /metrics HTTP/1.1\r\n", 23, 0);  // half a request
  }
  for (int i = 0; i < 7; ++i)
    CHECK(fetch(server.port(), "GET /metrics HTTP/1.1\r\nHost: t\r\n\r\n").find("gradswitch_up 1") !=
          std::string::npos);
  CHECK(server.scrapes() == 7);
  CHECK(server.evicted() > 0);
  for (int fd : idle) ::close(fd);
  server.stop();
}

GS_TEST_MAIN()
