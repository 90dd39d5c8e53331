#pragma once
// Dataset preparation: corpus -> tokenizer -> train.bin / val.bin shards in an output directory, cached by a
// prepared.txt stamp; or pre-tokenized llm.c / nanoGPT shards used as they are.
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "config/train_config.hpp"

namespace longwave::models::data {

class tokenizer;

/// Where prepare_dataset() left the data, and its size.
struct prepared_dataset {
  std::string train_path;      ///< llm.c .bin shard of train tokens
  std::string val_path;        ///< llm.c .bin shard of validation tokens
  std::string tokenizer_path;  ///< load_tokenizer() file; empty for user shards that came without one
  std::string docs_path;       ///< read_document_starts() file of the train tokens; empty if there is none
  int64_t vocab_size = 0;      ///< every token id is below this
  int64_t n_train_tokens = 0;
  int64_t n_val_tokens = 0;
};

/// Prepares training data.
/// - If `input_path` is a directory holding train.bin and val.bin, they are validated and used in place;
///   vocab_size comes from a tokenizer.txt in that directory if present, else max token + 1.
/// - Otherwise the corpus is read (read_corpus), the `kind` of tokenizer (BPE: of `bpe_vocab_size`) is made,
///   the text is tokenized and the last `val_fraction` of the tokens become val. out_dir receives train.bin,
///   val.bin, tokenizer.txt, train.docs (where documents start: the byte offsets of CORPUS.docs when it
///   exists, else after each blank line; data/partition.hpp) and prepared.txt (input
///   path, size, mtime, tokenizer, vocab, val_fraction). A later call with the same inputs finds prepared.txt
///   matching and returns without re-tokenizing.
/// `log` receives progress lines ("data: ..."), and a "data: warning: ..." line when more than 1 % of the
/// corpus is not UTF-8. Throws lw_error(invalid_config) on bad arguments (unknown tokenizer, BPE vocab
/// outside 256..65536, val_fraction outside (0, 1), a directory without train.bin and val.bin),
/// lw_error(io_error) / lw_error(corrupt_data) from the files, and lw_error(corrupt_data) for a corpus that
/// is binary data rather than text (check_is_text).
prepared_dataset prepare_dataset(const std::string& input_path, config::tokenizer_kind kind,
                                 int64_t bpe_vocab_size, double val_fraction, const std::string& out_dir,
                                 std::function<void(const std::string&)> log = {});

/// The validation tokens prepare_dataset would write for corpus `input_path` if its tokenizer were `tok`: the
/// last `val_fraction` of the corpus's tokens, in memory (no cache). For scoring a model on text its run did
/// not read. Throws as prepare_dataset for a missing, binary or too small corpus.
std::vector<uint16_t> validation_tokens(const std::string& input_path, const tokenizer& tok,
                                        double val_fraction,
                                        const std::function<void(const std::string&)>& log = {});

/// The data prepare_dataset would return for these arguments if `dir` already holds it, without writing
/// anything (no directory, no lock): for readers of another run's cache. A directory `input_path` is used in
/// place as there. Otherwise nullopt, and `why` says what `dir` lacks. Throws as prepare_dataset for bad
/// arguments or a missing corpus.
std::optional<prepared_dataset> find_prepared(const std::string& input_path, config::tokenizer_kind kind,
                                              int64_t bpe_vocab_size, double val_fraction,
                                              const std::string& dir, std::string& why);

/// The vocabulary a model trained on `input_path` gets, before any preparation: a directory of shards gives
/// its tokenizer.txt's (none: its largest token id + 1, which reads the shards), a corpus the tokenizer's
/// (BPE: its target size). Throws as prepare_dataset for a directory without train.bin and val.bin.
int64_t data_vocab(const std::string& input_path, config::tokenizer_kind kind, int64_t bpe_vocab_size);

/// The vocabulary a config's model gets: model.vocab_size, else data_vocab of its data.path (one the run
/// would refuse counts as a corpus here).
int64_t config_vocab(const config::train_config& cfg);

/// The corpus a prepared directory's prepared.txt says it was made from; "" when `dir` holds no stamp of
/// ours (user shards, or nothing).
std::string prepared_from(const std::string& dir);

/// Removes a prepared data directory unless a process is preparing it (holds its preparation lock, which is
/// taken for the removal). True when it is gone.
bool remove_unless_preparing(const std::string& dir);

/// 16 hex digits naming a preparation's arguments (the corpus's absolute path, tokenizer, vocab,
/// val_fraction): a private cache directory per preparation.
std::string data_cache_key(const std::string& input_path, config::tokenizer_kind kind, int64_t bpe_vocab_size,
                           double val_fraction);

}  // namespace longwave::models::data
