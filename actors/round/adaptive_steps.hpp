#pragma once
// diloco.adaptive_steps, dynamic local updates (Liu et al. 2024, "Asynchronous Local-SGD"): each node runs
// the inner steps that fit in the fastest node's H-step time, so the nodes reach the round's all-reduce
// together, and the average weights each node by the tokens it trained.
#include <cstdint>
#include <vector>

#include "comm/collective.hpp"

namespace longwave::actors {

/// This node's inner steps for a round: H * fastest / own rounded, within [floor, H]. H while either time is
/// unknown (0), or when own is within 5 % of the fastest (noise must not cost equal nodes a step).
int64_t adaptive_steps(int64_t H, int64_t floor, double own_step_s, double fastest_step_s);

/// The fastest step time known: the smallest non-zero among the notes and own (0: none known).
double fastest_step(const std::vector<comm::rank_note>& notes, double own_step_s);

/// A node's weight in the round's average: its workers times its share of the round's steps, h / H (the
/// tokens it trained, in units of one worker's full round). h = H gives the worker count, the weight
/// without adaptive steps.
double round_weight(int64_t workers, int64_t h, int64_t H);

/// The workers behind the last average, from every node's note (eager divides by this count, not by the
/// token weight); 0 when the notes are not known.
double contributing_workers(const std::vector<comm::rank_note>& notes);

}  // namespace longwave::actors
