// A worker's timeline: GRADSWITCH_TIMELINE=path.json makes every Group write a Chrome trace
// (chrome://tracing, ui.perfetto.dev; the Trace Event Format's JSON object form) of its operations:
// per allreduce the time it waited in the queue, when its first packet left, when its first and
// last results came back, and its retransmissions. The Python side (gradswitch.timeline, the torch
// backend's buckets and overlap chunks) adds its own spans to the same file through the module.
//
// One file per rank, since several ranks usually share a machine (and a path): "{rank}" in the
// path is replaced by the rank, otherwise ".rank<r>" goes before the extension. `gradswitch
// timeline merge` joins the ranks' files into one trace. Timestamps are microseconds since the
// file was opened (steady clock); the wall clock at that instant is in otherData, which is how
// files of different processes and hosts are placed on one axis.
//
// Writes are buffered and flushed every few hundred milliseconds (and on Group::close and process
// exit) by rewriting the closing "]}", so the file is valid JSON after every flush: a process that
// dies keeps everything up to its last flush.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "common/json.h"  // json_escape, used with the timeline's writers

namespace gradswitch::worker {

// steady_clock nanoseconds: CLOCK_MONOTONIC, the clock of Python's time.monotonic_ns().
int64_t timeline_now_ns();

// `"key":value,...` members of a JSON object, built without a JSON library.
class JsonArgs {
 public:
  JsonArgs& num(const char* key, int64_t v);
  JsonArgs& num(const char* key, uint64_t v);
  JsonArgs& num(const char* key, double v);
  JsonArgs& str(const char* key, const std::string& v);
  const std::string& text() const { return s_; }

 private:
  void key(const char* k);
  std::string s_;
};

class Timeline {
 public:
  // The timeline of `rank` named by $GRADSWITCH_TIMELINE; null when it is unset. Every Group (and
  // Python caller) of one rank in a process shares it; it stays open until the process exits.
  // Throws Error when the file cannot be created.
  static std::shared_ptr<Timeline> for_rank(unsigned rank);
  // The file of `rank` for a GRADSWITCH_TIMELINE value.
  static std::string path_for(const std::string& pattern, unsigned rank);

  Timeline(const std::string& path, unsigned rank);  // throws Error
  ~Timeline();
  Timeline(const Timeline&) = delete;
  Timeline& operator=(const Timeline&) = delete;

  // A span on the row `lane` of this rank ("allreduce: job 'x'", "torch: collectives"); `args` are
  // JsonArgs members. Spans of a lane must nest unless they are async: spans with an `async_id`
  // (from new_async_id()) may overlap others (allreduces in flight together, torch's buckets), and
  // the spans and instants of one id nest in their own track (an allreduce's phases).
  // Thread-safe.
  void span(const std::string& lane, const std::string& name, int64_t begin_ns, int64_t end_ns,
            const std::string& args = "", int64_t async_id = -1);
  void instant(const std::string& lane, const std::string& name, int64_t at_ns, const std::string& args = "",
               int64_t async_id = -1);
  int64_t new_async_id() { return next_async_id_.fetch_add(1, std::memory_order_relaxed); }
  // Writes what is buffered (the file is then complete, valid JSON).
  void flush();
  const std::string& path() const { return path_; }

 private:
  int tid_of(const std::string& lane);  // mu_ held
  void append(const std::string& event);
  void flush_locked();

  std::mutex mu_;
  std::string path_;
  unsigned rank_;
  int fd_ = -1;
  uint64_t end_ = 0;  // file offset where the closing "\n]}\n" starts
  std::string buf_;
  int64_t origin_ns_;
  int64_t last_flush_ns_;
  std::map<std::string, int> lanes_;
  std::atomic<int64_t> next_async_id_{1};
};

}  // namespace gradswitch::worker
