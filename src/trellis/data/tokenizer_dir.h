#pragma once
// Where a data directory's meta.json finds its tokenizer (`tokenizer_dir`: GPT-2's encoder.json
// and vocab.bpe). Written relative to the data directory when the tokenizer lies inside it or
// beside it, so the two can be moved or copied together; absolute otherwise.
#include <string>

namespace trellis {

// What meta.json records for a tokenizer directory (as given to prepare) and the data directory
// it describes: relative ("../gpt2", "gpt2") when at most one level up from data_dir, else
// absolute. Empty stays empty.
std::string recorded_tokenizer_dir(const std::string& tokenizer_dir, const std::string& data_dir);

// The directory a recorded tokenizer_dir names: a relative one taken relative to the data
// directory (the only base that does not depend on where trellis is started), an absolute one
// (what earlier versions wrote) as it is. Empty stays empty.
std::string resolved_tokenizer_dir(const std::string& recorded, const std::string& data_dir);

}  // namespace trellis
