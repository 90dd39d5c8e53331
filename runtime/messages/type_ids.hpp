#pragma once
// All CAF atoms and message types of Longwave, in one type-ID block. Atom text is at most 10 characters.
#include <caf/all.hpp>

#include "runtime/errors/errors.hpp"
#include "runtime/messages/messages.hpp"

CAF_ERROR_CODE_ENUM(longwave::errc, "longwave")

// Payloads holding at::Tensor are process-local: they are never serialized.
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(at::Tensor)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(std::vector<at::Tensor>)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(longwave::runtime::replica_state)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(longwave::runtime::round_result)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(longwave::runtime::step_report)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(longwave::runtime::train_snapshot)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(longwave::runtime::residual_map)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(longwave::runtime::ring_label)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(longwave::runtime::reduce_request)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(longwave::runtime::reduced)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(longwave::runtime::outer_snapshot)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(longwave::runtime::eager_thetas)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(longwave::runtime::merge_order)

CAF_BEGIN_TYPE_ID_BLOCK(longwave, caf::first_custom_type_id)
CAF_ADD_ATOM(longwave, longwave::runtime, run_atom, "run")            // worker: run an inner round
CAF_ADD_ATOM(longwave, longwave::runtime, step_atom, "step")          // worker: one inner step (to self)
CAF_ADD_ATOM(longwave, longwave::runtime, grad_atom, "grad")          // worker (ddp): compute a gradient
CAF_ADD_ATOM(longwave, longwave::runtime, apply_atom, "apply")        // worker (ddp): apply averaged grad
CAF_ADD_ATOM(longwave, longwave::runtime, eval_atom, "eval")          // worker: validation loss of theta
CAF_ADD_ATOM(longwave, longwave::runtime, state_atom, "state")        // get a resumable state
CAF_ADD_ATOM(longwave, longwave::runtime, load_atom, "load")          // install a resumable state
CAF_ADD_ATOM(longwave, longwave::runtime, reduce_atom, "reduce")      // communicator: average tensors
CAF_ADD_ATOM(longwave, longwave::runtime, outer_atom, "outer")        // outer optimizer: apply delta
CAF_ADD_ATOM(longwave, longwave::runtime, theta_atom, "theta")        // outer optimizer: current theta
CAF_ADD_ATOM(longwave, longwave::runtime, replicas_atom, "replicas")  // outer: each replica's start theta
CAF_ADD_ATOM(longwave, longwave::runtime, set_atom, "set")        // replace theta (outer) or weights (worker)
CAF_ADD_ATOM(longwave, longwave::runtime, save_atom, "save")      // checkpointer: write a snapshot
CAF_ADD_ATOM(longwave, longwave::runtime, flush_atom, "flush")    // checkpointer: wait for writes
CAF_ADD_ATOM(longwave, longwave::runtime, gauge_atom, "gauge")    // metrics: set a gauge
CAF_ADD_ATOM(longwave, longwave::runtime, count_atom, "count")    // metrics: add to a counter
CAF_ADD_ATOM(longwave, longwave::runtime, start_atom, "start")    // coordinator: begin training
CAF_ADD_ATOM(longwave, longwave::runtime, stop_atom, "stop")      // coordinator: stop (Ctrl-C)
CAF_ADD_ATOM(longwave, longwave::runtime, done_atom, "done")      // coordinator -> main: finished
CAF_ADD_ATOM(longwave, longwave::runtime, report_atom, "report")  // worker -> coordinator: step report
CAF_ADD_ATOM(longwave, longwave::runtime, pause_atom, "pause")    // worker: stop stepping (Ctrl-C)
CAF_ADD_ATOM(longwave, longwave::runtime, observe_atom, "observe")  // metrics: histogram observation
CAF_ADD_ATOM(longwave, longwave::runtime, record_atom, "record")    // metrics: append to metrics.jsonl
CAF_ADD_ATOM(longwave, longwave::runtime, eager_atom, "eager")      // outer optimizer: eager proxy steps
CAF_ADD_ATOM(longwave, longwave::runtime, mix_atom, "mix")          // worker: mix in a synced fragment
CAF_ADD_ATOM(longwave, longwave::runtime, lost_atom, "lost")        // coordinator: a ring peer left (to self)
CAF_ADD_ATOM(longwave, longwave::runtime, hold_atom, "hold")        // coordinator: a cluster stop's hold
CAF_ADD_ATOM(longwave, longwave::runtime, merge_atom, "merge")      // coordinator: an async merge (main)
CAF_ADD_ATOM(longwave, longwave::runtime, prepare_atom, "prepare")  // outer optimizer: compute a step early
CAF_ADD_ATOM(longwave, longwave::runtime, copied_atom, "copied")    // worker: is a state copy done (to self)
CAF_END_TYPE_ID_BLOCK(longwave)
