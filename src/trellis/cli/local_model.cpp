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
}

}  // namespace trellis
