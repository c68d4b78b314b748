// Which chunk of which allreduce each slot carries next when allreduces stream back to back
// through one window (docs/protocol.md section 4). The chunks of successive allreduces are
// numbered globally (allreduce k's chunk c is number B_k + c, B_{k+1} = B_k + chunks_k) and
// number g uses slot g mod S, so every rank assigns the same slots without talking, and a slot
// takes its next chunk, of this allreduce or the next one, as soon as its round finished: no
// drain at allreduce boundaries. Shared by the switch path and the ring.
#pragma once

#include <cstddef>
#include <cstdint>
#include <list>
#include <vector>

#include "worker/path.h"

namespace gradswitch::worker {

class StreamSchedule {
 public:
  struct Flight {
    AllreduceOp* op = nullptr;
    uint64_t first = 0;    // global number of its chunk 0
    size_t remaining = 0;  // chunks whose sum has not arrived
  };

  explicit StreamSchedule(unsigned slots) : slots_(slots), next_(slots) {
    for (unsigned s = 0; s < slots; ++s) next_[s] = s;
  }

  // Appends an allreduce behind the ones admitted before it.
  Flight* admit(AllreduceOp* op) {
    flights_.push_back(Flight{op, end_, op->ch.chunks});
    end_ += op->ch.chunks;
    return &flights_.back();
  }
  // The allreduce and chunk that slot `s` carries next; nullptr when that allreduce has not been
  // admitted yet (the slot then waits for it).
  Flight* next(unsigned s, size_t* chunk) {
    uint64_t g = next_[s];
    if (g >= end_) return nullptr;
    for (Flight& f : flights_)
      if (g >= f.first && g < f.first + f.op->ch.chunks) {
        *chunk = static_cast<size_t>(g - f.first);
        return &f;
      }
    return nullptr;
  }
  // Slot `s` finished the data round of its current chunk (of `f`); true when that was the last
  // chunk of `f` (whose entry is then gone).
  bool finish(unsigned s, Flight* f) {
    next_[s] += slots_;
    if (--f->remaining > 0) return false;
    for (auto it = flights_.begin(); it != flights_.end(); ++it)
      if (&*it == f) {
        flights_.erase(it);
        break;
      }
    return true;
  }
  // The chunk after `c` in the same slot and allreduce (fixed32 announces its exponent), or
  // SIZE_MAX when there is none.
  size_t following(const Flight& f, size_t c) const {
    return c + slots_ < f.op->ch.chunks ? c + slots_ : SIZE_MAX;
  }
  // Whether chunk `c` is its allreduce's first in its slot (fixed32: an exponent round precedes it).
  bool first_in_slot(size_t c) const { return c < slots_; }
  uint64_t global(const Flight& f, size_t c) const { return f.first + c; }
  // The global number of slot `s`'s next chunk (the one in flight while its round is out).
  uint64_t slot_next(unsigned s) const { return next_[s]; }
  // Whether chunk `g`'s data round finished here (its slot moved past it).
  bool finished(uint64_t g) const { return next_[g % slots_] > g; }
  // One past the global number of the last admitted chunk.
  uint64_t end() const { return end_; }

  bool empty() const { return flights_.empty(); }
  const std::list<Flight>& flights() const { return flights_; }
  unsigned slots() const { return slots_; }

 private:
  unsigned slots_;
  std::list<Flight> flights_;
  uint64_t end_ = 0;
  std::vector<uint64_t> next_;  // per slot: the global number of its next chunk
};

}  // namespace gradswitch::worker
