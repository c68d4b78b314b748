// The timeline file (see timeline.h): a Chrome trace kept valid JSON after every flush.
#include "worker/timeline.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "common/clock.h"
#include "worker/errors.h"

namespace gradswitch::worker {

namespace {

constexpr size_t kFlushBytes = 256 << 10;
constexpr int64_t kFlushEveryNs = 500'000'000;
constexpr const char* kTrailer = "\n]}\n";

// Every rank's timeline of this process, by path. Never destroyed: Group threads may still write
// while the process exits; an atexit handler flushes instead.
struct Registry {
  std::mutex mu;
  std::map<std::string, std::shared_ptr<Timeline>> files;
};
Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry;
    std::atexit([] {
      Registry& g = registry();
      std::lock_guard<std::mutex> lk(g.mu);
      for (auto& [path, t] : g.files) t->flush();
    });
    return reg;
  }();
  return *r;
}

void write_all(int fd, const std::string& s, uint64_t at) {
  size_t done = 0;
  while (done < s.size()) {
    ssize_t n = ::pwrite(fd, s.data() + done, s.size() - done, static_cast<off_t>(at + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // a full disk loses the timeline, never the training run
    done += static_cast<size_t>(n);
  }
}

std::string micros(int64_t ns) {
  char b[40];
  std::snprintf(b, sizeof b, "%.3f", static_cast<double>(ns) / 1000.0);
  return b;
}

}  // namespace

int64_t timeline_now_ns() {
  return steady_now_ns();
}

void JsonArgs::key(const char* k) {
  if (!s_.empty()) s_ += ',';
  s_ += '"';
  s_ += k;
  s_ += "\":";
}
JsonArgs& JsonArgs::num(const char* k, int64_t v) {
  key(k);
  s_ += std::to_string(v);
  return *this;
}
JsonArgs& JsonArgs::num(const char* k, uint64_t v) {
  key(k);
  s_ += std::to_string(v);
  return *this;
}
JsonArgs& JsonArgs::num(const char* k, double v) {
  key(k);
  char b[32];
  std::snprintf(b, sizeof b, "%.6g", v);
  s_ += b;
  return *this;
}
JsonArgs& JsonArgs::str(const char* k, const std::string& v) {
  key(k);
  s_ += '"' + json_escape(v) + '"';
  return *this;
}

std::string Timeline::path_for(const std::string& pattern, unsigned rank) {
  const std::string r = std::to_string(rank);
  const size_t at = pattern.find("{rank}");
  if (at != std::string::npos) return pattern.substr(0, at) + r + pattern.substr(at + 6);
  const size_t slash = pattern.rfind('/');
  const size_t dot = pattern.rfind('.');
  if (dot == std::string::npos || (slash != std::string::npos && dot < slash) || dot == slash + 1)
    return pattern + ".rank" + r;
  return pattern.substr(0, dot) + ".rank" + r + pattern.substr(dot);
}

std::shared_ptr<Timeline> Timeline::for_rank(unsigned rank) {
  const char* env = std::getenv("GRADSWITCH_TIMELINE");
  if (!env || !*env) return nullptr;
  const std::string path = path_for(env, rank);
  Registry& g = registry();
  std::lock_guard<std::mutex> lk(g.mu);
  auto it = g.files.find(path);
  if (it != g.files.end()) return it->second;
  auto t = std::make_shared<Timeline>(path, rank);
  g.files.emplace(path, t);
  return t;
}

Timeline::Timeline(const std::string& path, unsigned rank)
    : path_(path), rank_(rank), origin_ns_(timeline_now_ns()), last_flush_ns_(origin_ns_) {
  fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw Error("gradswitch: GRADSWITCH_TIMELINE: cannot create '" + path + "': " + std::strerror(errno));
  const int64_t wall = wall_now_ns();
  char host[256] = "";
  ::gethostname(host, sizeof host - 1);
  JsonArgs other;
  other.num("gradswitch_timeline", int64_t{1})
      .num("rank", uint64_t{rank})
      .str("host", host)
      .num("pid", int64_t{::getpid()})
      .num("wall_clock_ns", wall);
  std::string head =
      "{\"otherData\":{" + other.text() + "},\"displayTimeUnit\":\"ms\",\"traceEvents\":[\n" +
      "{\"ph\":\"M\",\"pid\":" + std::to_string(rank) +
      ",\"tid\":0,\"name\":\"process_name\",\"args\":{\"name\":\"rank " + std::to_string(rank) + " (" +
      json_escape(host) + ", pid " + std::to_string(::getpid()) + ")\"}},\n" +
      "{\"ph\":\"M\",\"pid\":" + std::to_string(rank) +
      ",\"tid\":0,\"name\":\"process_sort_index\",\"args\":{\"sort_index\":" + std::to_string(rank) + "}}";
  write_all(fd_, head + kTrailer, 0);
  end_ = head.size();
}

Timeline::~Timeline() {
  flush();
  if (fd_ >= 0) ::close(fd_);
}

int Timeline::tid_of(const std::string& lane) {
  auto it = lanes_.find(lane);
  if (it != lanes_.end()) return it->second;
  const int tid = static_cast<int>(lanes_.size()) + 1;
  lanes_.emplace(lane, tid);
  const std::string head =
      "{\"ph\":\"M\",\"pid\":" + std::to_string(rank_) + ",\"tid\":" + std::to_string(tid);
  buf_ += ",\n" + head + ",\"name\":\"thread_name\",\"args\":{\"name\":\"" + json_escape(lane) + "\"}}";
  buf_ +=
      ",\n" + head + ",\"name\":\"thread_sort_index\",\"args\":{\"sort_index\":" + std::to_string(tid) + "}}";
  return tid;
}

void Timeline::span(const std::string& lane, const std::string& name, int64_t begin_ns, int64_t end_ns,
                    const std::string& args, int64_t async_id) {
  std::lock_guard<std::mutex> lk(mu_);
  const std::string head = "{\"pid\":" + std::to_string(rank_) + ",\"tid\":" + std::to_string(tid_of(lane)) +
                           ",\"cat\":\"gradswitch\",\"name\":\"" + json_escape(name) + "\",\"ts\":";
  if (async_id < 0) {
    append(head + micros(begin_ns - origin_ns_) + ",\"ph\":\"X\",\"dur\":" +
           micros(std::max<int64_t>(end_ns - begin_ns, 0)) + ",\"args\":{" + args + "}}");
    return;
  }
  const std::string id = ",\"id\":" + std::to_string(async_id);
  append(head + micros(begin_ns - origin_ns_) + ",\"ph\":\"b\"" + id + ",\"args\":{" + args + "}}");
  append(head + micros(std::max(end_ns, begin_ns) - origin_ns_) + ",\"ph\":\"e\"" + id + "}");
}

void Timeline::instant(const std::string& lane, const std::string& name, int64_t at_ns,
                       const std::string& args, int64_t async_id) {
  std::lock_guard<std::mutex> lk(mu_);
  const std::string head = "{\"pid\":" + std::to_string(rank_) + ",\"tid\":" + std::to_string(tid_of(lane)) +
                           ",\"cat\":\"gradswitch\",\"name\":\"" + json_escape(name) +
                           "\",\"ts\":" + micros(at_ns - origin_ns_);
  if (async_id < 0)
    append(head + ",\"ph\":\"i\",\"s\":\"t\",\"args\":{" + args + "}}");
  else
    append(head + ",\"ph\":\"n\",\"id\":" + std::to_string(async_id) + ",\"args\":{" + args + "}}");
}

void Timeline::append(const std::string& event) {
  buf_ += ",\n";
  buf_ += event;
  const int64_t now = timeline_now_ns();
  if (buf_.size() >= kFlushBytes || now - last_flush_ns_ >= kFlushEveryNs) flush_locked();
}

void Timeline::flush() {
  std::lock_guard<std::mutex> lk(mu_);
  flush_locked();
}

void Timeline::flush_locked() {
  last_flush_ns_ = timeline_now_ns();
  if (buf_.empty() || fd_ < 0) return;
  write_all(fd_, buf_ + kTrailer, end_);
  end_ += buf_.size();
  buf_.clear();
}

}  // namespace gradswitch::worker
