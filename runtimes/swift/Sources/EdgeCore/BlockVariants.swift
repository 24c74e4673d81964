/// Which of a block's programs a transformer call runs, as edge/core/manifest_schema.py decides it
/// (`unguided_variant`, `call_variant`, `block_variant`): the merged (TDTM) form or not, and
/// the caption's half of the guidance batch alone where the call is unguided and the package
/// has those programs (`unguided`, `tdtm_unguided`).
public enum BlockVariants {
    public static let unguided = "unguided"
    public static let merged = "tdtm"

    /// The caption-half form of `variant` (nil: the block's own).
    public static func unguidedVariant(_ variant: String?) -> String {
        variant.map { "\($0)_\(unguided)" } ?? unguided
    }

    /// The variant a call runs: merged or not, the caption's half `alone` or the pair.
    public static func callVariant(merged: Bool, alone: Bool) -> String? {
        let variant: String? = merged ? Self.merged : nil
        return alone ? unguidedVariant(variant) : variant
    }

    /// The variant one block runs for a call's `variant`, given the variants it has: merging
    /// where the block merges (`tdtm` falls back to the block's own program, a prologue's),
    /// the caption's half on every block (`tdtm_unguided` falls back to `unguided` where the
    /// block does not merge); any other missing variant is an error, never run as the
    /// block's own program in its place.
    public static func blockVariant(_ present: Set<String>, _ variant: String?) throws -> String? {
        guard let variant, !present.contains(variant) else { return variant }
        if variant == merged { return nil }
        if variant == unguidedVariant(merged) && present.contains(unguided)
            && !present.contains(merged) {
            return unguided
        }
        let has = present.sorted().joined(separator: ", ")
        throw ManifestError.invalid("the block has no variant \(variant) " +
                                    "(it has: \(has.isEmpty ? "none" : has))")
    }

    /// Whether every block has what the unguided calls of these settings run (`unguided`,
    /// and `tdtm_unguided` where calls merge and the block merges): then an unguided call
    /// runs the caption's half alone, else the pair with its null half dropped.
    public static func runsAlone(_ blocks: [Manifest.Block], mergeSteps: Int) -> Bool {
        let calls = [callVariant(merged: false, alone: true)]
            + (mergeSteps > 0 ? [callVariant(merged: true, alone: true)] : [])
        for block in blocks {
            let present = Set((block.variants ?? [:]).keys)
            for call in calls {
                do { _ = try blockVariant(present, call) } catch { return false }
            }
        }
        return true
    }
}
