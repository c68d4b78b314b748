/*
 * gradswitch completion signal, version 1: the datagram the DPDK switch sends to `--notify IP:PORT`
 * each time a job's allreduce completes (paper 000: "the host machine receives a signal indicating
 * completion"). docs/dpdk.md says when it is sent; this header is the one definition of its bytes.
 *
 * A UDP payload of 32 bytes, from the aggregation address and the first data port. All fields are
 * big-endian. C99 and C++ compatible, no dependencies beyond <stdint.h>.
 *
 *  off size field
 *    0   4  magic           GS_NOTIFY_MAGIC ("GSCN")
 *    4   1  version         GS_NOTIFY_VERSION
 *    5   1  reason          gs_notify_reason
 *    6   2  reserved        sent as 0, ignored on receipt
 *    8   4  job_id          the job (as in JOIN's reply)
 *   12   4  seq             every allreduce of the job up to and including this seq is complete
 *   16   8  elements        result elements multicast for that seq (sum of `count` over its RESULTs)
 *   24   8  last_result_ns  CLOCK_MONOTONIC of the switch when the latest RESULT of that seq was sent
 */
#ifndef GRADSWITCH_NOTIFY_H
#define GRADSWITCH_NOTIFY_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "gradswitch/wire.h"

#ifdef __cplusplus
extern "C" {
#endif

#define GS_NOTIFY_MAGIC 0x4753434Eu /* "GSCN" */
#define GS_NOTIFY_VERSION 1u
#define GS_NOTIFY_BYTES 32u

enum gs_notify_reason {
  GS_NOTIFY_NEWER_SEQ = 1, /* a newer seq of the job started: ranks start seq+1 after all of seq */
  GS_NOTIFY_QUIET = 2,     /* no RESULT of the job for --notify-quiet-us */
};

struct gs_notify {
  uint32_t magic;
  uint8_t version;
  uint8_t reason;
  uint16_t reserved;
  uint32_t job_id;
  uint32_t seq;
  uint64_t elements;
  uint64_t last_result_ns;
};

GS_STATIC_ASSERT(sizeof(struct gs_notify) == GS_NOTIFY_BYTES, "completion signal must be 32 bytes");
GS_STATIC_ASSERT(offsetof(struct gs_notify, version) == 4, "version offset");
GS_STATIC_ASSERT(offsetof(struct gs_notify, reason) == 5, "reason offset");
GS_STATIC_ASSERT(offsetof(struct gs_notify, reserved) == 6, "reserved offset");
GS_STATIC_ASSERT(offsetof(struct gs_notify, job_id) == 8, "job_id offset");
GS_STATIC_ASSERT(offsetof(struct gs_notify, seq) == 12, "seq offset");
GS_STATIC_ASSERT(offsetof(struct gs_notify, elements) == 16, "elements offset");
GS_STATIC_ASSERT(offsetof(struct gs_notify, last_result_ns) == 24, "last_result_ns offset");

/* Encodes a host-order signal into the 32 bytes at `buf`. */
static inline void gs_notify_encode(const struct gs_notify* n, void* buf) {
  struct gs_notify b = *n;
  b.magic = gs_bswap32(b.magic);
  b.reserved = gs_bswap16(b.reserved);
  b.job_id = gs_bswap32(b.job_id);
  b.seq = gs_bswap32(b.seq);
  b.elements = __builtin_bswap64(b.elements);
  b.last_result_ns = __builtin_bswap64(b.last_result_ns);
  memcpy(buf, &b, sizeof b);
}

/* Decodes the 32 bytes at `buf` into host order. The caller checks the length. */
static inline void gs_notify_decode(const void* buf, struct gs_notify* n) {
  memcpy(n, buf, sizeof *n);
  n->magic = gs_bswap32(n->magic);
  n->reserved = gs_bswap16(n->reserved);
  n->job_id = gs_bswap32(n->job_id);
  n->seq = gs_bswap32(n->seq);
  n->elements = __builtin_bswap64(n->elements);
  n->last_result_ns = __builtin_bswap64(n->last_result_ns);
}

#ifdef __cplusplus
}
#endif

#endif /* GRADSWITCH_NOTIFY_H */
