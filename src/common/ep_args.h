// Expert parallelism as the backends see it (docs/ep.md): the routing of every source rank's
// slots to destination ranks and rows, and the two row movements over it, for `ranks` ranks
// held by one process (the loopback transport: every rank; a multi-process transport: one).
#pragma once

#include <stdint.h>

#include "sfmoe/numerics/bits.h"
#include "sfmoe/sfmoe.h"
#include "src/common/fault.h"

namespace sfmoe {

// The device loopback passes every rank's pointers by value: up to this many ranks.
constexpr int64_t kMaxDeviceEpRanks = 64;

// One rank's routing: what dispatch writes and the other calls read (the handle).
struct EpRankRouting {
  int32_t* send_rank;      // [T, k]: the destination rank of each slot, -1 dropped or invalid
  int64_t* send_row;       // [T, k]: its row there (with an exchange: its row in the pair's
                           // staging block), -1 likewise
  int64_t* offsets;        // [rounds (E_l + 1)]: each round's local-expert blocks (padded), counted
                           // from the round's first row
  int64_t* kept;           // [rounds E_l]: rows kept per group (round-major)
  int64_t* routed;         // [E_l]: rows sent to each local expert before the capacity
  int64_t* dropped;        // [E]: this rank's rows dropped, by global expert
  int32_t* route_scratch;  // the device routing's per-chunk counts (ep_route_scratch_bytes)
  // With an exchange only (EpRankExchange; else NULL): what the ranks tell each other.
  int64_t* expert_counts;    // [E]: this rank's slots naming each global expert
  int64_t* all_counts;       // [R, E]: every rank's expert_counts
  int64_t* expert_kept;      // [E, 2]: this rank's rows kept by each expert, per round
  int64_t* all_kept;         // [R, E, 2]: every rank's expert_kept
  int64_t* bases;            // [R + E]: the rows earlier ranks send each destination, and each
                             // expert (once the kept counts are known: the rows of each expert
                             // they keep)
  int64_t* expert_rows;      // [4, E]: each expert's first row at its rank in rounds 0 and 1, and
                             // its rows kept in rounds 0 and 1 (all ranks')
  int64_t* expert_position;  // [T, k]: each slot's place among this rank's slots to its expert
  int64_t* received_from;    // [R]: the rows this rank keeps from each source
  int64_t* received_row;     // [R, P]: this rank's row of each source's staging row i
  int64_t* rank;             // [1]: this process's rank, as the routing read it (where it runs)
};

struct EpShape {
  int64_t world;             // R
  int64_t experts_per_rank;  // E_l
  int64_t top_k;
  int64_t row_alignment;
  int64_t receive_capacity;  // rows a rank keeps at most in the first round
  int64_t receive_rows;      // rows of a rank's received buffer (both rounds)
  int64_t rounds;            // 2 with SPILL, else 1
  int64_t spill_capacity;    // the second round's rows at most (0 with one round)
  int64_t spill_row_base;    // the second round's first row
  int64_t pair_capacity;     // rows a source sends one rank at most (INT64_MAX: no bound)
};

// Group g = round * E_l + local expert; its offsets start at offsets[round (E_l + 1)], counted
// from the round's first row.
SFMOE_HD int64_t ep_round_base(const EpShape& s, int64_t round) {
  return round == 0 ? 0 : s.spill_row_base;
}
SFMOE_HD int64_t ep_group_begin(const EpShape& s, const int64_t* offsets, int64_t group) {
  const int64_t round = group / s.experts_per_rank, e = group % s.experts_per_rank;
  return ep_round_base(s, round) + offsets[round * (s.experts_per_rank + 1) + e];
}
// The padding rows of group g, [its kept rows' end, its block's end), clamped into the rank's
// buffer: offsets and counts from a handle that no dispatch wrote give wrong rows, never a write
// outside [0, receive_rows) (nor an overflow on the way).
struct EpRows {
  int64_t begin, end;
};
SFMOE_HD int64_t ep_clamp_rows(int64_t v, int64_t most) {
  return v < 0 ? 0 : (v > most ? most : v);
}
SFMOE_HD EpRows ep_group_padding(const EpShape& s, const int64_t* offsets, const int64_t* kept,
                                 int64_t group) {
  const int64_t round = group / s.experts_per_rank, e = group % s.experts_per_rank;
  const int64_t* o = offsets + round * (s.experts_per_rank + 1);
  const int64_t rows = s.receive_rows, base = ep_round_base(s, round);
  const int64_t block = base + ep_clamp_rows(o[e], rows);
  const int64_t begin = ep_clamp_rows(block + ep_clamp_rows(kept[group], rows), rows);
  const int64_t end = ep_clamp_rows(base + ep_clamp_rows(o[e + 1], rows), rows);
  return EpRows{begin, end > begin ? end : begin};
}

// The round of the row at position p of a destination's (source, token, slot) list: 0, 1, or -1
// (dropped).
SFMOE_HD int64_t ep_round_of(const EpShape& s, int64_t position) {
  if (position < s.receive_capacity) return 0;
  if (s.rounds > 1 && position - s.receive_capacity < s.spill_capacity) return 1;
  return -1;
}

// The per-rank transports (NCCL; ranks emulated in one process for tests): this process holds
// one rank, and the ranks meet only in these collectives, enqueued on the caller's stream with
// sizes fixed on the host (so that a step captures in one CUDA graph).
class EpExchange {
 public:
  virtual ~EpExchange() = default;
  // recv[q bytes, (q + 1) bytes) = rank q's send, for every rank q.
  virtual sfmoe_status all_gather(const void* send, void* recv, int64_t bytes, void* stream) = 0;
  // recv[q pair_bytes, ...) = rank q's send[this rank's pair_bytes, ...), for every rank q.
  virtual sfmoe_status all_to_all(const void* send, void* recv, int64_t pair_bytes,
                                  void* stream) = 0;
  // Whether the work between the previous exchange and the next one is this call's: always, but
  // for a staged exchange (the EXTERNAL transport, src/ops/ep_stages.h), whose calls each run the
  // work of one stage and leave the collectives between two stages to the caller.
  virtual bool runs() const { return true; }
};

// The group's exchange and staging, for a process that holds one rank: the moves go through
// fixed blocks of pair_rows rows per pair of ranks (bytes proportional to the capacity); a
// block's first rows are the ones the pair really has, in the source's (token, slot) order.
struct EpRankExchange {
  EpExchange* exchange;
  int64_t rank;
  const int32_t* rank_device;  // EXTERNAL: [1], the rank read where the routing runs (the
                               // program is the same on every rank); NULL: `rank`
  int64_t pair_rows;           // P: rows of each pair's block
  int64_t staging_row_bytes;   // the widest row a block holds
  void* send_rows;             // [R, P, staging_row_bytes] each
  void* recv_rows;
  void* send_scales;  // [R, P, scale bytes] each (FP8 payloads), else NULL
  void* recv_scales;
  float* send_values;  // [R, P] each: one value per row (probabilities, d probs)
  float* recv_values;
  int64_t* send_index;  // [R, P]: dispatch's rows at the destinations
};

// A per-rank transport's decision for a slot at `position` in its destination's list and
// `in_pair` among its source's slots to that destination (pair_rows: the pair's block): kept in
// a round, or dropped past the capacities (overflow) or past the block, which only a token naming
// an expert twice can reach (bad_index).
struct EpKeep {
  int64_t round;
  bool kept, overflow, bad_index;
};
SFMOE_HD EpKeep ep_keep_of(const EpShape& s, int64_t position, int64_t in_pair, int64_t pair_rows) {
  const int64_t round = ep_round_of(s, position);
  const bool over_pair = in_pair >= s.pair_capacity, fits = in_pair < pair_rows;
  EpKeep k;
  k.round = round;
  k.overflow = round < 0 || over_pair;
  k.bad_index = !fits && !over_pair;
  k.kept = !k.overflow && !k.bad_index;
  return k;
}

// A per-rank transport's rank: `rank_device` (EXTERNAL: read where the routing runs) or `rank`;
// one outside [0, world) raises SFMOE_FAULT_BAD_INDEX (its value) and is taken as the nearest.
SFMOE_HD int64_t ep_checked_rank(int64_t rank, const int32_t* rank_device, int64_t world,
                                 sfmoe_fault_report* word) {
  const int64_t r = rank_device != nullptr ? *rank_device : rank;
  if (r >= 0 && r < world) return r;
  if (word != nullptr) raise_fault(word, SFMOE_FAULT_BAD_INDEX, r, world);
  return r < 0 ? 0 : world - 1;
}

// A per-rank transport's routing, from every rank's kept counts (expert_rows' kept0 and kept1
// filled): destination d's padded blocks (each of its experts' first row per round, into
// expert_rows' begin0 and begin1) and, for this rank's own, its offsets and kept counts.
SFMOE_HD void ep_destination_blocks(const EpShape& s, const EpRankRouting& h, int64_t d,
                                    int64_t rank) {
  const int64_t El = s.experts_per_rank, E = s.world * El, a = s.row_alignment;
  for (int64_t round = 0; round < s.rounds; ++round) {
    const int64_t* kept = h.expert_rows + (round == 0 ? 2 : 3) * E;
    int64_t* begin = h.expert_rows + (round == 0 ? 0 : 1) * E;
    int64_t row = 0;
    for (int64_t l = 0; l < El; ++l) {
      const int64_t e = d * El + l;
      begin[e] = ep_round_base(s, round) + row;
      if (d == rank) {
        h.offsets[round * (El + 1) + l] = row;
        h.kept[round * El + l] = kept[e];
      }
      row += (kept[e] + a - 1) / a * a;
    }
    if (d == rank) h.offsets[round * (El + 1) + El] = row;
  }
}

// The device routing takes the slots (source rank, token, slot) in chunks of kEpRouteChunk: for
// each chunk, how many slots name each global expert and each destination rank (INT32, [E + R]
// keys x chunks, in the first routing's handle), then each key's prefix over the chunks.
constexpr int64_t kEpRouteChunk = 1024;
inline int64_t ep_route_chunks(int64_t slots) {
  return (slots + kEpRouteChunk - 1) / kEpRouteChunk;
}
inline int64_t ep_route_scratch_bytes(const EpShape& s, int64_t slots) {
  return (s.world * s.experts_per_rank + s.world) * ep_route_chunks(slots) * 4;
}

// The routing of all R ranks (the loopback holds them all): each source rank's slots in order
// (source rank, token, slot); a destination keeps its first receive_capacity rows; within a
// local expert, rows by (source rank, token).
struct EpRouteArgs {
  EpShape shape;
  const int64_t* tokens;           // [R]: T of each source rank
  const int32_t* const* topk_ids;  // [R] -> [T_r, k]
  const EpRankRouting* routing;    // [R], written
  bool trap;                       // raise SFMOE_FAULT_EP_OVERFLOW on a drop (TRAP, SPILL)
  sfmoe_fault_report* word;        // or NULL: bad ids and overflow
  const EpRankExchange* exchange;  // NULL: every rank above (loopback); else this process's one
};

// Whether a handle's slot names a row inside a rank's buffer: the moves skip any other, so a
// handle that no dispatch of this group wrote can give wrong rows but never an access outside
// the buffers.
SFMOE_HD bool ep_slot_sent(int64_t rank, int64_t row, int64_t world, int64_t receive_rows) {
  return rank >= 0 && rank < world && row >= 0 && row < receive_rows;
}

// The order of combine's backward d probs, <d_out[t], rows[row]> over h, on both backends: the
// device's summation, written down so that the host gives the same bits. Element h belongs to
// lane (h / V) mod kEpDotLanes (V = 8 when hidden is a multiple of 8, else 1); each lane sums its
// elements' FP32 products in increasing h; then the lanes pairwise, halving: for w = 128, ..., 1,
// lane j < w adds lane j + w. Rounding once per product and per sum, no fused multiply-add.
constexpr int64_t kEpDotLanes = 256;
inline int64_t ep_dot_vector(int64_t hidden) { return hidden % 8 == 0 ? 8 : 1; }

// Rows from the sources' token rows to the destinations' received rows (dispatch: weights NULL,
// rows NULL, d_probs NULL; the bytes moved as they are, and scale_bytes of scales beside each
// row), or the weighted gradient to them with d probs (combine's backward).
struct EpScatterArgs {
  EpShape shape;
  int64_t hidden;
  const int64_t* tokens;          // [R]
  const void* const* token_rows;  // [R] -> [T_r, hidden]
  sfmoe_dtype token_dtype;
  const float* const* probs;  // [R] -> [T_r, k], or NULL: weight 1
  const void* const* rows;    // [R] -> [receive_rows, hidden] (combine's forward rows), or
                              // NULL: no d probs
  sfmoe_dtype rows_dtype;
  float* const* d_probs;         // [R] -> [T_r, k], or NULL
  const EpRankRouting* routing;  // [R]
  void* const* out_rows;         // [R] -> [receive_rows, hidden]
  sfmoe_dtype out_dtype;
  int64_t scale_bytes;              // dispatch: bytes of scales beside each row, or 0
  const void* const* token_scales;  // [R] -> [T_r, scale_bytes], or NULL
  void* const* out_scales;          // [R] -> [receive_rows, scale_bytes], or NULL
  const EpRankExchange* exchange;   // NULL: every rank above (loopback); else this process's one
};

// Rows from the destinations back to the sources' tokens: out[t] = sum_i w[t, i] rows[slot],
// FP32 in slot order (combine; dispatch's backward with weights NULL).
struct EpGatherArgs {
  EpShape shape;
  int64_t hidden;
  const int64_t* tokens;    // [R]
  const void* const* rows;  // [R] -> [receive_rows, hidden]
  sfmoe_dtype rows_dtype;
  const float* const* probs;     // [R] -> [T_r, k], or NULL
  const EpRankRouting* routing;  // [R]
  void* const* out;              // [R] -> [T_r, hidden]
  sfmoe_dtype out_dtype;
  const EpRankExchange* exchange;  // NULL: every rank above (loopback); else this process's one
};

// One FP32 value per slot between the sources' slots and the destinations' rows (the layer's
// row probabilities and d probs): to_rows: out[d][row] = in[s][slot] for each sent slot (other
// rows untouched); else out[s][slot] = in[d][row], 0 for a slot not sent.
struct EpSlotValuesArgs {
  EpShape shape;
  const int64_t* tokens;         // [R]
  const EpRankRouting* routing;  // [R]
  bool to_rows;
  const float* const* in;          // [R] -> [T_r k] or [receive_rows]
  float* const* out;               // [R] -> [receive_rows] or [T_r k]
  const EpRankExchange* exchange;  // NULL: every rank above (loopback); else this process's one
};

}  // namespace sfmoe
