"""Export planning for a memory budget: splitting pairs, merging small neighbours, refusals."""

import pytest
import torch
from typer.testing import CliRunner

from edge.commands import app
from edge.core.budget import BudgetError
from edge.families.tiny_sora.family import cut_text_encoder, cut_transformer
from edge.planning.partition import merge, split
from edge.planning.plan import block_bytes, partition, plan_residency

runner = CliRunner()


def chain(blocks, feeds, variant=None):
    """Run blocks as the runtime does: inputs by name, outputs passed on by name."""
    feeds = dict(feeds)
    for b in blocks:
        module = b.variants[variant] if variant else b.module
        with torch.no_grad():
            out = module(*(feeds[n] for n in b.inputs))
        feeds |= dict(zip(b.outputs, out if isinstance(out, tuple) else (out,), strict=True))
    return feeds


@pytest.fixture(scope="module")
def tiny(pipeline):
    """tiny-sora's text encoder and transformer blocks, cut once (tests do not change them)."""
    return {"text_encoder": cut_text_encoder(pipeline), "transformer": cut_transformer(pipeline)}


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """A scaled tiny-sora whose pairs (~3 MiB) are large beside a few-MiB budget."""
    from edge.families.tiny_sora.scale import write_scaled_model
    from edge.models.tiny_sora import TinySora

    root = tmp_path_factory.mktemp("plan") / "wide"
    write_scaled_model(root, 256, 2, 4, 0)
    return {"transformer": cut_transformer(TinySora.load(root))}


def test_merged_layers_compute_what_the_layers_compute(tiny):
    blocks = tiny["text_encoder"]
    merged = merge(blocks[1:4], needed_after={"hidden", "attention_bias"})
    assert merged.name == "layer_0-2" and merged.inputs == ["hidden", "attention_bias"]
    # attention_bias is still needed by later layers, so the merged block passes it on
    assert merged.outputs == ["hidden"] and "attention_bias" in merged.inputs
    feeds = dict(zip(blocks[0].inputs, blocks[0].example, strict=True))
    want = chain(blocks, feeds)["hidden"]
    got = chain([blocks[0], merged, *blocks[4:]], feeds)["hidden"]
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert list(merged.parameters())[0].startswith("parts.layer_0.")
    assert block_bytes(merged) >= sum(block_bytes(b) for b in blocks[1:4]) - 3 * 4096


def test_merge_keeps_an_earlier_output_a_later_block_needs(tiny):
    blocks = tiny["text_encoder"]
    merged = merge(blocks[:2], needed_after={"hidden", "attention_bias"})
    assert merged.inputs == ["input_ids", "attention_mask"]
    assert merged.outputs == ["hidden", "attention_bias"]
    feeds = dict(zip(blocks[0].inputs, blocks[0].example, strict=True))
    got = chain([merged, *blocks[2:]], feeds)["hidden"]
    torch.testing.assert_close(got, chain(blocks, feeds)["hidden"], rtol=0, atol=0)


def test_split_pair_halves_compute_the_pair_and_its_tdtm_variant(tiny):
    blocks = tiny["transformer"]
    pair = blocks[1]
    halves = split(pair)
    assert [h.name for h in halves] == ["pair_0_spatial", "pair_0_temporal"]
    assert all(list(h.variants) == ["tdtm"] for h in halves)
    # each half keeps the pair's parameter names, and together they hold all of them
    names = [n for h in halves for n in h.parameters()]
    assert names == list(pair.parameters())
    feeds = dict(zip(pair.inputs, pair.example, strict=True))
    torch.testing.assert_close(chain(halves, feeds)["x"], chain([pair], feeds)["x"],
                               rtol=0, atol=0)
    torch.testing.assert_close(chain(halves, feeds, "tdtm")["x"],
                               chain([pair], feeds, "tdtm")["x"], rtol=0, atol=0)


def test_only_pairs_split(tiny):
    with pytest.raises(ValueError, match="transformer/prologue cannot be split"):
        split(tiny["transformer"][0])


def test_no_budget_changes_nothing(tiny):
    cut = partition(tiny, None)
    assert cut.components == tiny and not cut.members and not cut.notes


def test_a_block_that_cannot_split_is_refused_with_the_smallest_budget(tiny):
    with pytest.raises(BudgetError, match=r"text_encoder/embeddings .*smallest budget that "
                                          r"works is 45.5 MiB"):
        partition(tiny, 10 << 20)


def test_a_budget_below_two_pairs_splits_them(wide):
    blocks = wide
    pair = block_bytes(blocks["transformer"][1])
    budget = pair * 3 // 2  # room for one pair, not for a pair and the next
    cut = partition(blocks, budget)
    names = [b.name for b in cut.components["transformer"]]
    assert names[:3] == ["prologue", "pair_0_spatial", "pair_0_temporal"]
    assert cut.members["transformer/pair_1_temporal"] == ["pair_1"]
    assert any("split into pair_0_spatial and pair_0_temporal" in n for n in cut.notes)
    plan = plan_residency(cut.components, budget)
    assert plan["working_set_bytes"] <= budget
    assert plan["largest_bytes"] <= budget // 2


def test_pairs_split_where_halves_pin_more(wide):
    """At 2.2 pairs, whole pairs leave only the prologue pinned (two pairs must stay free to
    stream); halves need half that room, so one pair's halves stay resident too."""
    blocks = wide
    pair = block_bytes(blocks["transformer"][1])
    budget = pair * 22 // 10
    whole = plan_residency(blocks, budget)
    cut = partition(blocks, budget)
    halved = plan_residency(cut.components, budget)
    assert "transformer/pair_0_spatial" in cut.members
    assert any("halves pin more" in n for n in cut.notes)
    assert halved["resident_bytes"] > whole["resident_bytes"]
    assert halved["working_set_bytes"] <= budget


def test_a_budget_roomy_for_pairs_keeps_them_whole(wide):
    blocks = wide
    pair = block_bytes(blocks["transformer"][1])
    cut = partition(blocks, 3 * pair)
    assert "pair_0" in [b.name for b in cut.components["transformer"]]


def test_a_budget_below_a_half_pair_is_refused_with_the_smallest_that_works(wide):
    blocks = wide
    halves = split(blocks["transformer"][1])
    smallest = max(block_bytes(h) for h in halves)
    with pytest.raises(BudgetError, match=rf"pair_\d_\w+ .*smallest budget that works is "
                                          rf".*\({smallest} bytes\)"):
        partition(blocks, smallest - 4096)
    partition(blocks, smallest)  # and that one is accepted


def test_merging_streamed_neighbours_keeps_pins_and_working_set(tiny):
    blocks = tiny
    budget = 50 << 20   # the 45.5 MiB embedding table streams; small blocks merge
    before = plan_residency(blocks, budget)
    cut = partition(blocks, budget)
    after = plan_residency(cut.components, budget)
    # merged up to the second largest streamed block (a 6.8 MiB layer): three 2 MiB pairs
    assert cut.members["transformer/pair_0-2"] == ["pair_0", "pair_1", "pair_2"]
    assert after["working_set_bytes"] <= before["working_set_bytes"]
    assert after["resident_bytes"] >= before["resident_bytes"]
    streamed = [r["bytes"] for r in after["blocks"] if not r["resident"]]
    assert len(streamed) < len([r for r in before["blocks"] if not r["resident"]])


def test_dry_run_explains_the_cut_and_the_plan():
    res = runner.invoke(app, ["export", "--dry-run", "--memory-budget", "50MB"])
    assert res.exit_code == 0, res.output
    assert "transformer/pair_0-2 = pair_0, pair_1, pair_2" in res.output
    assert "<- pair_0, pair_1, pair_2" in res.output and "working set" in res.output
    # 45.5 + 6.8 MiB do not fit 50 MB: said, since reads then wait instead of overlapping
    assert "cannot be read while text_encoder/embeddings computes" in res.output
