/*
 * gradswitch wire format, version 2 (version 1 had no `window`: RESULT named its receiver in `rank`
 * and the completer in bytes 30-31).
 *
 * The single definition of the bytes exchanged between workers and the switch.
 * docs/protocol.md is its specification; the two change together.
 *
 * A gradswitch datagram is a UDP payload: a 32-byte header followed by `count`
 * elements (gs_payload_bytes: mx8 adds a scale byte per block). Header fields are big-endian (network byte
 * order); elements are little-endian. This header is C99 and C++ compatible and has no dependencies beyond
 * <stdint.h>.
 */
#ifndef GRADSWITCH_WIRE_H
#define GRADSWITCH_WIRE_H

#include <float.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#define GS_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#else
#define GS_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#endif

#define GS_MAGIC 0x4753u /* "GS" */
#define GS_VERSION 2u
#define GS_HEADER_BYTES 32u

/* IPv4 (20) + UDP (8) + gradswitch header (32). */
#define GS_IPV4_UDP_OVERHEAD 28u
#define GS_DEFAULT_MTU 1500u
#define GS_MAX_MTU 9000u
#define GS_DEFAULT_PAYLOAD_BYTES (GS_DEFAULT_MTU - GS_IPV4_UDP_OVERHEAD - GS_HEADER_BYTES) /* 1440 */
#define GS_MAX_PAYLOAD_BYTES (GS_MAX_MTU - GS_IPV4_UDP_OVERHEAD - GS_HEADER_BYTES)         /* 8940 */

/* Largest world size: a slot's contributor bitmap is one 64-bit word. */
#define GS_MAX_WORLD 64u
/* `rank` naming no single rank: an ABORT or HELD for every worker, a leaf's RESULT that another
 * rack completed. */
#define GS_RANK_ALL 0xFFFFu
/* `next_exp`/`scale_exp` meaning "no exponent" (all-zero block, or not fixed32). */
#define GS_EXP_NONE (-128)

enum gs_msg_type {
  GS_MSG_DATA = 1,   /* worker -> switch: a contribution to one slot version */
  GS_MSG_RESULT = 2, /* switch -> worker(s): the completed slot version */
  GS_MSG_ABORT = 3,  /* switch -> worker: the job was aborted; see gs_abort_reason */
  /* The ring algorithm (docs/protocol.md section 7): worker to worker, no switch involved. */
  GS_MSG_RING_PARTIAL = 4, /* to the next rank: the sum of one chunk over the ranks so far */
  GS_MSG_RING_RESULT = 5,  /* to the previous rank: the chunk's finished sum */
  GS_MSG_RING_DONE = 6,    /* to the next rank: the sender holds every sum up to allreduce `seq` */
  /* switch -> worker: a retransmitted DATA found its round open. To the sender when its
   * contribution was already in it (nothing was lost; the round waits for other ranks), and, once
   * the round has been open 20 ms, to every rank it still lacks (resend yours now). Body: the
   * round's contributors (GS_HELD_BODY_BYTES). */
  GS_MSG_HELD = 7,
};

enum gs_elem_type {
  GS_ELEM_INT32 = 1,    /* two's complement, wrapping sum */
  GS_ELEM_FLOAT32 = 2,  /* IEEE 754 binary32, summed in fp32 */
  GS_ELEM_FIXED32 = 3,  /* int32 fixed point, scale 2^-S agreed per chunk (docs/protocol.md) */
  GS_ELEM_FLOAT16 = 4,  /* IEEE 754 binary16, summed in fp32, rounded to nearest even */
  GS_ELEM_BFLOAT16 = 5, /* bfloat16, summed in fp32, rounded to nearest even */
  GS_ELEM_FLOAT64 = 6,  /* IEEE 754 binary64, summed in fp64 */
  /* Blocks of GS_MX8_BLOCK FP8 E4M3 elements behind one E8M0 scale byte (docs/protocol.md 2.2),
   * widened to fp32, summed in fp32, narrowed once. */
  GS_ELEM_MX8 = 7,
};

/* mx8: elements per block (the last block of a payload may hold fewer), and the scale byte of a
 * block holding a NaN or an infinity (every element decodes as NaN). */
#define GS_MX8_BLOCK 32u
#define GS_MX8_BLOCK_BYTES (1u + GS_MX8_BLOCK)
#define GS_MX8_SCALE_NAN 0xFFu

enum gs_flags {
  GS_FLAG_VERSION = 0x01, /* slot version (0 or 1) */
  /* DATA: a resend (required: a completed round answers only resends). RESULT (multicast): the DATA
   * that completed the round was a resend, so a loss held the round, not a late rank. */
  GS_FLAG_RETX = 0x02,
  GS_FLAG_UNICAST = 0x04, /* RESULT: answer to a retransmission, sent to one worker */
  GS_FLAG_LAST = 0x08,    /* DATA: this chunk ends the sender's tensor (lengths are checked with it) */
  GS_FLAG_SUM = 0x10,     /* RING_PARTIAL/RESULT: the payload is a finished sum a rank already held */
  /* RESULT (UNICAST) / HELD: the switch already held the sender's contribution to this round when
   * the retransmission arrived, as TCP's DSACK (RFC 2883) reports a duplicate segment. */
  GS_FLAG_DSACK = 0x20,
  /* RESULT of a job that joined with deadline_us= (docs/protocol.md section 3.1): the round closed at
   * its deadline without every member's contribution; the datagram ends with GS_PARTIAL_TRAILER_BYTES
   * naming the contributors. Only a job that asked for it at JOIN ever receives it. */
  GS_FLAG_PARTIAL = 0x40,
  /* DATA of a job that joined with deadline_us= (docs/protocol.md section 3.1): a header without
   * payload (`count` and `elem_type` as the chunk's DATA would carry) by which the sender arrives at
   * the round without contributing; the round closes as soon as every member arrived. */
  GS_FLAG_CONCEDE = 0x80,
};

enum gs_abort_reason {
  GS_ABORT_RANK_LEFT = 1, /* `rank` disconnected from the control plane mid-job */
  GS_ABORT_IDLE = 2,      /* the job was idle past the switch's idle timeout */
  GS_ABORT_SHUTDOWN = 3,  /* the switch is stopping */
  GS_ABORT_OPERATOR = 4,  /* ended through the control plane */
  GS_ABORT_MISMATCH = 5,  /* the ranks' contributions to one round differ in length or type */
  GS_ABORT_UPLINK = 6,    /* a leaf switch's spine ended the job or was lost (docs/protocol.md §8) */
};

/*
 * Header layout. All multi-byte fields big-endian.
 *
 *  off size field
 *    0   2  magic      GS_MAGIC
 *    2   1  version    GS_VERSION
 *    3   1  type       gs_msg_type
 *    4   4  job_id     from the control plane
 *    8   4  key        per-job random key from the control plane
 *   12   2  rank       DATA: sender; RESULT: the completer, the rank whose DATA completed the round
 *                       (GS_RANK_ALL when a leaf's spine round was completed by another rack);
 *                       ABORT: rank at fault or GS_RANK_ALL; HELD: GS_RANK_ALL (its body tells each
 *                       receiver why it got it)
 *   14   2  slot       slot index within the job's pool
 *   16   1  flags      gs_flags (GS_FLAG_PARTIAL: a RESULT followed by a contributor trailer;
 *                       GS_FLAG_CONCEDE: a DATA that is this header alone, its `count` none of it)
 *   17   1  elem_type  gs_elem_type
 *   18   2  count      elements in the payload
 *   20   4  seq        sequence number of the allreduce in the job (wraps)
 *   24   4  offset     index of the first element of this chunk in the tensor
 *   28   1  next_exp   int8: fixed32 block exponent (DATA: sender's, RESULT: maximum); ABORT: reason
 *   29   1  scale_exp  int8: fixed32 exponent this payload was quantised with
 *   30   2  window     DATA: its sender's window (rounds in flight) when it first sent the round
 *                       (0: none declared); RESULT: the smallest window the round's DATA declared
 *                       (gs_smaller_window), which an adaptive worker runs at (docs/protocol.md
 *                       4.2); other types: sent as 0
 */
struct gs_header {
  uint16_t magic;
  uint8_t version;
  uint8_t type;
  uint32_t job_id;
  uint32_t key;
  uint16_t rank;
  uint16_t slot;
  uint8_t flags;
  uint8_t elem_type;
  uint16_t count;
  uint32_t seq;
  uint32_t offset;
  int8_t next_exp;
  int8_t scale_exp;
  uint16_t window;
};

GS_STATIC_ASSERT(sizeof(struct gs_header) == GS_HEADER_BYTES, "gradswitch header must be 32 bytes");
GS_STATIC_ASSERT(offsetof(struct gs_header, job_id) == 4, "job_id offset");
GS_STATIC_ASSERT(offsetof(struct gs_header, key) == 8, "key offset");
GS_STATIC_ASSERT(offsetof(struct gs_header, rank) == 12, "rank offset");
GS_STATIC_ASSERT(offsetof(struct gs_header, slot) == 14, "slot offset");
GS_STATIC_ASSERT(offsetof(struct gs_header, flags) == 16, "flags offset");
GS_STATIC_ASSERT(offsetof(struct gs_header, elem_type) == 17, "elem_type offset");
GS_STATIC_ASSERT(offsetof(struct gs_header, count) == 18, "count offset");
GS_STATIC_ASSERT(offsetof(struct gs_header, seq) == 20, "seq offset");
GS_STATIC_ASSERT(offsetof(struct gs_header, offset) == 24, "offset offset");
GS_STATIC_ASSERT(offsetof(struct gs_header, next_exp) == 28, "next_exp offset");
GS_STATIC_ASSERT(offsetof(struct gs_header, scale_exp) == 29, "scale_exp offset");
GS_STATIC_ASSERT(offsetof(struct gs_header, window) == 30, "window offset");
GS_STATIC_ASSERT(GS_DEFAULT_PAYLOAD_BYTES >= 1400, "default payload must carry at least 1400 bytes");
/* float64 elements travel as the host's double: the in-memory and wire layouts must agree. */
GS_STATIC_ASSERT(sizeof(double) == 8 && DBL_MANT_DIG == 53 && DBL_MAX_EXP == 1024,
                 "float64 elements are IEEE 754 binary64, the host's double");
GS_STATIC_ASSERT(GS_DEFAULT_PAYLOAD_BYTES % 8 == 0, "the default payload holds whole float64 elements");
GS_STATIC_ASSERT(GS_MX8_BLOCK_BYTES == 33 &&
                     GS_DEFAULT_PAYLOAD_BYTES / GS_MX8_BLOCK_BYTES * GS_MX8_BLOCK == 1376,
                 "the default payload holds 43 whole mx8 blocks of 33 bytes (docs/protocol.md 2.2)");

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "gradswitch elements are little-endian on the wire; this host is not (add byte swaps first)"
#endif

static inline uint16_t gs_bswap16(uint16_t v) {
  return (uint16_t)((v >> 8) | (v << 8));
}
static inline uint32_t gs_bswap32(uint32_t v) {
  return __builtin_bswap32(v);
}

/* Size in bytes of one element on the wire; 0 for an unknown type. mx8's elements are 1 byte, but
 * its payloads also hold scale bytes: a payload's length is gs_payload_bytes, never count x this. */
static inline size_t gs_elem_size(uint8_t elem_type) {
  switch (elem_type) {
    case GS_ELEM_INT32:
    case GS_ELEM_FLOAT32:
    case GS_ELEM_FIXED32:
      return 4;
    case GS_ELEM_FLOAT64:
      return 8;
    case GS_ELEM_FLOAT16:
    case GS_ELEM_BFLOAT16:
      return 2;
    case GS_ELEM_MX8:
      return 1;
    default:
      return 0;
  }
}

/* Length in bytes of a payload of `count` elements; 0 for an unknown type (or count 0). */
static inline size_t gs_payload_bytes(uint8_t elem_type, size_t count) {
  if (elem_type == GS_ELEM_MX8) return count + (count + GS_MX8_BLOCK - 1) / GS_MX8_BLOCK;
  return count * gs_elem_size(elem_type);
}

/* The elements of a full chunk: the most that a payload of `payload_bytes` carries (mx8: whole
 * blocks only, so that chunks start on block boundaries); 0 for an unknown type. */
static inline size_t gs_max_count(uint8_t elem_type, size_t payload_bytes) {
  if (elem_type == GS_ELEM_MX8) return payload_bytes / GS_MX8_BLOCK_BYTES * GS_MX8_BLOCK;
  const size_t size = gs_elem_size(elem_type);
  return size ? payload_bytes / size : 0;
}

static inline const char* gs_elem_name(uint8_t elem_type) {
  switch (elem_type) {
    case GS_ELEM_INT32:
      return "int32";
    case GS_ELEM_FLOAT32:
      return "float32";
    case GS_ELEM_FIXED32:
      return "fixed32";
    case GS_ELEM_FLOAT16:
      return "float16";
    case GS_ELEM_BFLOAT16:
      return "bfloat16";
    case GS_ELEM_FLOAT64:
      return "float64";
    case GS_ELEM_MX8:
      return "mx8";
    default:
      return "unknown";
  }
}

/* The smaller of two declared windows, where 0 declares none: what a RESULT's `window` is over the
 * round's DATA (on a spine, over the racks' DATA, each the smallest of its rack's). */
static inline uint16_t gs_smaller_window(uint16_t a, uint16_t b) {
  if (a == 0) return b;
  return b != 0 && b < a ? b : a;
}

/* HELD's body: the open round's contributors, bit r for rank r, a big-endian 64-bit integer. A
 * receiver whose bit is clear is a rank the round lacks (docs/protocol.md section 3). */
#define GS_HELD_BODY_BYTES 8u

static inline uint64_t gs_held_contributors(const uint8_t* body) {
  uint64_t v;
  memcpy(&v, body, sizeof v);
  return __builtin_bswap64(v);
}

static inline void gs_held_set_contributors(uint64_t contributors, uint8_t* body) {
  const uint64_t v = __builtin_bswap64(contributors);
  memcpy(body, &v, sizeof v);
}

/* A PARTIAL RESULT's trailer, after its `count` elements: the contributors summed, bit r for rank r,
 * a big-endian 64-bit integer (read and written as HELD's body). A job with a deadline is told a
 * payload this much smaller at JOIN, so that a full PARTIAL RESULT still fits the MTU. */
#define GS_PARTIAL_TRAILER_BYTES 8u
GS_STATIC_ASSERT(GS_PARTIAL_TRAILER_BYTES == GS_HELD_BODY_BYTES, "PARTIAL's trailer is a contributor bitmap");

/* Decodes the header at `buf` into host byte order. The caller checks len >= GS_HEADER_BYTES. */
static inline void gs_header_decode(const void* buf, struct gs_header* h) {
  memcpy(h, buf, sizeof *h);
  h->magic = gs_bswap16(h->magic);
  h->job_id = gs_bswap32(h->job_id);
  h->key = gs_bswap32(h->key);
  h->rank = gs_bswap16(h->rank);
  h->slot = gs_bswap16(h->slot);
  h->count = gs_bswap16(h->count);
  h->seq = gs_bswap32(h->seq);
  h->offset = gs_bswap32(h->offset);
  h->window = gs_bswap16(h->window);
}

/* Encodes a host-order header into the 32 bytes at `buf`. */
static inline void gs_header_encode(const struct gs_header* h, void* buf) {
  struct gs_header n = *h;
  n.magic = gs_bswap16(n.magic);
  n.job_id = gs_bswap32(n.job_id);
  n.key = gs_bswap32(n.key);
  n.rank = gs_bswap16(n.rank);
  n.slot = gs_bswap16(n.slot);
  n.count = gs_bswap16(n.count);
  n.seq = gs_bswap32(n.seq);
  n.offset = gs_bswap32(n.offset);
  n.window = gs_bswap16(n.window);
  memcpy(buf, &n, sizeof n);
}

#ifdef __cplusplus
}
#endif

#endif /* GRADSWITCH_WIRE_H */
