"""Input data: sources of sentence pairs, the shared vocabulary, the token cache (tokenized once),
and the loader (batches planned over length arrays, gathered by Grain)."""
