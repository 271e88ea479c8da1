#include "trellis/train/checkpointing.h"

#include <fcntl.h>
#include <stdio.h>

#include <filesystem>

#include "trellis/comm/communicator.h"
#include "trellis/core/atomic_file.h"
#include "trellis/core/clock.h"
#include "trellis/core/error.h"
#include "trellis/io/checkpoint.h"

namespace fs = std::filesystem;

namespace trellis {

Checkpointer::Checkpointer(Communicator& world, std::string out_dir, bool async)
    : world_(world), out_(std::move(out_dir)), async_(async) {
  // Debris of saves a killed run left (never checkpoints: no index, temporary names) goes now,
  // once, so that a save needs no collective before its ranks write.
  if (world_.rank() == 0 && fs::is_directory(out_))
    for (const auto& e : fs::directory_iterator(out_)) {
      const std::string name = e.path().filename().string();
      if (e.is_directory() && (name.rfind(".step_", 0) == 0 || name.rfind(".best", 0) == 0) &&
          name.size() > 4 && name.substr(name.size() - 4) == ".tmp")
        fs::remove_all(e.path());
    }
  world_.barrier();
}

Checkpointer::~Checkpointer() { join(); }

std::string Checkpointer::dir_name(int64_t step, const std::string& name) const {
  return name.empty() ? checkpoint_dir_name(step) : name;
}

std::string Checkpointer::tmp_dir(const std::string& name) const {
  return (fs::path(out_) / ("." + name + ".tmp")).string();
}

namespace {

// Puts the complete directory `from` in place of `to`. An existing `to` is exchanged with it in
// one step (renameat2 RENAME_EXCHANGE) and then removed under from's name, so `to` is always a
// whole checkpoint; where the file system cannot exchange, the old one is moved aside first.
void replace_dir(const std::string& from, const std::string& to) {
  if (!fs::exists(to)) return fs::rename(from, to);
  if (::renameat2(AT_FDCWD, from.c_str(), AT_FDCWD, to.c_str(), RENAME_EXCHANGE) == 0) {
    fs::remove_all(from);
    return;
  }
  const std::string old = from + ".old.tmp";
  fs::remove_all(old);
  fs::rename(to, old);
  fs::rename(from, to);
  fs::remove_all(old);
}

}  // namespace

void Checkpointer::join() {
  if (writer_.joinable()) writer_.join();
}

double Checkpointer::save(int64_t step, const ParamLayout& layout, const OwnedArrays& owned,
                          const std::vector<std::pair<std::string, std::string>>& lead_files,
                          const nlohmann::json& index_extra, const std::string& name) {
  const auto t0 = Clock::now();
  finish();  // one save at a time: the previous one is committed first
  const std::string dir = tmp_dir(dir_name(step, name));
  pending_step_ = step;
  pending_name_ = name;
  pending_extra_ = index_extra;
  error_.clear();
  // Every rank creates the directory (whoever comes first), rank 0 adds the small files.
  const int rank = world_.rank();
  auto write = [this, dir, rank, &layout, files = lead_files](const OwnedArrays& arrays) {
    const auto w0 = Clock::now();
    try {
      fs::create_directories(dir);
      for (const auto& [name, text] : files)
        write_file_atomic((fs::path(dir) / name).string(), text);
      written_bytes_ = write_rank_shard(dir, rank, layout, arrays);
    } catch (const std::exception& e) {
      error_ = e.what();
    }
    written_seconds_ = seconds_since(w0);
  };
  if (!async_) {
    write(owned);
    commit();
    return seconds_since(t0);
  }
  // The host snapshot: the compact arrays copied, so training may update them at once.
  size_t n = 0;
  for (const FlatRange& r : owned.ranges) n += r.size();
  snapshot_.resize(owned.arrays.size());
  OwnedArrays copy;
  copy.ranges = owned.ranges;
  for (size_t k = 0; k < owned.arrays.size(); ++k) {
    snapshot_[k].assign(owned.arrays[k].second, owned.arrays[k].second + n);
    copy.arrays.emplace_back(owned.arrays[k].first, snapshot_[k].data());
  }
  done_ = false;
  writer_ = std::thread([this, write = std::move(write), copy = std::move(copy)] {
    // Until join(), only this thread touches error_, written_bytes_ and written_seconds_.
    write(copy);
    done_ = true;
  });
  return seconds_since(t0);
}

void Checkpointer::reserve(const OwnedArrays& owned) {
  if (!async_) return;
  size_t n = 0;
  for (const FlatRange& r : owned.ranges) n += r.size();
  snapshot_.resize(owned.arrays.size());
  for (auto& s : snapshot_) s.assign(n, 0.0f);
}

void Checkpointer::poll() {
  if (pending_step_ < 0) return;
  // Every rank takes part, so every rank decides alike.
  double not_done = done_ ? 0.0 : 1.0;
  world_.all_reduce_max(&not_done, 1);
  if (not_done == 0.0) commit();
}

void Checkpointer::finish() {
  if (pending_step_ < 0) return;
  commit();
}

void Checkpointer::commit() {
  // The snapshot stays allocated for the next save: its pages are faulted in once per run, not
  // once per save (a host copy of what this rank owns, as long as --async-save is on).
  join();
  bytes_ = written_bytes_;
  write_seconds_ = written_seconds_;
  const int64_t step = pending_step_;
  const std::string name = dir_name(step, pending_name_);
  const bool named = !pending_name_.empty();
  pending_step_ = -1;
  double failed = error_.empty() ? 0.0 : 1.0;
  world_.all_reduce_max(&failed, 1);
  TRELLIS_REQUIRE(error_.empty(), "checkpoint of step {}: {}", step, error_);
  TRELLIS_REQUIRE(failed == 0.0, "checkpoint of step {}: another rank's write failed", step);
  const std::string dir = tmp_dir(name);
  const std::string final_dir = (fs::path(out_) / name).string();
  std::string error;
  if (world_.rank() == 0) {
    try {
      write_checkpoint_index(dir, world_.size(), pending_extra_);
      // Replace an older copy of the same step (or name) only once the new one is complete.
      if (named) {
        replace_dir(dir, final_dir);
      } else {
        fs::remove_all(final_dir);
        fs::rename(dir, final_dir);
      }
    } catch (const std::exception& e) {
      error = e.what();
    }
  }
  double lead_failed = error.empty() ? 0.0 : 1.0;
  world_.all_reduce_max(&lead_failed, 1);
  TRELLIS_REQUIRE(error.empty(), "checkpoint of step {}: {}", step, error);
  TRELLIS_REQUIRE(lead_failed == 0.0, "checkpoint of step {}: rank 0 could not write the index",
                  step);
  if (!named) last_ = final_dir;
  if (on_commit) on_commit(step, final_dir, write_seconds_);
}

}  // namespace trellis
