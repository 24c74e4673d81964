// Caption tokenisation from the package's `tokenizer.json` (the file the Python runtime gives
// the Rust `tokenizers`), as edge/core/tokenizer.py and runtimes/python/pipeline.py do it,
// driven by the manifest's `tokenizer` object: `max_tokens`, `pad_token` (absent: "[PAD]") and
// `clean` (absent: "none"; "wan" for Wan 2.1 packages, prompt_clean.js).
//
// - WordPiece (tiny-sora's MiniLM): Hugging Face's tokenizers.js (vendored in vendor/ so a
//   package works offline), padded and truncated to max_tokens BERT-style: truncation keeps
//   the first max_tokens - 1 tokens and the closing [SEP].
// - Unigram (T5 / UMT5, Wan 2.1): unigram.js, which uses the vendored library's model and
//   does by hand what that library does differently from Rust's.
import { cleanPrompt, checkCleaner } from "./prompt_clean.js";
import { UnigramCaptionTokenizer } from "./unigram.js";
import { Tokenizer } from "./vendor/tokenizers.mjs";

// tiny-sora's path, unchanged
class WordPieceCaptionTokenizer {
  constructor(tokenizerJson, maxTokens) {
    this.tokenizer = new Tokenizer(tokenizerJson, {});
    this.maxTokens = maxTokens;
  }

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

// Ids the tokenizer can give: its model's vocabulary and added tokens, largest id + 1
export function vocabularySize(tokenizerJson) {
  const vocab = tokenizerJson.model?.vocab ?? [];
  let size = Array.isArray(vocab) ? vocab.length : Math.max(-1, ...Object.values(vocab)) + 1;
  for (const t of tokenizerJson.added_tokens ?? []) size = Math.max(size, t.id + 1);
  return size;
}

// Every id must index the text encoder's embedding table (the manifest's embedding_rows,
// absent in older packages): a larger vocabulary would fail inside the text encoder's Gather
// on the first prompt using a token past it. As runtimes/python/package_checks.py checks.
function checkVocabulary(tokenizerJson, rows) {
  if (rows === undefined) return;
  const size = vocabularySize(tokenizerJson);
  if (size > rows) {
    throw new Error(`tokenizer.json: a vocabulary of ${size} tokens, but the text encoder's `
      + `embedding table has ${rows} rows (manifest.json tokenizer embedding_rows): ids past it `
      + "index nothing");
  }
}

export class CaptionTokenizer {
  // options: {padToken, clean} as the manifest's tokenizer.pad_token and tokenizer.clean
  constructor(tokenizerJson, maxTokens, { padToken = "[PAD]", clean = "none" } = {}) {
    this.clean = checkCleaner(clean);
    this.maxTokens = maxTokens;
    this.engine = tokenizerJson.model?.type === "Unigram"
      ? new UnigramCaptionTokenizer(tokenizerJson, maxTokens, padToken)
      : new WordPieceCaptionTokenizer(tokenizerJson, maxTokens);
  }

  // From the manifest's `tokenizer` object and the parsed tokenizer.json it lists.
  static fromManifest(tokenizerJson, manifestTokenizer) {
    checkVocabulary(tokenizerJson, manifestTokenizer.embedding_rows);
    return new CaptionTokenizer(tokenizerJson, manifestTokenizer.max_tokens, {
      padToken: manifestTokenizer.pad_token ?? "[PAD]",
      clean: manifestTokenizer.clean ?? "none",
    });
  }

  // The caption as the package's cleaner leaves it (what is tokenized).
  cleaned(caption) {
    return cleanPrompt(caption, this.clean);
  }

  // -> {ids: Int32Array, mask: Int32Array, truncated: boolean}, max_tokens each
  encode(caption) {
    return this.engine.encode(this.cleaned(caption));
  }
}
