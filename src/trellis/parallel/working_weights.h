#pragma once
// The weights of a mixed-precision (bf16) run under ZeRO-1/2/3: each rank keeps the fp32 master
// weights of its shard only, compact beside the optimizer's moments (the strategy's
// owned_params); every rank holds the bf16 working weights the GEMMs read, one buffer laid out as
// the fp32 one; and the fp32 values only of the tensors the kernels read in fp32 (norms, biases,
// embeddings unless bf16_embeddings: model/fp32_read_ranges) in the fp32 buffer, whose other
// pages are returned. After
// the update a region's working weights are rounded from the masters of each shard and
// all-gathered as bf16 bits (half the bytes of an fp32 gather), and its fp32-read elements
// gathered in fp32: a large fp32-read tensor's part in the ranks' chunks straight into its place
// (an all-gather of uneven blocks: the chunks are consecutive, so its pieces are too), the rest
// (norms, biases, the rest elements) packed, so that nothing the size of an embedding is staged.
// ZeRO-0 keeps whole fp32 replicas and the model's own bf16 copies (model/modules.h WeightCopies)
// instead.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "trellis/comm/communicator.h"
#include "trellis/core/memory.h"
#include "trellis/model/params.h"

namespace trellis {

class WorkingWeights {
 public:
  // How a region of the buffer is split over the ranks: rank r holds the chunk
  // [begin + r * chunk, begin + (r + 1) * chunk) and, when r < rest, the element
  // begin + chunk * dp + r (ZeRO-1: the whole padded buffer, rest 0; ZeRO-2/3: each unit).
  struct Region {
    size_t begin = 0, chunk = 0, rest = 0;
  };
  // padded: the fp32 buffer's floats; fp32: the ranges kept in fp32 (fp32_read_ranges).
  WorkingWeights(Communicator& dp, size_t padded, std::vector<FlatRange> fp32,
                 std::vector<Region> regions);

  // fp32-read elements of a region's chunks that are gathered in place rather than packed.
  static constexpr size_t kDirect = 4096;

  uint16_t* bits() { return reinterpret_cast<uint16_t*>(bits_.data()); }
  const std::vector<FlatRange>& fp32_ranges() const { return fp32_; }

  // A region's gather in flight.
  struct Gather {
    size_t region = 0;
    std::unique_ptr<Work> main, tail, f32;
    std::vector<std::unique_ptr<Work>> direct;
    std::vector<uint16_t> rest_in, rest_out;
    std::vector<float> f32_in, f32_out;
  };
  // Starts region i's gather from this rank's fp32 masters of it, `owned` (its chunk, then its
  // rest element; compact), committing the pages it will write: the region's bits and, in
  // params, the pages of its fp32-read ranges.
  std::unique_ptr<Gather> start(size_t i, const float* owned, PageBuffer& params);
  // Waits for it and places what came in (the rest elements' bits, the fp32-read values).
  void finish(Gather& g, float* params);
  // Region i's bits rounded from a whole fp32 buffer (initialisation: every rank holds the same
  // values, so they are the bits a gather would bring).
  void round_whole(size_t i, const float* params);
  // Returns region i's pages: its bits' and, in params, its own (ZeRO-3 after a block ran).
  void release(size_t i, PageBuffer& params);
  // Returns the pages of params that hold no fp32-read element.
  void release_multiplied(PageBuffer& params) const;
  int64_t resident_bytes() const { return bits_.committed_bytes(); }

  // For the memory model: bytes of the pages of an fp32 buffer that touch the fp32 ranges inside
  // [begin, end), and of the bf16 bits of the elements [begin, end) (with a page of slack at each
  // end where the range starts or ends inside one, as a region's pages do).
  static int64_t fp32_page_bytes(const std::vector<FlatRange>& fp32, size_t begin, size_t end);
  static int64_t bits_bytes(size_t begin, size_t end, bool slack);
  // Floats one gather of the region holds in flight for its fp32-read elements (the largest
  // rank's packed input, and the packed output of all).
  static int64_t gather_floats(const std::vector<FlatRange>& fp32, const Region& r, int dp);

 private:
  // The fp32-read ranges (layout offsets) among the elements rank `rank` holds of region r.
  static std::vector<FlatRange> fp32_of(const std::vector<FlatRange>& fp32, const Region& r, int dp,
                                        int rank);
  // Region r's fp32-read ranges split: the parts inside its chunks of at least kDirect elements,
  // gathered in place, and the rest, gathered packed.
  static void split(const std::vector<FlatRange>& fp32, const Region& r, int dp,
                    std::vector<FlatRange>& direct, std::vector<FlatRange>& packed);

  Communicator& dp_;
  const int dp_size_, dp_rank_;
  std::vector<FlatRange> fp32_;
  std::vector<Region> regions_;
  struct Direct {
    FlatRange range;
    std::vector<size_t> counts;  // per rank: its elements
  };
  std::vector<std::vector<Direct>> direct_;     // per region
  std::vector<std::vector<FlatRange>> packed_;  // per region: the packed fp32-read ranges
  std::vector<std::vector<size_t>> counts_;     // per region and rank: packed elements held
  PageBuffer bits_;                 // ceil(padded / 2) floats = padded bf16 elements
};

}  // namespace trellis
