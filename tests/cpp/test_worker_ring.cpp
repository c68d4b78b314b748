// The ring allreduce over an in-process network (no sockets): N = 2..8, every wire type, sizes
// from one element up, loss in both directions with nothing applied twice, fixed32 bit-identical
// to the switch's integer sums, reconciliation of chunks some ranks already hold, a dead rank.
#include <arpa/inet.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "common/fixed_point.h"
#include "common/header.h"
#include "common/kernels.h"
#include "gradswitch/wire.h"
#include "harness.h"
#include "path_parts.h"
#include "worker/errors.h"
#include "worker/ring/ring_allreduce.h"

using namespace gradswitch;
using namespace gradswitch::worker;

namespace {

constexpr uint16_t kBasePort = 5000;

// Datagrams between N in-process ranks, addressed by port (kBasePort + rank); drops a fraction
// of them at random (seeded), and duplicates or delays (reorders) others when asked.
class FakeNet {
 public:
  FakeNet(unsigned n, double drop = 0, uint64_t seed = 1, double dup = 0)
      : inbox_(n), held_(n), drop_(drop), dup_(dup), rng_(seed) {}
  void send(const OutPacket& p) {
    std::lock_guard<std::mutex> lk(mu_);
    unsigned to = p.dst_port - kBasePort;
    if (to >= inbox_.size()) return;
    if (drop_ > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < drop_) return;
    std::vector<uint8_t> d(p.data, p.data + p.len);
    if (p.len < GS_HEADER_BYTES) {
      ++short_sent_;
    } else {
      gs_header h;
      gs_header_decode(p.data, &h);
      if (h.type == GS_MSG_RING_DONE) done_sent_.push_back({h.rank, h.seq});
    }
    if (dup_ > 0 && std::uniform_real_distribution<double>(0, 1)(rng_) < dup_) inbox_[to].push_back(d);
    inbox_[to].push_back(std::move(d));
    cv_.notify_all();
  }
  size_t recv(unsigned rank, InPacket* pkts, size_t max, int64_t timeout_ns) {
    std::unique_lock<std::mutex> lk(mu_);
    auto& q = inbox_[rank];
    if (q.empty() && timeout_ns > 0)
      cv_.wait_for(lk, std::chrono::nanoseconds(timeout_ns), [&] { return !q.empty() || woken_; });
    woken_ = false;
    auto& held = held_[rank];
    held.clear();
    while (held.size() < max && !q.empty()) {
      held.push_back(std::move(q.front()));
      q.pop_front();
    }
    for (size_t i = 0; i < held.size(); ++i)
      pkts[i] = InPacket{held[i].data(), static_cast<uint32_t>(held[i].size())};
    return held.size();
  }
  bool more(unsigned rank) {
    std::lock_guard<std::mutex> lk(mu_);
    return !inbox_[rank].empty();
  }
  // Every RING_DONE sent so far, as (sender, seq), lost ones included.
  std::vector<std::pair<unsigned, uint32_t>> done_sent() {
    std::lock_guard<std::mutex> lk(mu_);
    return done_sent_;
  }
  // Datagrams of less than a header that a rank sent (never right).
  size_t short_sent() {
    std::lock_guard<std::mutex> lk(mu_);
    return short_sent_;
  }
  // Puts a datagram in `rank`'s inbox as if a peer had sent it.
  void inject(unsigned rank, std::vector<uint8_t> d) {
    std::lock_guard<std::mutex> lk(mu_);
    inbox_[rank].push_back(std::move(d));
    cv_.notify_all();
  }
  void wake() {
    std::lock_guard<std::mutex> lk(mu_);
    woken_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::deque<std::vector<uint8_t>>> inbox_;
  std::vector<std::vector<std::vector<uint8_t>>> held_;
  double drop_, dup_;
  std::mt19937_64 rng_;
  bool woken_ = false;
  std::vector<std::pair<unsigned, uint32_t>> done_sent_;
  size_t short_sent_ = 0;
};

class NetTransport : public Transport {
 public:
  NetTransport(FakeNet* net, unsigned rank) : net_(net), rank_(rank) {}
  uint16_t local_port() const override { return static_cast<uint16_t>(kBasePort + rank_); }
  void set_peer(uint32_t) override {}
  size_t send_batch(const OutPacket* pkts, size_t n) override {
    for (size_t i = 0; i < n; ++i) net_->send(pkts[i]);
    return n;
  }
  size_t recv_batch(InPacket* pkts, size_t max, int64_t timeout_ns) override {
    return net_->recv(rank_, pkts, max, timeout_ns);
  }
  bool more_pending() const override { return net_->more(rank_); }
  void wake() override { net_->wake(); }

 private:
  FakeNet* net_;
  unsigned rank_;
};

// One rank: options, context and ring path, as a Group would hold them.
struct Rank : PathParts {
  std::unique_ptr<NetTransport> tx;
  std::unique_ptr<RingAllreduce> ring;
  std::vector<int8_t> exps;
  uint32_t seq = 0;

  Rank(FakeNet& net, unsigned rank, unsigned world, unsigned slots, uint32_t payload,
       std::function<void(Options&)> tweak) {
    opt.rank = rank;
    opt.world = world;
    opt.job = "ring";
    opt.timeout_s = 5;
    opt.rto_initial_s = 0.002;
    opt.rto_max_s = 0.02;
    if (tweak) tweak(opt);
    tx = std::make_unique<NetTransport>(&net, rank);
    ctx.transport = tx.get();
    ctx.job_text = "job 'ring' (rank " + std::to_string(rank) + ")";
    ring = std::make_unique<RingAllreduce>(ctx, loopback_ring(world, kBasePort, 9, 0xABCD, slots, payload));
  }
  // Allreduce of `data` (float32 or int32 bits) as `elem`.
  void allreduce(void* data, size_t count, uint8_t elem, std::vector<uint8_t>* done = nullptr) {
    AllreduceOp op;
    op.base = static_cast<uint8_t*>(data);
    op.ch = make_chunking(count, elem, ring->config().payload_bytes,
                          elem == GS_ELEM_INT32 ? DType::kInt32 : DType::kFloat32);
    if (elem == GS_ELEM_FIXED32) {
      block_exponents(op.ch, static_cast<const float*>(data), &exps);
      op.exps = &exps;
    }
    op.seq = seq++;
    op.done = done;
    ring->run(op);
  }
};

struct Ring {
  FakeNet net;
  std::vector<std::unique_ptr<Rank>> ranks;
  Ring(unsigned world, unsigned slots = 16, uint32_t payload = 1440, double drop = 0, uint64_t seed = 1,
       std::function<void(Options&)> tweak = nullptr, double dup = 0)
      : net(world, drop, seed, dup) {
    for (unsigned r = 0; r < world; ++r)
      ranks.push_back(std::make_unique<Rank>(net, r, world, slots, payload, tweak));
  }
  // Runs fn(rank) on every rank concurrently; returns the error texts ("" = ok).
  std::vector<std::string> each(const std::function<void(unsigned)>& fn) {
    std::vector<std::string> err(ranks.size());
    std::vector<std::thread> t;
    for (unsigned r = 0; r < ranks.size(); ++r)
      t.emplace_back([&, r] {
        try {
          fn(r);
        } catch (const std::exception& e) {
          err[r] = e.what();
        }
      });
    for (auto& x : t) x.join();
    return err;
  }
};

bool all_ok(const std::vector<std::string>& e) {
  bool ok = true;
  for (auto& s : e)
    if (!s.empty()) {
      std::fprintf(stderr, "  error: %s\n", s.c_str());
      ok = false;
    }
  return ok;
}

// The switch's fixed32 result (docs/protocol.md section 5), computed independently of any path:
// per chunk the agreed exponent, every rank's quantisation, the exact integer sum, scaled back.
std::vector<float> fixed32_reference(const std::vector<std::vector<float>>& in, uint32_t payload) {
  const Kernels& K = kernels();
  size_t n = in[0].size();
  unsigned N = static_cast<unsigned>(in.size());
  Chunking ch = make_chunking(n, GS_ELEM_FIXED32, payload);
  std::vector<float> out(n);
  std::vector<int32_t> q(ch.per), sum(ch.per);
  for (size_t c = 0; c < ch.chunks; ++c) {
    size_t off = ch.offset(c), m = ch.size(c);
    int8_t e = GS_EXP_NONE;
    for (auto& v : in) e = std::max(e, block_exponent(K.max_abs(v.data() + off, m)));
    int s = scale_exponent(e, N);
    std::fill(sum.begin(), sum.end(), 0);
    for (auto& v : in) {
      K.quantize(q.data(), v.data() + off, m, std::ldexp(1.0f, s));
      K.add_i32(sum.data(), q.data(), m);
    }
    K.dequantize(out.data() + off, sum.data(), m, std::ldexp(1.0f, -s));
  }
  return out;
}

std::vector<std::vector<float>> float_inputs(unsigned N, size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<std::vector<float>> d(N, std::vector<float>(n));
  for (auto& v : d)
    for (size_t i = 0; i < n; ++i)
      v[i] = std::ldexp(std::uniform_real_distribution<float>(-1, 1)(g), static_cast<int>(i / 500 % 7) - 3);
  return d;
}

}  // namespace

TEST(int32_exact_every_world_and_size) {
  for (unsigned N : {2u, 3u, 4u, 8u})
    for (size_t n : {size_t{1}, size_t{359}, size_t{361}, size_t{5000}}) {
      Ring ring(N, 4, 1440);
      std::vector<std::vector<int32_t>> d(N, std::vector<int32_t>(n));
      for (unsigned r = 0; r < N; ++r)
        for (size_t i = 0; i < n; ++i) d[r][i] = static_cast<int32_t>(i * 2654435761u + r * 40503u);
      std::vector<int32_t> want(n, 0);
      for (unsigned r = 0; r < N; ++r)
        for (size_t i = 0; i < n; ++i)
          want[i] = static_cast<int32_t>(static_cast<uint32_t>(want[i]) + d[r][i]);
      CHECK(all_ok(ring.each([&](unsigned r) { ring.ranks[r]->allreduce(d[r].data(), n, GS_ELEM_INT32); })));
      for (unsigned r = 0; r < N; ++r) CHECK(d[r] == want);
    }
}

TEST(float_wires_and_fixed32_bit_identical_to_switch) {
  for (unsigned N : {2u, 3u, 4u, 8u})
    for (uint8_t elem : {GS_ELEM_FLOAT32, GS_ELEM_FIXED32, GS_ELEM_FLOAT16, GS_ELEM_BFLOAT16}) {
      size_t n = 20000;
      auto base = float_inputs(N, n, 7 + N);
      std::vector<double> exact(n, 0);
      for (auto& v : base)
        for (size_t i = 0; i < n; ++i) exact[i] += v[i];
      Ring ring(N, 8, 1440);
      auto d = base;
      // Twice in a row: versions and sequence numbers carry over.
      CHECK(all_ok(ring.each([&](unsigned r) {
        ring.ranks[r]->allreduce(d[r].data(), n, elem);
        d[r] = base[r];
        ring.ranks[r]->allreduce(d[r].data(), n, elem);
      })));
      for (unsigned r = 1; r < N; ++r) CHECK(d[r] == d[0]);  // every rank holds the same bits
      if (elem == GS_ELEM_FIXED32) {
        auto ref = fixed32_reference(base, 1440);
        CHECK(std::memcmp(d[0].data(), ref.data(), n * 4) == 0);
      } else {
        // float16/bfloat16 round at every hop (N - 1 times), not once as the switch does.
        double tol = elem == GS_ELEM_FLOAT32 ? 1e-6 : elem == GS_ELEM_FLOAT16 ? 4e-3 * N : 3e-2 * N;
        double worst = 0;
        for (size_t i = 0; i < n; ++i)
          worst = std::max(worst, std::fabs(d[0][i] - exact[i]) / (1 + std::fabs(exact[i])));
        if (worst > tol) std::fprintf(stderr, "  N %u wire %s: worst %g\n", N, gs_elem_name(elem), worst);
        CHECK(worst <= tol);
      }
    }
}

TEST(loss_and_duplicates_exact_nothing_applied_twice) {
  for (double p : {0.01, 0.1}) {
    unsigned N = 4;
    size_t n = 30000;
    // Loss inside the network and at the senders, plus duplicated datagrams.
    Ring ring(
        N, 16, 1440, p, 42,
        [&](Options& o) {
          o.drop_rate = p;
          o.seed = 3;
        },
        0.02);
    std::vector<std::vector<int32_t>> d(N, std::vector<int32_t>(n));
    auto f = float_inputs(N, n, 5);
    std::vector<int32_t> want(n, 0);
    for (unsigned r = 0; r < N; ++r)
      for (size_t i = 0; i < n; ++i) {
        d[r][i] = static_cast<int32_t>(i % 1000) - 500 + static_cast<int32_t>(r);
        want[i] += d[r][i];
      }
    auto want_f = fixed32_reference(f, 1440);
    CHECK(all_ok(ring.each([&](unsigned r) {
      ring.ranks[r]->allreduce(d[r].data(), n, GS_ELEM_INT32);
      ring.ranks[r]->allreduce(f[r].data(), n, GS_ELEM_FIXED32);
      // As Group::close does: a rank that finished first still answers its neighbours' resends.
      ring.ranks[r]->ring->linger(2.0);
    })));
    for (unsigned r = 0; r < N; ++r) {
      CHECK(d[r] == want);
      CHECK(std::memcmp(f[r].data(), want_f.data(), n * 4) == 0);
    }
    uint64_t retx = 0, drops = 0;
    for (auto& rk : ring.ranks) {
      retx += rk->counters.retransmissions.load();
      drops += rk->counters.injected_drops.load();
    }
    CHECK(retx > 0);
    CHECK(drops > 0);
  }
}

TEST(ranks_start_at_different_times_and_stream_many_calls) {
  // Ranks reach each allreduce at different moments: partials of the next allreduce arrive
  // before it began at their receiver and are kept, not dropped.
  unsigned N = 3;
  Ring ring(N, 4, 64);  // 16 float32 per packet
  std::vector<std::vector<std::vector<float>>> bufs(N);
  for (int k = 0; k < 30; ++k)
    for (unsigned r = 0; r < N; ++r)
      bufs[r].push_back(std::vector<float>(1 + 11 * k, static_cast<float>(k + r)));
  CHECK(all_ok(ring.each([&](unsigned r) {
    for (int k = 0; k < 30; ++k) {
      if ((k + r) % 7 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
      ring.ranks[r]->allreduce(bufs[r][k].data(), bufs[r][k].size(), GS_ELEM_FLOAT32);
    }
    ring.ranks[r]->ring->linger(1.0);
  })));
  bool ok = true;
  for (unsigned r = 0; r < N; ++r)
    for (int k = 0; k < 30; ++k)
      for (float v : bufs[r][k]) ok &= v == static_cast<float>(3 * k + 3);
  CHECK(ok);
}

TEST(allreduces_stream_back_to_back_with_loss) {
  // Every rank admits 12 allreduces of different sizes at once (fixed32 and int32 mixed): their
  // chunks share the window, a slot moving on to the next allreduce as soon as it is free.
  unsigned N = 4;
  Ring ring(N, 16, 1440, 0.02, 77, [](Options& o) {
    o.drop_rate = 0.02;
    o.seed = 9;
  });
  std::vector<size_t> sizes = {5000, 1, 361, 20000, 7, 3600, 100, 9000, 360, 2, 15000, 721};
  std::vector<std::vector<std::vector<float>>> f(N);
  std::vector<std::vector<std::vector<int32_t>>> in(N);
  std::vector<std::vector<float>> want_f;
  std::vector<std::vector<int32_t>> want_i;
  for (size_t k = 0; k < sizes.size(); ++k) {
    auto base = float_inputs(N, sizes[k], 100 + k);
    want_f.push_back(fixed32_reference(base, 1440));
    std::vector<int32_t> wi(sizes[k], 0);
    for (unsigned r = 0; r < N; ++r) {
      f[r].push_back(base[r]);
      in[r].emplace_back(sizes[k]);
      for (size_t i = 0; i < sizes[k]; ++i) {
        in[r][k][i] = static_cast<int32_t>(i * 3 + k * 7 + r);
        wi[i] += in[r][k][i];
      }
    }
    want_i.push_back(wi);
  }
  std::vector<size_t> finished(N, 0);
  CHECK(all_ok(ring.each([&](unsigned r) {
    Rank& rk = *ring.ranks[r];
    std::vector<AllreduceOp> ops(sizes.size());
    std::vector<std::vector<int8_t>> exps(sizes.size());
    for (size_t k = 0; k < sizes.size(); ++k) {
      bool fixed = k % 2 == 0;
      AllreduceOp& op = ops[k];
      op.base =
          fixed ? reinterpret_cast<uint8_t*>(f[r][k].data()) : reinterpret_cast<uint8_t*>(in[r][k].data());
      op.ch = make_chunking(sizes[k], fixed ? GS_ELEM_FIXED32 : GS_ELEM_INT32, 1440,
                            fixed ? DType::kFloat32 : DType::kInt32);
      if (fixed) {
        block_exponents(op.ch, op.base, &exps[k]);
        op.exps = &exps[k];
      }
      op.seq = rk.seq++;
      rk.ring->admit(&op);
    }
    std::vector<AllreduceOp*> done;
    while (!rk.ring->idle()) rk.ring->step(&done);
    finished[r] = done.size();
    rk.ring->linger(2.0);
  })));
  for (unsigned r = 0; r < N; ++r) {
    CHECK_EQ(finished[r], sizes.size());
    for (size_t k = 0; k < sizes.size(); ++k) {
      if (k % 2 == 0)
        CHECK(std::memcmp(f[r][k].data(), want_f[k].data(), sizes[k] * 4) == 0);
      else
        CHECK(in[r][k] == want_i[k]);
    }
  }
}

TEST(ring_done_promises_every_earlier_allreduce) {
  // A one-chunk allreduce admitted behind a 100-chunk one often finishes first. RING_DONE(seq) lets
  // the next rank leave, so it promises every allreduce up to seq and is sent only once nothing
  // admitted is unfinished: here only RING_DONE(1), whatever the order (a RING_DONE for the short
  // one while the long one ran let a finished rank stop answering a neighbour that needed a sum).
  unsigned N = 3;
  Ring ring(N, 16, 1440);
  std::vector<std::vector<int32_t>> big(N, std::vector<int32_t>(100 * 360)),
      small(N, std::vector<int32_t>(5));
  for (unsigned r = 0; r < N; ++r) {
    for (size_t i = 0; i < big[r].size(); ++i) big[r][i] = static_cast<int32_t>(i + r);
    for (size_t i = 0; i < small[r].size(); ++i) small[r][i] = static_cast<int32_t>(7 * i + r);
  }
  std::vector<std::vector<uint32_t>> order(N);  // seqs in the order they finished
  CHECK(all_ok(ring.each([&](unsigned r) {
    Rank& rk = *ring.ranks[r];
    AllreduceOp ops[2];
    std::vector<int32_t>* bufs[2] = {&big[r], &small[r]};
    for (int k = 0; k < 2; ++k) {
      ops[k].base = reinterpret_cast<uint8_t*>(bufs[k]->data());
      ops[k].ch = make_chunking(bufs[k]->size(), GS_ELEM_INT32, 1440, DType::kInt32);
      ops[k].seq = rk.seq++;
      rk.ring->admit(&ops[k]);
    }
    std::vector<AllreduceOp*> done;
    while (!rk.ring->idle()) rk.ring->step(&done);
    for (AllreduceOp* op : done) order[r].push_back(op->seq);
    CHECK(rk.ring->linger(2.0));
  })));
  for (unsigned r = 0; r < N; ++r) {
    CHECK_EQ(order[r].size(), size_t{2});
    CHECK(big[r][359] == static_cast<int32_t>(3 * 359 + 3) &&
          small[r][4] == static_cast<int32_t>(3 * 28 + 3));
  }
  auto sent = ring.net.done_sent();
  CHECK(!sent.empty());
  for (auto& [rank, seq] : sent) CHECK_EQ(seq, uint32_t{1});
}

TEST(held_sums_win_over_partials) {
  // An allreduce the switch left half done: each rank already holds the sums of some chunks
  // (different ones per rank), the rest of its tensor is still its input.
  for (uint8_t elem : {GS_ELEM_FIXED32, GS_ELEM_FLOAT16, GS_ELEM_INT32}) {
    unsigned N = 4;
    size_t n = 360 * 20 + 7;
    auto in = float_inputs(N, n, 11);
    std::vector<std::vector<int32_t>> iin(N, std::vector<int32_t>(n));
    for (unsigned r = 0; r < N; ++r)
      for (size_t i = 0; i < n; ++i) iin[r][i] = static_cast<int32_t>(i * 31 + r);
    // The sums as a full ring allreduce computes them.
    Ring full(N, 8, 1440);
    auto want = in;
    auto iwant = iin;
    CHECK(all_ok(full.each([&](unsigned r) {
      if (elem == GS_ELEM_INT32)
        full.ranks[r]->allreduce(iwant[r].data(), n, elem);
      else
        full.ranks[r]->allreduce(want[r].data(), n, elem);
    })));
    Chunking ch = make_chunking(n, elem, 1440);
    std::vector<std::vector<uint8_t>> done(N, std::vector<uint8_t>(ch.chunks, 0));
    auto d = in;
    auto id = iin;
    for (unsigned r = 0; r < N; ++r)
      for (size_t c = 0; c < ch.chunks; ++c)
        if ((c * 7 + r * 3) % 5 < 2 || c == 4) {  // chunk 4 is held by every rank
          done[r][c] = 1;
          for (size_t i = ch.offset(c); i < ch.offset(c) + ch.size(c); ++i) {
            d[r][i] = want[0][i];
            id[r][i] = iwant[0][i];
          }
        }
    // A fresh ring (as after a fallback): the held sums must win over any partial.
    Ring ring(N, 8, 1440);
    CHECK(all_ok(ring.each([&](unsigned r) {
      if (elem == GS_ELEM_INT32)
        ring.ranks[r]->allreduce(id[r].data(), n, elem, &done[r]);
      else
        ring.ranks[r]->allreduce(d[r].data(), n, elem, &done[r]);
    })));
    for (unsigned r = 0; r < N; ++r) {
      if (elem == GS_ELEM_INT32)
        CHECK(id[r] == iwant[0]);
      else
        CHECK(std::memcmp(d[r].data(), want[0].data(), n * 4) == 0);
    }
  }
}

TEST(dead_rank_times_out_naming_it) {
  unsigned N = 3;
  Ring ring(N, 4, 1440, 0, 1, [](Options& o) { o.timeout_s = 0.3; });
  std::vector<std::vector<float>> d(N, std::vector<float>(1000, 1.0f));
  auto t0 = std::chrono::steady_clock::now();
  auto err = ring.each([&](unsigned r) {
    if (r != 2) ring.ranks[r]->allreduce(d[r].data(), 1000, GS_ELEM_FLOAT32);  // rank 2 is gone
  });
  double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  CHECK(secs < 2.0);
  CHECK(err[0].find("ring allreduce timed out") != std::string::npos);
  CHECK(err[1].find("ring allreduce timed out") != std::string::npos);
  // Rank 0's first round (root 0) needs ranks 1 and 2; rank 1's first round (slot 1, root 1)
  // waits for rank 2.
  CHECK(err[0].find("ranks 1, 2 alive") != std::string::npos);
  CHECK(err[1].find("is rank 2 alive") != std::string::npos);
}

TEST(root_ignores_a_partial_of_its_own_finished_round) {
  // The previous rank is the last of the chain of the slots this rank roots: it sends them
  // results, never partials. A partial of the root's finished round (a forged or corrupt one)
  // found no copy of the sum to answer with and sent a datagram of length 0 (found by fuzz_ring).
  unsigned N = 3;
  Ring ring(N, 4, 1440);
  std::vector<std::vector<int32_t>> d(N, std::vector<int32_t>(10, 1));
  CHECK(all_ok(ring.each([&](unsigned r) { ring.ranks[r]->allreduce(d[r].data(), 10, GS_ELEM_INT32); })));
  CHECK(d[0][9] == 3);
  // Slot 0 (root: rank 0) carried the only chunk, version 0, seq 0, offset 0.
  std::vector<uint8_t> pkt(GS_HEADER_BYTES + 10 * 4, 0);
  gs_header h =
      HeaderBuilder(GS_MSG_RING_PARTIAL, 9, 0xABCD).rank(2).slot(0).elems(GS_ELEM_INT32, 10).round(0, 0);
  gs_header_encode(&h, pkt.data());
  Rank& root = *ring.ranks[0];
  const uint64_t ignored = root.counters.ignored.load();
  ring.net.inject(0, pkt);
  root.ring->serve(1'000'000);
  CHECK_EQ(root.counters.ignored.load(), ignored + 1);
  CHECK_EQ(ring.net.short_sent(), size_t{0});
}

TEST(single_rank_rounds_like_the_switch) {
  Ring ring(1, 4, 1440);
  std::vector<float> v = {1.0f, 1.0f / 3.0f, -2.5f};
  ring.ranks[0]->allreduce(v.data(), v.size(), GS_ELEM_FLOAT16);
  CHECK(v[0] == 1.0f && v[2] == -2.5f);
  CHECK(v[1] == f16_to_f32_scalar(f32_to_f16_scalar(1.0f / 3.0f)));
}

GS_TEST_MAIN()
