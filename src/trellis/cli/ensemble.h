#pragma once
// Ensembles of classifiers: several members trained one after another with their own seeds
// (train's `ensemble` key) and evaluated together, each example's class probabilities being the
// mean of the members'. Averaging independently trained models cancels part of each one's
// errors; on short texts a few one-minute models beat one model trained for the same minutes
// (bench/RESULTS.md, "Ensembles").
//
// OUT/ensemble.json names the members' checkpoints (relative to OUT) and the ensemble's
// validation metrics; `eval` and `classify` take OUT as --checkpoint, or the members' directories.
#include <string>
#include <vector>

#include "trellis/cli/local_model.h"  // DType, CheckpointData

namespace trellis {

class Communicator;
struct ClassificationMetrics;
struct ExampleSet;
struct SequenceFormat;
struct TaskData;
struct TaskMeta;
struct TrainConfig;

inline constexpr const char* kEnsembleFile = "ensemble.json";

// The checkpoints `paths` stand for: a directory holding ensemble.json stands for its members.
std::vector<std::string> expand_ensembles(const std::vector<std::string>& paths);

// Adds the classifier ck's class probabilities for examples [0, n) of `set` to sum (n x classes,
// row-major), run in batches of batch_size with GEMMs in `compute`. tokenizer_dir: as LocalModel's.
// mirror: an image task's geometry, to add each image's probabilities mirrored left to right too.
void add_class_probabilities(CheckpointData& ck, const SequenceFormat& f, const ExampleSet& set,
                             int64_t n, int64_t batch_size, DType compute, std::vector<double>& sum,
                             const std::string& tokenizer_dir = "",
                             const TaskMeta* mirror = nullptr);

// A task checkpoint's sequence layout (its seq_len and patch_context) for the task directory dir
// holding `meta`, checked against it: task, classes, tokenizer, features. The one place a
// checkpoint's inputs are rebuilt from its record (eval, grad, ensembles).
SequenceFormat task_format(const CheckpointData& ck, const TaskMeta& meta, const std::string& dir);

// The metrics of the classifiers `members` as an ensemble on the first n validation examples of
// d, each member's inputs laid out as task_format gives. tta_flip (image tasks): each member also
// classifies every image mirrored, and its two probability vectors count as two members'
// (test-time augmentation).
ClassificationMetrics ensemble_validation(const std::vector<std::string>& members,
                                          const TaskData& d, int64_t n, int64_t batch_size,
                                          DType compute, bool tta_flip = false);

// `trellis train` with ensemble > 1: member k (1-based) is cfg with seed + k - 1 and out
// OUT/member_k. Under time_budget (the whole run's minutes) member k > 1 starts only when the
// minutes left fit the time member k - 1 took, so a data set too large for several members trains
// one, as without the key. Then rank 0 evaluates the ensemble on the whole validation split and
// writes OUT/ensemble.json.
int train_ensemble(const TrainConfig& cfg, Communicator& world);

}  // namespace trellis
