#include "trellis/cli/local_model.h"

#include "trellis/data/subword.h"

namespace trellis {

LocalModel::LocalModel(CheckpointData& ck, float* grads, DType compute,
                       const std::string& tokenizer_dir)
    : layout(ck.model),
      model(layout, ck.params.data(), grads, single, nullptr, compute),
      subword(subword_ngrams_for(ck.model, ck.tokenizer.kind,
                                 tokenizer_dir.empty() ? ck.tokenizer.dir : tokenizer_dir)) {
  model.set_subword_ngrams(subword.get());
  // The checkpoint's weights never change once loaded: round a bf16 model's copies once, not
  // again at every pass (each batch of `eval`, each token of a decode).
  if (compute == DType::BF16) model.set_weight_copies(ModelChunk::WeightCopyPolicy::UntilChanged);
}

}  // namespace trellis
