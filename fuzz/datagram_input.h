// The input framing of the worker fuzz targets (fuzz_ring.cpp, fuzz_worker_switch.cpp): a sequence
// of datagrams, each a 2-byte little-endian length and then its bytes (a length past the end takes
// what is left), handed out a few at a time.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "worker/transport.h"

namespace gradswitch::worker {

class DatagramInput {
 public:
  DatagramInput(const uint8_t* data, size_t size) : data_(data), size_(size) {}

  // Up to `max` of the next datagrams into pkts, valid until the next call; how many. Each is a copy
  // of exactly its bytes, so that ASan sees any read past the datagram.
  size_t next(InPacket* pkts, size_t max) {
    held_.clear();
    while (held_.size() < max && !exhausted()) {
      size_t len = data_[pos_] | (size_t{data_[pos_ + 1]} << 8);
      pos_ += 2;
      if (len > size_ - pos_) len = size_ - pos_;
      held_.emplace_back(data_ + pos_, data_ + pos_ + len);
      pos_ += len;
    }
    for (size_t i = 0; i < held_.size(); ++i)
      pkts[i] = InPacket{held_[i].data(), static_cast<uint32_t>(held_[i].size())};
    return held_.size();
  }
  // No whole length left: every datagram has been handed out.
  bool exhausted() const { return pos_ + 2 > size_; }
  // How many input bytes have been read.
  size_t position() const { return pos_; }

 private:
  const uint8_t* data_;
  size_t size_, pos_ = 0;
  std::vector<std::vector<uint8_t>> held_;
};

}  // namespace gradswitch::worker
