// Grouping a burst's datagrams by destination, and their sendmmsg messages (see result_batch.h).
#include "switch/io/udp/result_batch.h"

#include <cstring>

#include "common/udp_offload.h"
#include "gradswitch/wire.h"

namespace gradswitch {

namespace {

constexpr size_t kArenaBytes = 256 * 1024;  // a burst's datagrams, copied out of the engine
constexpr size_t kMaxEntries = 4096;
constexpr size_t kMaxGroups = 1024;
constexpr size_t kMaxEndpoints = 8192;
constexpr size_t kMaxIovs = 4096;
// Groups looked at for one to join: a burst's destinations are the job's ranks and the multicast;
// beyond that many, a new group costs one more write, never a wrong one.
constexpr size_t kSearchGroups = 32;

}  // namespace

ResultBatch::ResultBatch()
    : arena_(kArenaBytes),
      eps_(kMaxEndpoints),
      msgs_(kMaxMsgs),
      addrs_(kMaxMsgs),
      ctrl_(kMaxMsgs * kGsoControlBytes),
      msg_group_(kMaxMsgs),
      iovs_(kMaxIovs) {
  entries_.reserve(kMaxEntries);
  groups_.reserve(kMaxGroups);
}

bool ResultBatch::same_destination(const Group& g, const IngestResult& r) const {
  if (g.job_id != r.job_id || g.type != r.type || g.dests != destinations(r)) return false;
  // DATA going up goes to the spine's port of its slot: the same group only for the same port.
  return r.type != GS_MSG_DATA || (eps_[g.ep_off].port_be == r.endpoints[0].port_be &&
                                   eps_[g.ep_off].ipv4_be == r.endpoints[0].ipv4_be);
}

bool ResultBatch::add(const IngestResult& r, bool gso) {
  const uint64_t dests = destinations(r);
  const auto n_eps = static_cast<uint16_t>(__builtin_popcountll(dests));
  if (arena_used_ + r.len > arena_.size() || entries_.size() == kMaxEntries ||
      eps_used_ + n_eps > eps_.size() || groups_.size() == kMaxGroups)
    return false;
  const uint32_t entry = static_cast<uint32_t>(entries_.size());
  entries_.push_back(Entry{static_cast<uint32_t>(arena_used_), r.len, kNone});
  std::memcpy(arena_.data() + arena_used_, r.data, r.len);
  arena_used_ += r.len;
  if (gso) {
    const size_t stop = groups_.size() > kSearchGroups ? groups_.size() - kSearchGroups : 0;
    for (size_t gi = groups_.size(); gi-- > stop;) {
      Group& g = groups_[gi];
      if (!same_destination(g, r)) continue;
      // Only the destination's newest group may take it: a new one after it keeps the order.
      if (!g.open || r.len > g.seg || g.bytes + r.len > kMaxGsoBytes) break;
      entries_[g.last].next = entry;
      g.last = entry;
      ++g.nseg;
      g.bytes += r.len;
      // Only the last datagram of a GSO write may be shorter than the others.
      g.open = r.len == g.seg && g.nseg < kMaxGsoSegments && g.bytes + g.seg <= kMaxGsoBytes;
      return true;
    }
  }
  Group g{};
  g.job_id = r.job_id;
  g.type = r.type;
  g.dests = dests;
  g.n_eps = n_eps;
  g.ep_off = static_cast<uint32_t>(eps_used_);
  g.first = g.last = entry;
  g.seg = g.bytes = r.len;
  g.nseg = 1;
  g.open = gso && g.bytes + g.seg <= kMaxGsoBytes;
  for (uint64_t m = dests; m; m &= m - 1) eps_[eps_used_++] = r.endpoints[__builtin_ctzll(m)];
  groups_.push_back(g);
  return true;
}

bool ResultBatch::build(uint32_t gi, const Endpoint& ep, bool gso) {
  const Group& g = groups_[gi];
  const bool train = gso && g.nseg > 1;
  const size_t need_msgs = train ? 1 : g.nseg;
  if (n_msgs_ + need_msgs > msgs_.size() || n_iovs_ + g.nseg > iovs_.size()) return false;
  size_t m = n_msgs_;
  for (uint32_t e = g.first; e != kNone; e = entries_[e].next) {
    iovs_[n_iovs_] = {arena_.data() + entries_[e].off, entries_[e].len};
    const bool starts_msg = !train || e == g.first;
    if (starts_msg) {
      sockaddr_in& a = addrs_[m];
      a = sockaddr_in{};
      a.sin_family = AF_INET;
      a.sin_addr.s_addr = ep.ipv4_be;
      a.sin_port = ep.port_be;
      msghdr& h = msgs_[m].msg_hdr;
      h = msghdr{};
      h.msg_name = &a;
      h.msg_namelen = sizeof a;
      h.msg_iov = &iovs_[n_iovs_];
      h.msg_iovlen = 0;
      msg_group_[m] = gi;
      ++m;
    }
    ++msgs_[m - 1].msg_hdr.msg_iovlen;
    ++n_iovs_;
  }
  if (train) {
    set_gso_segment(&msgs_[n_msgs_].msg_hdr, ctrl_.data() + n_msgs_ * kGsoControlBytes,
                    static_cast<uint16_t>(g.seg));
  }
  n_msgs_ = m;
  return true;
}

void ResultBatch::sent(size_t i, uint64_t datagrams, uint64_t bytes) {
  Group& g = groups_[msg_group_[i]];
  g.sent_pkts += datagrams;
  g.sent_bytes += bytes;
}

uint16_t ResultBatch::segment(size_t i) const {
  return msgs_[i].msg_hdr.msg_controllen ? static_cast<uint16_t>(groups_[msg_group_[i]].seg) : 0;
}

void ResultBatch::clear() {
  arena_used_ = 0;
  entries_.clear();
  groups_.clear();
  eps_used_ = 0;
  n_msgs_ = n_iovs_ = 0;
}

}  // namespace gradswitch
