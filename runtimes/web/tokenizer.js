// Caption tokenisation with Hugging Face's tokenizers.js (@huggingface/tokenizers, vendored in
// vendor/ so a package works offline): it reads the package's `tokenizer.json`, the same file
// the Python runtime gives the Rust `tokenizers`. Captions are padded and truncated to
// max_tokens as edge/tokenizer.py does: truncation keeps the first max_tokens - 1 tokens and
// the closing [SEP].
import { Tokenizer } from "./vendor/tokenizers.mjs";

export class CaptionTokenizer {
  constructor(tokenizerJson, maxTokens) {
    this.tokenizer = new Tokenizer(tokenizerJson, {});
    this.maxTokens = maxTokens;
  }

  // -> {ids: Int32Array, mask: Int32Array, truncated: boolean}
  encode(caption) {
    let ids = this.tokenizer.encode(caption).ids;
    const truncated = ids.length > this.maxTokens;
    if (truncated) ids = [...ids.slice(0, this.maxTokens - 1), ids[ids.length - 1]];
    const out = new Int32Array(this.maxTokens);
    const mask = new Int32Array(this.maxTokens);
    ids.forEach((id, i) => { out[i] = id; mask[i] = 1; });
    return { ids: out, mask, truncated };
  }
}
