#pragma once
// Checkpoint store: named binary blobs plus round/step/meta, written atomically to a directory as
// checksummed ckpt-<round>-<step>.lwc files, pruned to the newest `keep`, loaded newest-valid-first.
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace longwave::runtime {

/// One named byte range of a checkpoint.
///
/// For writing, `owner` keeps the bytes at `data` alive (a tensor, a vector...). A loaded blob owns its bytes
/// in `storage` and `data` points into it. Moving a blob keeps `data` valid; copying a loaded blob does not
/// (the copy's `data` still points into the source's `storage`), so move loaded blobs, never copy them.
struct checkpoint_blob {
  std::string name;                   ///< e.g. "theta_global", "worker0/exp_avg"
  std::shared_ptr<const void> owner;  ///< keeps `data` alive; null for loaded blobs
  const void* data = nullptr;         ///< first byte; may be null when size == 0
  size_t size = 0;                    ///< number of bytes
  std::vector<char> storage;          ///< the bytes of a loaded blob (`data` points into it)
};

/// A snapshot of the training state.
struct checkpoint {
  uint64_t round = 0;  ///< completed outer rounds
  uint64_t step = 0;   ///< this node's inner steps at the time of the snapshot
  std::string meta;    ///< free-form text (e.g. resolved config / key=value lines)
  std::vector<checkpoint_blob> blobs;
  std::string source;  ///< the file it was read from (load_file, load_latest); "" for one built to be written

  /// The first blob called `name`, or nullptr if there is none.
  const checkpoint_blob* find(std::string_view name) const;
  /// The CRC-32C of the "theta" blob (0: none): the checksum nodes compare theta by.
  uint32_t theta_crc() const;
};

/// A round a directory holds a valid checkpoint of, and which training history: the CRC-32C of its first
/// file's (the round's boundary's) theta, continued over a delayed run's pending average (0: no theta). Two
/// nodes that trained one history hold the same; two that reached the round apart, another.
struct held_round {
  uint64_t round = 0;
  uint32_t history = 0;
  bool operator==(const held_round& o) const { return round == o.round && history == o.history; }
};

/// The folder of a checkpoint directory that set_aside moves states of another history into.
inline constexpr const char* superseded_dir_name = "superseded";
/// The folder of a checkpoint directory that set_aside_corrupt moves files that fail their checks into.
inline constexpr const char* corrupt_dir_name = "corrupt";
/// The folder that set_aside_corrupt moves another build's files into, intact (moved back, that build resumes
/// from them).
inline constexpr const char* other_build_dir_name = "other-build";

/// An entry of a checkpoint directory that is not a checkpoint (checkpoint_store::stray_files).
struct stray_file {
  std::string path;
  std::string reason;             ///< e.g. "not a checkpoint file"
  bool unfinished_write = false;  ///< ckpt-<round>-<step>.lwc.tmp: a write that never finished
};

/// A directory of checkpoint files. Not thread-safe: one owner (the checkpointer) calls it.
class checkpoint_store {
 public:
  /// Creates `dir` and its parents. Throws lw_error(io_error) if that fails and lw_error(invalid_config) if
  /// keep < 1.
  checkpoint_store(std::string dir, int64_t keep);
  int64_t keep() const { return keep_; }

  /// Writes atomically: <dir>/ckpt-<round %08>-<step %010>.lwc.tmp, write, fsync, rename, fsync the
  /// directory; then deletes all but the newest `keep` checkpoint files (never the one just written). More
  /// than `keep` before the write (keep was lowered) are pruned to `keep` first, which frees a full disk.
  /// Returns the final path. Throws lw_error(io_error) naming the path and the system error; the newest
  /// `keep` previous checkpoints are intact.
  std::string write(const checkpoint& c);
  /// The file a checkpoint of this round and step is written to.
  std::string path_of(uint64_t round, uint64_t step) const;
  /// The checkpoint this run resumed from: until a write succeeds (it then stands on its own file), the prune
  /// before a write never deletes it. Without one, that prune spares the newest file that loads, which may
  /// be one the run refused.
  void stand_on(std::string path) { standing_ = std::move(path); }

  /// The newest valid checkpoint, or std::nullopt if the directory holds no checkpoint file. A file that
  /// fails validation is skipped with one line to `warn` ("checkpoint <file> is corrupt (<reason>); falling
  /// back to <older file>") and the next older one is tried. Throws lw_error(corrupt_checkpoint) if files
  /// exist but none is valid, rather than silently starting over.
  /// `accept`, when given, sees each valid file's checkpoint newest first and may take its contents (the one
  /// returned is then emptied); a lw_error(corrupt_checkpoint) it throws skips that file the same way ("does
  /// not fit this run (<reason>)"), and anything else it throws ends the search. `corrupt`, when given,
  /// receives the files that failed their checks or that `accept` refused (not those that could not be read).
  std::optional<checkpoint> load_latest(const std::function<void(const std::string&)>& warn = {},
                                        const std::function<void(checkpoint&)>& accept = {},
                                        std::vector<std::string>* corrupt = nullptr) const;

  /// Loads and validates one file. Throws lw_error(corrupt_checkpoint, "<path>: <reason>") if it is invalid
  /// and lw_error(io_error) if it cannot be opened or read.
  static checkpoint load_file(const std::string& path);

  /// The valid checkpoints, oldest first, one per round: what a node can resume from, and which training
  /// history each holds. Every file is read and checked; a corrupt one is left out with one line to `warn`.
  std::vector<held_round> held_rounds(const std::function<void(const std::string&)>& warn = {}) const;

  /// Moves the checkpoint files of round `from_round` and later into a new set dir/superseded/<unix seconds>/
  /// (<seconds>-<k> for another set of that second): states the node does not resume from, kept for a person
  /// to look at; nothing reads them. The newest `keep` sets stay: older ones are removed, their paths added
  /// to `pruned`. Returns the new paths; throws lw_error(io_error) if a move fails.
  std::vector<std::string> set_aside(uint64_t from_round, std::vector<std::string>* pruned = nullptr) const;

  /// Moves `path`, a file of this directory that failed its checks, to dir/corrupt/<name> (<name>.<k> when
  /// that is taken): out of the way of every later start, kept for a person to look at; nothing reads it.
  /// A file of a format version another build writes (no damage) goes to dir/other-build/ instead: the run
  /// that goes on from an older checkpoint would write its name over it. Returns the new path. Throws
  /// lw_error(io_error) if the move fails.
  std::string set_aside_corrupt(const std::string& path) const;

  /// Full paths of the checkpoint files in the directory, oldest (lowest round, then step) first. Ignores
  /// .tmp files and anything else not named ckpt-<round>-<step>.lwc. A missing directory lists nothing; one
  /// that cannot be read throws lw_error(io_error).
  std::vector<std::string> list() const;

  /// Entries of the directory that list() leaves out, with the reason: unfinished writes (`.tmp`) and
  /// anything else not named like a checkpoint. The caller says what it found. (Files named like a checkpoint
  /// that are not one are reported by load_latest, and never counted towards `keep` nor pruned by write; a
  /// training start moves them to corrupt/.)
  std::vector<stray_file> stray_files() const;

  /// The checkpoint directory.
  const std::string& dir() const;

  /// CRC-32C (Castagnoli, reflected, as in iSCSI/ext4), slicing-by-8. Chain calls by passing the previous
  /// result as `crc`: crc32c(b, nb, crc32c(a, na)) == crc32c(a+b).
  static uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

 private:
  /// Deletes the oldest checkpoint files past the newest `keep_`: never `spare` (a file just written, or the
  /// one the run stands on), and without one never the newest file that loads.
  void prune(const std::string& spare) const;

  std::string dir_;
  int64_t keep_;
  std::string standing_;
};

}  // namespace longwave::runtime
