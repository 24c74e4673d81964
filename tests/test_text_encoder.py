import numpy as np
import torch

from edge.models.text_encoder import MAX_TOKENS, TextEncoder, load_tokenizer, minilm_dir, tokenize


def test_tokenizer_pads_and_truncates():
    tok = load_tokenizer()
    ids, mask = tokenize(tok, ["a red circle moving left", "word " * 40])
    assert ids.shape == mask.shape == (2, MAX_TOKENS)
    assert mask[0].sum() == 7 and mask[1].sum() == MAX_TOKENS  # [CLS] 5 words [SEP]
    assert ids[0, 0] == tok.token_to_id("[CLS]") and ids[0, 6] == tok.token_to_id("[SEP]")


def test_matches_the_sentence_transformers_model_offline():
    # all-MiniLM-L6-v2's sentence embedding is the normalized masked mean of the hidden
    # states we use (its modules: Transformer -> Pooling(mean) -> Normalize)
    from sentence_transformers import SentenceTransformer

    captions = ["a red circle moving left", "the blue box slides up"]
    tokens, mask = TextEncoder()(captions)
    pooled = (tokens * mask[..., None]).sum(1) / mask.sum(1, keepdim=True)
    pooled = torch.nn.functional.normalize(pooled, dim=-1)
    reference = SentenceTransformer(str(minilm_dir()), device="cpu").encode(
        captions, convert_to_numpy=True)
    np.testing.assert_allclose(pooled.numpy(), reference, atol=1e-4)


def test_captions_that_differ_in_direction_differ_in_tokens():
    tokens, _ = TextEncoder()(["a red circle moving left", "a red circle moving right"])
    assert torch.cosine_similarity(tokens[0, 5], tokens[1, 5], dim=0) < 0.95
