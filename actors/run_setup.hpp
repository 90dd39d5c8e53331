#pragma once
// The start-up checks of one run and the state its actors share: the corpus, the model shape checked against
// the config, --dry-run's summary, and the run_context with the prepared data.
#include <functional>
#include <memory>
#include <string>

#include "actors/run_context.hpp"
#include "actors/training.hpp"
#include "config/train_config.hpp"
#include "models/data/dataset_prep.hpp"
#include "models/device.hpp"
#include "models/model_spec.hpp"
#include "runtime/checkpoint/snapshot_codec.hpp"

namespace longwave::actors {

/// data.path, or the bundled default corpus; a config_error on data.path when the file is missing.
std::string corpus_path(const config::train_config& cfg);
/// "" when `path` (which exists) may be a corpus: a regular file or a directory; else why not.
std::string not_a_corpus(const std::string& path);

/// A directory the run writes in, made now: one that cannot be (too long a name, no permission, a dangling
/// link or a file on the way) is a config error naming the key that chose it.
void make_run_directory(const std::string& key, const std::string& dir);
/// The directory `corpus` is tokenized into (unless it is a directory of shards), made now: a config error
/// names data.cache_dir, or run.out_dir when the data goes under it.
void make_data_directory(const config::train_config& cfg, const std::string& corpus,
                         const std::string& data_dir);

/// `corpus` tokenized as [data] says into data_dir, or found cached there (models::data::prepare_dataset);
/// its progress lines go to `log`, else to the log at info.
models::data::prepared_dataset prepare_data(const config::train_config& cfg, const std::string& corpus,
                                            const std::string& data_dir,
                                            std::function<void(const std::string&)> log = {});

/// The data of a run that this process only reads (eval): the run's shards in data_dir when they are there
/// and match [data]; otherwise prepared into a private cache (cache_root()/eval-data/KEY), so that another
/// run's data directory is never rewritten nor a foreign checkpoint's out_dir made here. A private copy whose
/// validation set holds no window of `seq_len` is refused (lw_error invalid_config) and not kept.
models::data::prepared_dataset find_or_prepare_data(const config::train_config& cfg,
                                                    const std::string& corpus, const std::string& data_dir,
                                                    int64_t seq_len);

/// The model shape of a config on its corpus (corpus_path; a shard directory gives its vocabulary), checked
/// against what the config asks of it (before any file is written).
models::model_spec model_spec_of(const config::train_config& cfg, const std::string& corpus);

/// Where each worker runs (train.device, train.autocast), checked before any file is touched: throws
/// lw_error(invalid_config) naming the key when this build or machine cannot run it, or config_error naming
/// train.batch_size when the workers' memory estimate over-fills a GPU. Applies train.deterministic.
models::device_plan plan_devices(const config::train_config& cfg, const models::model_spec& spec);

/// The memory estimate of one worker on a GPU (models::training_memory_bytes of one micro-batch).
int64_t gpu_worker_bytes(const config::train_config& cfg, const models::model_spec& spec);

/// --dry-run: the resolved config, the model's size, the devices and the memory estimate, on stdout.
void print_dry_run(const config::train_config& cfg, const models::model_spec& spec,
                   const models::device_plan& devices);

/// Everything the actors share: the data (prepared in data_dir or reused), the final model shape, threads,
/// the workers' devices, this node's cluster and its place there (none alone), streaming's fragments. Checks
/// the data against the sampling plan, so a bad corpus is a clear error before any actor starts.
std::shared_ptr<run_context> make_context(const config::train_config& cfg, models::model_spec spec,
                                          const std::string& corpus, const std::string& data_dir,
                                          const models::device_plan& devices, cluster_link& cluster);

/// What a checkpoint must match to be resumed by this run.
runtime::snapshot_shape shape_of(const run_context& ctx);

}  // namespace longwave::actors
