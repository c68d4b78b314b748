// The datagrams the UDP backend sends after one receive burst, grouped by destination so that each
// destination gets one UDP GSO write (up to 64 datagrams of one size) per burst, however the engine
// interleaved them. Under loss a burst's multicast RESULTs alternate with HELD answers and unicast
// RESULTs to single ranks; groups that ended at every change of destination would cut the GSO writes
// to a few datagrams each, and where per-packet CPU bounds the rate each write costs a system call
// here and a wake-up at the worker (docs/transport.md, "The switch's result hold"). Datagrams of one
// type to one destination keep their order; otherwise the order is free (a multicast RESULT may pass
// a HELD of the same burst: protocol.md §3).
// No sockets here: it builds the sendmmsg messages; the backend sends them.
#pragma once

#include <netinet/in.h>
#include <sys/socket.h>

#include <cstddef>
#include <cstdint>
#include <vector>

#include "switch/engine/engine.h"

namespace gradswitch {

class ResultBatch {
 public:
  static constexpr size_t kMaxMsgs = 1024;         // UIO_MAXIOV: most messages per sendmmsg
  static constexpr uint32_t kMaxGsoSegments = 64;  // datagrams per GSO write
  static constexpr uint32_t kMaxGsoBytes = 60000;  // bytes per GSO write

  ResultBatch();

  // Copies a datagram to send (its bytes and destinations are valid only until the engine's next
  // ingest). `gso`: it may join an earlier group of this batch for the same destination. False
  // when the batch is full: send what it holds, clear(), and add it again.
  bool add(const IngestResult& r, bool gso);
  bool empty() const { return groups_.empty(); }
  size_t datagrams() const { return entries_.size(); }  // added since clear(), however many destinations

  // Builds the messages of everything added: per group and destination one GSO write (with `gso`
  // and more than one datagram) or one message per datagram, and hands them to
  // `send(mmsghdr* msgs, size_t n)` at most kMaxMsgs at a time; `send` reports what went out of
  // message i (an index into msgs) with sent(). The messages point into this batch.
  template <class Send>
  void write(bool gso, Send&& send);
  void sent(size_t i, uint64_t datagrams, uint64_t bytes);
  // The GSO segment size of message i (0: one datagram), for a sender that must split it.
  uint16_t segment(size_t i) const;

  // Per group: `f(job_id, datagrams, bytes)` of what went out (the engine's counters).
  template <class F>
  void for_each_sent(F&& f) const {
    for (const Group& g : groups_)
      if (g.sent_pkts) f(g.job_id, g.sent_pkts, g.sent_bytes);
  }
  void clear();

 private:
  static constexpr uint32_t kNone = UINT32_MAX;
  struct Group {
    uint32_t job_id;
    uint8_t type;    // GS_MSG_*: a leaf's DATA going up never shares a write with results
    bool open;       // more datagrams may join (all so far have `seg` bytes, fewer than the caps)
    uint64_t dests;  // destinations(): bit i for the job's endpoint i
    uint16_t n_eps;
    uint32_t ep_off;       // into eps_
    uint32_t first, last;  // datagrams (entries_), linked in order
    uint32_t seg, nseg, bytes;
    uint64_t sent_pkts, sent_bytes;
  };
  struct Entry {
    uint32_t off, len;  // in arena_
    uint32_t next;      // the group's next datagram, or kNone
  };
  bool same_destination(const Group& g, const IngestResult& r) const;
  // Appends message(s) of group `gi` to endpoint `ep`; false when the message or iovec pools are
  // full (nothing was appended).
  bool build(uint32_t gi, const Endpoint& ep, bool gso);

  std::vector<uint8_t> arena_;
  size_t arena_used_ = 0;
  uint32_t writes_ = 0;  // write() calls: where the next one starts each group's fan-out
  std::vector<Entry> entries_;
  std::vector<Group> groups_;
  std::vector<Endpoint> eps_;
  size_t eps_used_ = 0;
  // The messages being built (one sendmmsg's worth).
  std::vector<mmsghdr> msgs_;
  std::vector<sockaddr_in> addrs_;
  std::vector<uint8_t> ctrl_;
  std::vector<uint32_t> msg_group_;
  std::vector<iovec> iovs_;
  size_t n_msgs_ = 0, n_iovs_ = 0;
};

template <class Send>
void ResultBatch::write(bool gso, Send&& send) {
  n_msgs_ = n_iovs_ = 0;
  for (uint32_t gi = 0; gi < groups_.size(); ++gi) {
    const Group& g = groups_[gi];
    // Each write starts the fan-out at the next endpoint: in rank order, the last rank got every
    // result last, answered last, and so completed most rounds of a healthy job (protocol.md §4.2's
    // completer; the concede policy reads it, concede_policy.h).
    uint16_t e = g.n_eps ? static_cast<uint16_t>(writes_ % g.n_eps) : 0;
    for (uint16_t k = 0; k < g.n_eps; ++k, e = static_cast<uint16_t>(e + 1 == g.n_eps ? 0 : e + 1)) {
      if (!build(gi, eps_[g.ep_off + e], gso)) {
        send(msgs_.data(), n_msgs_);
        n_msgs_ = n_iovs_ = 0;
        build(gi, eps_[g.ep_off + e], gso);  // fits in empty pools (a group holds at most 64 datagrams)
      }
    }
  }
  if (n_msgs_) send(msgs_.data(), n_msgs_);
  n_msgs_ = n_iovs_ = 0;
  ++writes_;
}

}  // namespace gradswitch
