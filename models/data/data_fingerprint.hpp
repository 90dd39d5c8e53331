#pragma once
// A cheap fingerprint of a run's training data, which the nodes of a cluster compare: a node that reads
// another corpus is turned away with a line naming it instead of training the model on other data.
#include <cstdint>
#include <string>

namespace longwave::models::data {

/// The fingerprint of a data input as prepare_dataset reads it (a corpus file, or a directory holding
/// train.bin and val.bin): each file's size and the CRC-32C of its first, middle and last MiB, mixed. Never
/// 0; 0 only when the input cannot be read (data preparation then names the problem).
uint64_t data_fingerprint(const std::string& input_path);

}  // namespace longwave::models::data
