// A Unigram (sentencepiece T5 / UMT5, Wan 2.1) caption tokenizer read from a Hugging Face
// tokenizer.json, giving the ids the Python runtime's edge/core/tokenizer.py gives (the Rust
// `tokenizers` library). The Swift mirror is
// runtimes/swift/Sources/EdgeCore/UnigramTokenizer.swift; tests/fixtures/swift/unigram/ holds
// both to Python's ids (tests/test_web_mirrors.py).
//
// The steps, in the order `tokenizers` runs them:
// 1. added tokens (`<pad>`, `</s>`, `<extra_id_0>`, ...) cut out of the raw text, the rest
//    normalized and cut again by the `normalized` added tokens;
// 2. the normalizer: Precompiled (sentencepiece's charsmap), Replace, Strip, in a Sequence;
// 3. the pre-tokenizer: Metaspace and WhitespaceSplit, alone or in a Sequence;
// 4. the Unigram model (vendored tokenizers.js: Viterbi lattice, adjacent unknowns fused),
//    then byte fallback;
// 5. truncation to max_tokens less what the post-processor adds, the post-processor
//    (TemplateProcessing), padding.
//
// The vendored tokenizers.js (vendor/tokenizers.mjs) gives the Unigram model (trie, Viterbi
// lattice, unknown pieces fused) and the Replace normalizer (with its translation of the
// converters' Oniguruma patterns). What it lacks or does differently from Rust is done here.
// Each of these changes ids of tests/fixtures/swift/unigram captions when left to the library:
// - its Precompiled ignores `precompiled_charsmap` (it approximates nmt_nfkc with NFKC and a
//   few replacements): PrecompiledCharsmap reads the charsmap (umt5_like, umt5_legacy);
// - its Unigram has no `byte_fallback` (umt5_legacy: CJK, emoji and accents as <0xNN>);
// - its WhitespaceSplit splits at JavaScript's \s (U+FEFF yes, U+0085 no) where Rust splits
//   at Unicode White_Space (umt5_like, wan_tiny);
// - its added-token splitter ignores `single_word` (wan_tiny_mixed's "[mask]").
// And these follow Rust too, though no fixture caption tells them apart: Metaspace's `split`
// and legacy `add_prefix_space` (ignored there), Strip and lstrip / rstrip with Rust's
// whitespace (JavaScript's trim there), the template's special token `ids` (names there).
// With its pieces replaced, its Tokenizer class no longer fits (it normalizes the added tokens
// with its own normalizer at construction), so the steps are put together here.
// Anything else in a file (another model, normalizer, pre-tokenizer or post-processor) is
// refused with an error naming the field, rather than approximated.
import { ReplaceNormalizer, Unigram } from "./vendor/tokenizers.mjs";

// Rust's char::is_whitespace (Unicode White_Space), which `tokenizers` splits and strips at
const RUST_SPACE = "\\t\\n\\v\\f\\r " +
                   "\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000";
const LEADING_SPACE = new RegExp(`^[${RUST_SPACE}]+`, "u");
const TRAILING_SPACE = new RegExp(`[${RUST_SPACE}]+$`, "u");
const SPACE_RUN = new RegExp(`[${RUST_SPACE}]+`, "u");
// the regex crate's Unicode \w, which single_word added tokens check their neighbours against
const WORD_CHAR = /[\p{Alphabetic}\p{M}\p{Nd}\p{Pc}\p{Join_Control}]/u;

function unsupported(path, type, supported) {
  return new Error(`tokenizer.json: ${path}.type ${type ?? "(none)"} ` +
                   `is not supported (supported: ${supported})`);
}

// ---- normalizers -------------------------------------------------------------------------

// sentencepiece's precompiled normalization rules: a darts-clone double-array trie from UTF-8
// keys to offsets into a block of NUL-terminated replacements. Applied as `tokenizers` does:
// per extended grapheme cluster, the whole cluster when it is under 6 UTF-8 bytes and some
// rule's key is a prefix of it (the shortest such rule's replacement stands for the whole
// cluster), otherwise character by character.
export class PrecompiledCharsmap {
  constructor(base64, path) {
    const bytes = Uint8Array.from(atob(base64), (c) => c.charCodeAt(0));
    const view = new DataView(bytes.buffer);
    const trieBytes = bytes.length >= 4 ? view.getUint32(0, true) : 0;
    if (trieBytes === 0 || trieBytes % 4 !== 0 || 4 + trieBytes > bytes.length) {
      throw new Error(`tokenizer.json: ${path}.precompiled_charsmap is not a charsmap`);
    }
    this.trie = new Uint32Array(trieBytes / 4);
    for (let i = 0; i < this.trie.length; i++) this.trie[i] = view.getUint32(4 + 4 * i, true);
    this.replacements = bytes.subarray(4 + trieBytes);
    this.encoder = new TextEncoder();
    this.decoder = new TextDecoder();
    this.graphemes = new Intl.Segmenter(undefined, { granularity: "grapheme" });
  }

  // darts-clone's unit fields (>>> keeps them unsigned)
  static hasLeaf(unit) { return ((unit >>> 8) & 1) === 1; }
  static value(unit) { return unit & 0x7fffffff; }
  static label(unit) { return (unit & 0x800000ff) >>> 0; }
  static offset(unit) { return (unit >>> 10) << ((unit & (1 << 9)) >>> 6); }

  // The replacement (a string) of the shortest rule whose key is a prefix of `bytes`, or null.
  transform(bytes) {
    const { trie } = this, P = PrecompiledCharsmap;
    let node = P.offset(trie[0]);
    for (const c of bytes) {
      if (c === 0) break;
      node ^= c;
      if (node < 0 || node >= trie.length) return null;
      const unit = trie[node];
      if (P.label(unit) !== c) return null;
      node ^= P.offset(unit);
      if (P.hasLeaf(unit)) {
        if (node < 0 || node >= trie.length) return null;
        const start = P.value(trie[node]);
        if (start >= this.replacements.length) return null;
        let end = start;
        while (end < this.replacements.length && this.replacements[end] !== 0) end++;
        return this.decoder.decode(this.replacements.subarray(start, end));
      }
    }
    return null;
  }

  normalize(text) {
    let out = "";
    for (const { segment } of this.graphemes.segment(text)) {
      const bytes = this.encoder.encode(segment);
      const whole = bytes.length < 6 ? this.transform(bytes) : null;
      if (whole !== null) {
        out += whole;
        continue;
      }
      for (const ch of segment) out += this.transform(this.encoder.encode(ch)) ?? ch;
    }
    return out;
  }
}

// Strip with Rust's whitespace (the vendored Strip uses JavaScript's trim)
function stripNormalizer(config) {
  const left = config.strip_left ?? true, right = config.strip_right ?? true;
  return (text) => {
    if (left) text = text.replace(LEADING_SPACE, "");
    if (right) text = text.replace(TRAILING_SPACE, "");
    return text;
  };
}

// The normalizer a tokenizer.json describes, as a function of a string; null for none.
export function makeNormalizer(config, path = "normalizer") {
  if (config === null || config === undefined) return null;
  switch (config.type) {
    case "Sequence": {
      const steps = (config.normalizers ?? []).map(
        (c, i) => makeNormalizer(c, `${path}.normalizers[${i}]`));
      return (text) => steps.reduce((t, step) => (step ? step(t) : t), text);
    }
    case "Precompiled": {
      const charsmap = new PrecompiledCharsmap(config.precompiled_charsmap ?? "", path);
      return (text) => charsmap.normalize(text);
    }
    case "Replace": {
      const replace = new ReplaceNormalizer(config);
      return (text) => replace.normalize(text);
    }
    case "Strip":
      return stripNormalizer(config);
    default:
      throw unsupported(path, config.type, "Precompiled, Replace, Strip, Sequence");
  }
}

// ---- pre-tokenizers ----------------------------------------------------------------------

// split at Rust whitespace, which is dropped
function whitespaceSplit(text) {
  return text.split(SPACE_RUN).filter((w) => w.length > 0);
}

// Spaces become `replacement`, which is prepended when missing (prepend_scheme "always", or
// the older add_prefix_space true); `split` (default true) cuts before every replacement
// character, each keeping the text after it (tokenizers' MergedWithNext).
function metaspace(config, path) {
  const replacement = config.replacement ?? "\u2581";
  if ([...replacement].length !== 1) {
    throw new Error(`tokenizer.json: ${path}.replacement must be one character`);
  }
  const scheme = config.prepend_scheme ?? (config.add_prefix_space === false ? "never" : "always");
  // "first" prepends only to the piece at the very start of the caption, which needs the
  // original offsets this runtime does not track: refused, as in the Swift runtime
  if (scheme !== "always" && scheme !== "never") {
    throw new Error(`tokenizer.json: ${path}.prepend_scheme ${scheme} ` +
                    "is not supported (supported: always, never)");
  }
  const split = config.split ?? true;
  return (text) => {
    let t = text.replaceAll(" ", replacement);
    if (scheme === "always" && !t.startsWith(replacement)) t = replacement + t;
    if (!split) return [t];
    const pieces = [];
    let start = 0;
    for (let i = t.indexOf(replacement, 1); i !== -1;
         i = t.indexOf(replacement, i + replacement.length)) {
      pieces.push(t.slice(start, i));
      start = i;
    }
    pieces.push(t.slice(start));
    return pieces.filter((p) => p.length > 0);
  };
}

// The pre-tokenizer steps a tokenizer.json describes: functions from a string to its pieces.
export function makePreTokenizers(config, path = "pre_tokenizer") {
  if (config === null || config === undefined) return [];
  switch (config.type) {
    case "Sequence":
      return (config.pretokenizers ?? []).flatMap(
        (c, i) => makePreTokenizers(c, `${path}.pretokenizers[${i}]`));
    case "WhitespaceSplit":
      return [whitespaceSplit];
    case "Metaspace":
      return [metaspace(config, path)];
    default:
      throw unsupported(path, config.type, "Metaspace, WhitespaceSplit, Sequence");
  }
}

// ---- added tokens ------------------------------------------------------------------------

// The added tokens found in a text the way `tokenizers`' AddedVocabulary finds them: the
// leftmost match, the longest there (aho-corasick, leftmost-longest), non-overlapping; a
// single_word match next to a word character is skipped (the search goes on after it);
// lstrip / rstrip take the whitespace before / after into the token.
class AddedTokenSplitter {
  // patterns: [{content, id, single_word, lstrip, rstrip}], earlier ones first on a tie
  constructor(patterns) {
    this.byFirst = new Map();
    for (const p of patterns.filter((q) => q.content.length > 0)) {
      const key = p.content[0];
      if (!this.byFirst.has(key)) this.byFirst.set(key, []);
      this.byFirst.get(key).push(p);
    }
  }

  nextMatch(text, from) {
    for (let start = from; start < text.length; start++) {
      let best = null;
      for (const p of this.byFirst.get(text[start]) ?? []) {
        if ((best === null || p.content.length > best.content.length)
            && text.startsWith(p.content, start)) best = p;
      }
      if (best !== null) return { start, pattern: best };
    }
    return null;
  }

  // -> [{text} | {id}], the text parts non-empty
  split(text) {
    const out = [];
    let offset = 0, from = 0, match;
    while (this.byFirst.size > 0 && (match = this.nextMatch(text, from)) !== null) {
      const p = match.pattern;
      let start = match.start, stop = match.start + p.content.length;
      from = stop;
      if (p.single_word) {
        const before = [...text.slice(0, start)].at(-1), after = text.slice(stop).codePointAt(0);
        const word = (ch) => ch !== undefined
          && WORD_CHAR.test(typeof ch === "number" ? String.fromCodePoint(ch) : ch);
        if (word(before) || word(after)) continue;
      }
      if (p.lstrip) {
        start = Math.max(start - (text.slice(0, start).match(TRAILING_SPACE)?.[0].length ?? 0),
                         offset);
      }
      if (p.rstrip) stop += text.slice(stop).match(LEADING_SPACE)?.[0].length ?? 0;
      if (offset < start) out.push({ text: text.slice(offset, start) });
      out.push({ id: p.id });
      offset = stop;
    }
    if (offset < text.length) out.push({ text: text.slice(offset) });
    return out;
  }
}

// ---- the model and the post-processor ----------------------------------------------------

// The `<0xNN>` pieces' ids by byte (undefined where the vocabulary lacks one), for byte_fallback
function byteFallbackIds(model) {
  return Array.from({ length: 256 }, (_, b) => model.tokens_to_ids.get(
    `<0x${b.toString(16).toUpperCase().padStart(2, "0")}>`));
}

// TemplateProcessing's single template as [{sequence: true} | {ids}], and how many ids it adds
function parseTemplate(config) {
  if (config === null || config === undefined) return { items: [{ sequence: true }], added: 0 };
  if (config.type !== "TemplateProcessing") {
    throw unsupported("post_processor", config.type, "TemplateProcessing");
  }
  let added = 0, sequences = 0;
  const items = (config.single ?? []).map((item, i) => {
    if (item.Sequence) {
      if (item.Sequence.id !== "A") {
        throw new Error(`tokenizer.json: post_processor.single[${i}]: ` +
                        "only sequence A in a single template");
      }
      sequences += 1;
      return { sequence: true };
    }
    const name = item.SpecialToken?.id;
    const ids = config.special_tokens?.[name]?.ids;
    if (!Array.isArray(ids)) {
      throw new Error(`tokenizer.json: post_processor.special_tokens has no ${name}`);
    }
    added += ids.length;
    return { ids };
  });
  if (sequences !== 1) throw new Error("tokenizer.json: post_processor.single must hold $A once");
  return { items, added };
}

export class UnigramCaptionTokenizer {
  constructor(json, maxTokens, padToken) {
    if (json.model?.type !== "Unigram") throw unsupported("model", json.model?.type, "Unigram");
    if (json.model.unk_id === null || json.model.unk_id === undefined) {
      throw new Error("tokenizer.json: model.unk_id null is not supported");
    }
    this.model = new Unigram(json.model);
    this.byteIds = json.model.byte_fallback ? byteFallbackIds(this.model) : null;
    this.normalize = makeNormalizer(json.normalizer);
    this.preTokenizers = makePreTokenizers(json.pre_tokenizer);
    // special tokens first, then the others, each in the file's order (AddedVocabulary)
    const added = json.added_tokens ?? [];
    const ordered = [...added.filter((t) => t.special), ...added.filter((t) => !t.special)];
    const isNormalized = (t) => t.normalized ?? !t.special;
    this.rawAdded = new AddedTokenSplitter(ordered.filter((t) => !isNormalized(t)));
    this.normalizedAdded = new AddedTokenSplitter(ordered.filter(isNormalized).map((t) => (
      { ...t, content: this.normalize ? this.normalize(t.content) : t.content })));
    ({ items: this.template, added: this.templateTokens } = parseTemplate(json.post_processor));
    if (maxTokens < Math.max(1, this.templateTokens)) {
      throw new Error(`tokenizer.json: max_tokens ${maxTokens} leaves no room: ` +
                      `the post_processor adds ${this.templateTokens} token(s)`);
    }
    this.maxTokens = maxTokens;
    // Tokenizer.token_to_id: the added vocabulary first, then the model's
    this.padId = added.findLast((t) => t.content === padToken)?.id
      ?? this.model.tokens_to_ids.get(padToken);
    if (this.padId === undefined) {
      throw new Error(`tokenizer.json: no pad token ${padToken} in the vocabulary`);
    }
  }

  // One pre-tokenized word through the model: its pieces (adjacent unknowns fused into one),
  // each as its id, else its bytes' <0xNN> ids (byte_fallback), else the unknown id.
  wordIds(word) {
    const model = this.model;
    return model([word]).flatMap((piece) => {
      const id = model.tokens_to_ids.get(piece);
      if (id !== undefined) return [id];
      if (this.byteIds) {
        // only when every byte has its piece; otherwise the whole piece is unknown
        const bytes = [...new TextEncoder().encode(piece)].map((b) => this.byteIds[b]);
        if (!bytes.includes(undefined)) return bytes;
      }
      return [model.unk_token_id];
    });
  }

  // The ids `tokenizers` gives `text` without special tokens, truncation or padding.
  tokenIds(text) {
    let parts = this.rawAdded.split(text).flatMap((part) => {
      if (part.text === undefined) return [part];
      const normalized = this.normalize ? this.normalize(part.text) : part.text;
      return this.normalizedAdded.split(normalized);
    });
    for (const step of this.preTokenizers) {
      parts = parts.flatMap((part) => (part.text === undefined ? [part]
        : step(part.text).map((t) => ({ text: t }))));
    }
    return parts.flatMap((part) => (part.text === undefined ? [part.id] : this.wordIds(part.text)));
  }

  // -> {ids: Int32Array, mask: Int32Array, truncated}: max_tokens each, the tokens cut to fit
  // with what the post-processor adds, then padded with the pad token
  encode(caption) {
    const all = this.tokenIds(caption);
    const room = this.maxTokens - this.templateTokens;
    const kept = all.slice(0, room);
    const ids = this.template.flatMap((item) => (item.sequence ? kept : item.ids));
    const outIds = new Int32Array(this.maxTokens).fill(this.padId);
    const mask = new Int32Array(this.maxTokens);
    ids.forEach((id, i) => { outIds[i] = id; mask[i] = 1; });
    return { ids: outIds, mask, truncated: all.length > room };
  }
}
