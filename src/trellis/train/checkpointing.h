#pragma once
// Saving training checkpoints from every rank at once, synchronously or from a background thread
// (--async-save), as io/sharded_checkpoint.h lays them out.
//
// A save is collective: every rank calls save() at the same step with what it owns
// (OwnedArrays). Synchronously, each rank writes its shard, then rank 0 merges the piece lists
// into index.json and renames the directory into place. Asynchronously, each rank copies its
// arrays into a host snapshot and a thread writes them while training goes on; the commit (the
// index and the rename, which need every rank's file) happens at the first poll() that finds all
// writers done, at the next save, or at finish(). A failed write is an error on every rank.
#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "nlohmann/json.hpp"
#include "trellis/io/sharded_checkpoint.h"

namespace trellis {

class Communicator;

class Checkpointer {
 public:
  // Collective: rank 0 removes what killed saves left in out_dir (.step_*.tmp directories).
  Checkpointer(Communicator& world, std::string out_dir, bool async);
  // Joins a running writer; an uncommitted save stays under its temporary name.
  ~Checkpointer();
  Checkpointer(const Checkpointer&) = delete;
  Checkpointer& operator=(const Checkpointer&) = delete;

  // Collective. Saves step: this rank's owned arrays of `layout`; rank 0 also writes the small
  // files (name -> text: config.json, state.json) and index fields (`index_extra`). The arrays
  // may change once it returns (async: they were copied). Returns the seconds the caller was
  // blocked: waiting for the previous save, the snapshot, and (sync) the whole write.
  // `name`: the directory under out_dir; empty = step_NNNNNNNN. A named checkpoint (OUT/best)
  // replaces the one of that name atomically (the directories are exchanged, so a reader sees
  // the old one or the new one, never neither) and is not last_committed().
  double save(int64_t step, const ParamLayout& layout, const OwnedArrays& owned,
              const std::vector<std::pair<std::string, std::string>>& lead_files,
              const nlohmann::json& index_extra, const std::string& name = "");
  // --async-save: allocates (and faults in) the host snapshot for arrays of this size now, at
  // start-up, so the first save does not pay for it inside training. Nothing otherwise.
  void reserve(const OwnedArrays& owned);
  // Collective while a save is pending (every rank knows when): one small all-reduce that asks
  // whether every writer is done, then the commit. Call once per step.
  void poll();
  // Collective: waits for the pending write and commits it.
  void finish();
  // The newest committed checkpoint's directory (empty before the first).
  const std::string& last_committed() const { return last_; }
  bool pending() const { return pending_step_ >= 0; }
  // Bytes this rank wrote for the last committed checkpoint (its shard file).
  size_t last_bytes() const { return bytes_; }
  // Seconds the last committed write took on this rank (the writer's own time).
  double last_write_seconds() const { return write_seconds_; }
  // Called on every rank after a checkpoint was committed (named ones too): its step, its
  // directory and the seconds this rank's write took.
  std::function<void(int64_t step, const std::string& dir, double write_seconds)> on_commit;

 private:
  std::string dir_name(int64_t step, const std::string& name) const;
  std::string tmp_dir(const std::string& name) const;
  void commit();
  void join();

  Communicator& world_;
  std::string out_;
  bool async_;
  int64_t pending_step_ = -1;
  std::string pending_name_;  // the pending save's directory name under out_
  nlohmann::json pending_extra_;
  std::thread writer_;
  std::atomic<bool> done_{false};
  std::string error_;  // the writer's failure, read after join
  std::vector<std::vector<float>> snapshot_;
  std::string last_;
  size_t bytes_ = 0, written_bytes_ = 0;
  double write_seconds_ = 0.0, written_seconds_ = 0.0;
};

}  // namespace trellis
