"""Input data: sources of sentence pairs, the shared vocabulary, token-budget batching."""
